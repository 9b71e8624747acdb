"""The argument names every whole-model entry point shares, and the old spellings that still
work, each with a FutureWarning naming the new one.

One idea, one name, in prune_model, GradualPruner, prune_channels, prune_state_dict,
prune_sharded and the command line:

- ``scope=``: ``'layer'`` (each tensor, or each channel group) or ``'global'`` (all of
  them ranked together); was ``global_pruning=True`` in prune_state_dict, prune_file and
  prune_sharded, and ``--global`` on the command line.
- ``include=`` / ``exclude=``: globs of names to prune or to leave out; ``exclude`` was
  ``ignore=`` in prune_channels.
- ``n`` is a norm order (prune_channels, the 'ln' method); prune_blocks' number of blocks
  is ``count=`` (was ``n=``).
"""

from __future__ import annotations

from typing import Any, TypeVar

from prunekit.core.errors import type_error, value_error, warn_caller
from prunekit.whole.registry import check_scope

__all__ = ["RENAMED", "renamed", "scope_from"]

RENAMED = {"global_pruning": "scope", "ignore": "exclude"}
"""Old argument name -> the name that replaced it."""

T = TypeVar("T")


def warn_renamed(owner: str, old: str, instead: str, new: str | None = None) -> None:
    """The FutureWarning of an old argument name: what to write instead (`new`: the new
    name, default RENAMED's)."""
    warn_caller(
        f"{owner}: {old}= is renamed {new or RENAMED[old]}= (the name every prunekit entry "
        f"point uses); write {instead}. The old name will be removed in a future version.",
        FutureWarning,
    )


def scope_from(owner: str, scope: Any, global_pruning: Any, given: bool = True) -> str:
    """The scope a call asks for: `scope`, or what the old ``global_pruning=`` said
    (None: not given), with a FutureWarning.

    Args:
        owner: the entry point the errors name.
        scope: the scope given, or the entry point's default.
        global_pruning: the old argument, or None where not given.
        given: whether `scope` was given (False: it is the default, which
            `global_pruning` overrides).

    Returns:
        'layer' or 'global'.

    Raises:
        TypeError: `global_pruning` is not a bool.
        ValueError: an unknown `scope`, or a `scope` given with a `global_pruning` that
            says the other one.
    """
    check_scope(scope, owner)
    if global_pruning is None:
        return str(scope)
    if not isinstance(global_pruning, bool):
        raise type_error(
            f"{owner}: invalid global_pruning={global_pruning!r}; expected a bool (better: "
            "scope='layer' or 'global')"
        )
    meant = "global" if global_pruning else "layer"
    warn_renamed(owner, "global_pruning", f"scope={meant!r}")
    if given and scope != meant:  # a scope given is never taken for the other one
        raise value_error(
            f"{owner}: scope={scope!r} and global_pruning={global_pruning} disagree; "
            "expected scope= alone"
        )
    return meant


def renamed(owner: str, new: str, value: T, old: str, given: T | None, set_too: bool) -> T:
    """`value` (the argument `new`), or `given` under the old name `old` (None: not
    given), with a FutureWarning; `set_too`: whether `new` was given as well.

    Raises:
        ValueError: both given.
    """
    if given is None:
        return value
    warn_renamed(owner, old, f"{new}={given!r}", new)
    if set_too:
        raise value_error(
            f"{owner}: {old}= is the old name of {new}=; expected one of them, got both "
            f"({old}={given!r}, {new}={value!r})"
        )
    return given
