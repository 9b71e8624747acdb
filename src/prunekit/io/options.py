"""The arguments of the state_dict entry points (prune_state_dict, prune_file,
prune_sharded) as one whole.Config: given whole as ``config=``, or as the keywords every
whole-model entry point shares, checked into one.

The amount comes first, the method by keyword, as in prune_model:
``prune_state_dict(state, 0.5, method='l1')``. The old order, the method first
(``prune_state_dict(state, 'l1', 0.5)``), still works, with a FutureWarning.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import cast

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # typing_extensions: a dependency of torch
    from typing_extensions import Unpack

from prunekit.core.errors import type_error, value_error, warn_caller
from prunekit.whole.config import Config
from prunekit.whole.registry import (
    CALIBRATED,
    METHODS,
    OFFLINE,
    Method,
    check_calibration_options,
)
from prunekit.whole.targets import ALL, TargetOptions, globs
from prunekit.whole.vocabulary import scope_from

__all__ = ["Options", "Unpack", "config_of", "offline_method"]


class Options(TargetOptions, total=False):
    """The keywords that make a state_dict entry point's Config (see whole.Config).

    Attributes:
        method: 'l1', 'random' or 'ln' (whole.registry.OFFLINE); default 'l1'.
        amount: a fraction in [0, 1] or a count (entries; channels for 'ln').
        n: 'ln' only: the norm order (default 2).
        dim: 'ln' only: the axis of the channels (default 0).
        scope: 'layer' (default) or 'global'.
        include: globs of the tensors to prune (default ``('*',)``).
        exclude: globs of the tensors to leave out.
        global_pruning: the old name of ``scope='global'`` (a FutureWarning).
    """

    method: str
    amount: float
    n: float | str | None
    dim: int | None
    global_pruning: bool | None


def config_of(
    owner: str, args: tuple[str | float, ...], config: Config | None, options: Options
) -> Config:
    """The Config of a call of `owner`: `config` itself, or the one `args` (the amount, or
    the old method and amount) and `options` make.

    Args:
        owner: the entry point, which the errors and warnings name.
        args: the call's positional arguments after the state (or the paths).
        config: a whole.Config given as ``config=`` (None: made from the rest).
        options: the call's keywords of Options.

    Returns:
        The checked Config, its `owner` set.

    Raises:
        TypeError: `config` with other arguments, or not a Config; too many positional
            arguments, or no amount.
        ValueError: a method a state_dict cannot be pruned with, or a bad argument (see
            whole.Config).
    """
    unknown = [key for key in options if key not in Options.__annotations__]
    if unknown:
        raise type_error(
            f"{owner}: unexpected keyword {unknown[0]}=; expected one of "
            f"{', '.join(Options.__annotations__)}, config=, keep_masks=, seed="
        )
    if config is not None:
        if args or options:
            given = ", ".join([*(repr(a) for a in args), *(f"{k}=" for k in options)])
            raise type_error(
                f"{owner}: config= is given with {given}; expected config= alone (its fields "
                "say everything) or the arguments alone"
            )
        if not isinstance(config, Config):
            raise type_error(
                f"{owner}: invalid config of type {type(config).__name__}; expected a "
                "prunekit.whole.Config"
            )
        # what the method would ignore is refused here, where the Config is used (made, it
        # may still become another method's through dataclasses.replace)
        check_calibration_options(config.method, config.sequential, config.progress, owner)
        return config if config.owner == owner else replace(config, owner=owner)
    method, amount = _method_and_amount(owner, args, options)
    name = offline_method(method, owner).name
    scope = scope_from(owner, options.get("scope", "layer"), options.get("global_pruning"),
                       given="scope" in options)  # fmt: skip
    return Config(
        method=name,
        amount=amount,
        scope=scope,
        include=globs(options.get("include", ALL), "include", owner),
        exclude=globs(options.get("exclude", ()), "exclude", owner),
        n=options.get("n"),
        dim=options.get("dim"),
        owner=owner,
    )


def offline_method(method: object, owner: str) -> Method:
    """The registry's entry of `method` if it prunes a tensor from its values alone (one of
    whole.registry.OFFLINE: all a state_dict can take).

    Raises:
        ValueError: naming `owner`, the method and the methods allowed; for a calibrated
            method, where it can prune.
    """
    if isinstance(method, str) and method in OFFLINE:
        return METHODS[method]
    where = ""
    if isinstance(method, str) and method in CALIBRATED:
        where = f" (method {method!r} learns from batches run through the model: prune_model)"
    raise value_error(
        f"{owner}: invalid method={method!r}; expected one of {', '.join(OFFLINE)}, which "
        f"prune tensors from their values alone{where}"
    )


def _method_and_amount(
    owner: str, args: tuple[str | float, ...], options: Options
) -> tuple[object, float]:
    """The method and amount of a call: ``(amount,)`` or, the old order, ``(method,
    amount)`` and ``(method,)`` with ``amount=`` (a FutureWarning)."""
    method: object = options.get("method", "l1")
    amount: object = options.get("amount")
    old = bool(args) and isinstance(args[0], str)
    if len(args) > 2 or (len(args) == 2 and not old):
        raise type_error(
            f"{owner}: takes the amount as its one positional argument after the input, "
            f"got {len(args)} ({', '.join(map(repr, args))}); expected e.g. "
            f"{owner}(..., 0.5, method='l1')"
        )
    if old:
        if "method" in options:
            raise type_error(f"{owner}: got the method twice ({args[0]!r} and method=)")
        method, args = args[0], args[1:]
        shown = args[0] if args else amount
        warn_caller(
            f"{owner}: the method as a positional argument is deprecated; write "
            f"{owner}(..., {shown!r}, method={method!r}), as prune_model takes it. The old "
            "order will be removed in a future version.",
            FutureWarning,
        )
    if args:
        if "amount" in options:
            raise type_error(f"{owner}: got the amount twice ({args[0]!r} and amount=)")
        amount = args[0]
    if amount is None:
        raise type_error(f"{owner}: missing the amount; expected e.g. {owner}(..., 0.5)")
    return method, cast(float, amount)  # Config checks the amount
