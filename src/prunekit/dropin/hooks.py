"""Finding the pruning hooks prunekit installed on a module, and checking their kind.

A pruning hook is a ``BasePruningMethod`` (a ``PruningContainer`` too): the one kind of hook
bound to its module (``copying.BoundToModule``), which is what this module looks for, so that
the hooks can be found below the method protocol itself (by the out_proj refresh).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

import torch.nn.utils.prune as torch_prune
from torch import nn

from prunekit.core.errors import attribute_error, describe, value_error
from prunekit.dropin.copying import BoundToModule

if TYPE_CHECKING:  # the protocol stands above: it refreshes out_proj through this module
    from prunekit.dropin.base_method import BasePruningMethod

__all__ = [
    "PRUNING_TYPES", "find_pruning_hook", "is_pruning_hook", "pruning_hooks", "pruning_type",
    "torch_pruned",
]  # fmt: skip

PRUNING_TYPES = ("unstructured", "structured", "global")


def is_pruning_hook(hook: object) -> TypeGuard[BasePruningMethod]:
    """Whether `hook` is a pruning method installed by prunekit (or a container of them)."""
    return isinstance(hook, BoundToModule)


def pruning_hooks(module: nn.Module) -> list[BasePruningMethod]:
    """The pruning hooks installed on `module` itself (not its submodules), in order."""
    return [h for h in module._forward_pre_hooks.values() if is_pruning_hook(h)]


def torch_pruned(module: nn.Module) -> list[str]:
    """The tensors of `module` itself pruned by torch.nn.utils.prune (its own hooks, which keep
    the same ``<name>_orig`` and ``<name>_mask`` as prunekit's)."""
    hooks = module._forward_pre_hooks.values()
    return [h._tensor_name for h in hooks if isinstance(h, torch_prune.BasePruningMethod)]


def find_pruning_hook(module: nn.Module, name: str) -> tuple[Any, BasePruningMethod | None]:
    """Return (key, hook) of the pruning hook on ``module.<name>``, or (None, None)."""
    found = [
        (key, hook)
        for key, hook in module._forward_pre_hooks.items()
        if is_pruning_hook(hook) and hook._tensor_name == name
    ]
    if len(found) > 1:
        raise RuntimeError(
            f"{describe(module, name)} carries {len(found)} pruning hooks; "
            "successive prunings must share one PruningContainer"
        )
    return found[0] if found else (None, None)


def pruning_type(method: BasePruningMethod) -> str:
    """`method`'s PRUNING_TYPE, checked: read when it is composed with another pruning."""
    kind = getattr(method, "PRUNING_TYPE", None)
    name = type(method).__name__
    if kind is None:
        raise attribute_error(
            f"{name} declares no PRUNING_TYPE, which composing it with an earlier pruning "
            f"needs; expected a class attribute, one of {PRUNING_TYPES}"
        )
    if kind not in PRUNING_TYPES:
        raise value_error(
            f"{name}.PRUNING_TYPE={kind!r} is not allowed; expected one of {PRUNING_TYPES}"
        )
    return str(kind)
