"""copy.deepcopy and pickle for pruning hooks, which hold a weak reference to their module.

After a forward pass with grad, module.<name> is a non-leaf tensor (mask * orig) in the
module's __dict__, which copy.deepcopy refuses (pytorch#37322). install() gives the hook a
weak reference to its module; the module's hooks are copied before its attributes, so the
hook, when copied, registers mask' * orig' (of the copies) in the memo as the copy of that
tensor. Pickling keeps a strong reference instead (pickle handles the cycle), so an
unpickled module can be deep-copied as well.

A module keeps its hooks in a dict keyed by ids from torch's per-process counter
(``RemovableHandle.next_id``). Unpickled in another process, where the counter starts again,
a hook registered later would take the key of a loaded pruning hook and replace it: each
hook keeps the key it was registered under, and unpickling it moves the counter past it.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from prunekit.core.naming import mask_name, orig_name

__all__ = ["BoundToModule", "KeepsHookKey"]

_TRANSIENT = ("_module", "_reuse")  # never copied nor pickled: rebuilt on use


class KeepsHookKey:
    """Mixin of prunekit's hooks: the key the module's hook dict holds them under, and,
    when unpickled, torch's hook counter moved past it."""

    _hook_id: int | None = None

    def _registered(self, hook_id: int) -> None:
        """Remember the key the module's hook dict holds this hook under."""
        self._hook_id = hook_id

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._hook_id is not None:
            RemovableHandle.next_id = max(RemovableHandle.next_id, self._hook_id + 1)


class BoundToModule(KeepsHookKey):
    """Mixin of pruning hooks: a weak reference to the module they prune, and the copy and
    pickle support it needs. Subclasses provide ``_require_name()``."""

    _module: weakref.ReferenceType[nn.Module] | None = None

    def _require_name(self) -> str:
        raise NotImplementedError

    def _bound_module(self) -> nn.Module | None:
        return self._module() if self._module is not None else None

    def _bind(self, module: nn.Module) -> None:
        self._module = weakref.ref(module)

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in _TRANSIENT}
        state["_bound_module"] = self._bound_module()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        module = state.pop("_bound_module", None)
        super().__setstate__(state)
        if module is not None:
            self._bind(module)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        module = self._bound_module()
        copied_module = memo.get(id(module)) if module is not None else None
        if module is not None and copied_module is not None:
            _copy_masked_tensor(module, self._require_name(), memo)
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        state = {k: v for k, v in self.__dict__.items() if k not in _TRANSIENT}
        new.__dict__.update(copy.deepcopy(state, memo))
        if copied_module is not None:
            new._bind(copied_module)
        return new


def _copy_masked_tensor(module: nn.Module, name: str, memo: dict[int, Any]) -> None:
    """Put in `memo` the copy of ``module.<name>``: the copied mask times the copied orig."""
    masked = module.__dict__.get(name)
    orig = module._parameters.get(orig_name(name))
    mask = module._buffers.get(mask_name(name))
    if not isinstance(masked, Tensor) or id(masked) in memo or orig is None or mask is None:
        return
    orig_copy = copy.deepcopy(orig, memo)
    mask_copy = copy.deepcopy(mask, memo)
    result = mask_copy.to(dtype=orig_copy.dtype) * orig_copy
    memo[id(masked)] = result if masked.requires_grad else result.detach()
    memo.setdefault(id(memo), []).append(masked)  # keep the id taken, as copy does
