"""Masked states that a module computes through a forward hook and no state_dict holds.

Skipped blocks, masked experts and a masked hidden width act through hooks of prunekit's;
a file of tensors alone would reload such a model computing something else. The module that
installs each hook registers here what it is, how to tell a module holds one and which call
leaves plain weights; every call that writes a model's tensors for it to be rebuilt
without those hooks (``save_pruned``, ``permanent_state_dict``, ``save_compacted``,
``export`` to ``hf``, ``deci`` and ``gguf``) refuses a model that holds any, before
writing. A hook can only be installed by code that was imported, and that import
registered it.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from prunekit.core.errors import value_error

__all__ = ["refuse_unsaved", "register_unsaved"]

# (what the modules are, the test for one, the call that leaves plain weights)
_KINDS: list[tuple[str, Callable[[nn.Module], bool], str]] = []


def register_unsaved(what: str, holds: Callable[[nn.Module], bool], remedy: str) -> None:
    """Declare a masked state a forward hook computes and no file holds.

    Args:
        what: the modules that hold it, singular (``'the skipped block'``).
        holds: whether a module holds it now.
        remedy: the call that leaves the model with plain weights
            (``'prunekit.remove_blocks(model)'``).
    """
    if all(holds is not known for _, known, _ in _KINDS):
        _KINDS.append((what, holds, remedy))


def refuse_unsaved(model: nn.Module, owner: str) -> None:
    """Raise if a module of `model` holds a masked state no file can hold.

    Args:
        model: the model about to be written.
        owner: the public call, named first in the message.

    Raises:
        ValueError: naming up to three modules of each kind and the calls to make first.
    """
    found: list[str] = []
    remedies: list[str] = []
    for what, holds, remedy in _KINDS:
        names = [name or "(the model)" for name, m in model.named_modules() if holds(m)]
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            found.append(f"{what}{'s' if len(names) > 1 else ''} {', '.join(names[:3])}{more}")
            remedies += [remedy] if remedy not in remedies else []
    if found:
        raise value_error(
            f"{owner}: the model computes through forward hooks that no file holds for "
            f"{'; '.join(found)}: reloaded, it would compute something else; expected "
            f"{' and '.join(remedies)} first, then {owner}"
        )
