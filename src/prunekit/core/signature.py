"""What a module's forward takes, as its signature says: one reading for every caller that adds
an argument to a forward, refuses one it cannot take, or names the forward's inputs.

The signature read is the one ``inspect.signature`` gives ``module.forward``: a forward
wrapped with ``functools.wraps`` (a decorator, or accelerate's hooks, which put a partial in
place of ``forward``) shows the forward it wraps. Where no signature can be read, or the
forward takes ``**kwargs``, whether it reads a keyword is not known: ``takes_keyword`` says so
(None), and each caller decides what not knowing means for it.
"""

from __future__ import annotations

import inspect

from torch import nn

__all__ = ["forward_parameters", "positional_names", "takes_keyword"]


def forward_parameters(module: nn.Module) -> list[inspect.Parameter] | None:
    """The parameters of `module`'s forward, in order (``self`` left out).

    Args:
        module: the module whose ``forward`` is read (an instance attribute, where a hook
            replaced it, is the one read).

    Returns:
        The parameters, or None where no signature can be read (a builtin, a callable
        ``inspect`` cannot read).
    """
    try:
        return list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None


def takes_keyword(module: nn.Module, name: str) -> bool | None:
    """Whether `module`'s forward takes the keyword argument `name`.

    Args:
        module: the module whose ``forward`` is read.
        name: the keyword, e.g. ``'use_cache'``.

    Returns:
        True where the forward names `name` as a parameter that can be given by keyword;
        None where it may take it unnamed (``**kwargs``) or its signature cannot be read;
        False where it cannot take it (a positional-only parameter of that name cannot be
        given by keyword).
    """
    parameters = forward_parameters(module)
    if parameters is None:
        return None
    for parameter in parameters:
        if parameter.name == name and parameter.kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return False


def positional_names(module: nn.Module) -> list[str] | None:
    """The names of the parameters that the positional arguments of ``module(*args)``
    fill, in order: the forward's parameters up to its ``*args`` (or its first
    keyword-only one).

    Args:
        module: the module whose ``forward`` is read.

    Returns:
        The names (as many as the forward takes by place), or None where no signature can
        be read.
    """
    parameters = forward_parameters(module)
    if parameters is None:
        return None
    found = []
    for parameter in parameters:
        if parameter.kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            break
        found.append(parameter.name)
    return found
