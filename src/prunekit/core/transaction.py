"""One transaction for "a failed call leaves the model exactly as it was".

A call that changes modules (a pruning, a global pruning, loading a checkpoint) runs inside
``with transaction(modules):``; if anything raises, every module gets back its parameters,
buffers, hooks and tensor attributes, in the same dict objects and the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

from prunekit.core.backend import is_tensor

__all__ = ["Snapshot", "transaction"]


class Snapshot:
    """What a pruning call may change on a module, to put back exactly if the call fails."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.parameters = dict(module._parameters)
        self.buffers = dict(module._buffers)
        self.hooks = dict(module._forward_pre_hooks)
        self.load_hooks = dict(module._load_state_dict_post_hooks)
        self.tensors = {k: v for k, v in module.__dict__.items() if is_tensor(v)}
        self.methods = {
            key: hook._pruning_methods
            for key, hook in self.hooks.items()
            if hasattr(hook, "_pruning_methods")
        }
        flat = module.__dict__.get("_flat_weights")
        self.flat_weights = list(flat) if isinstance(flat, list) else None

    def restore(self) -> None:
        """Put back the dicts' contents (same dict objects, same order) and attributes."""
        m = self.module
        m._parameters.clear()
        m._parameters.update(self.parameters)
        m._buffers.clear()
        m._buffers.update(self.buffers)
        m._forward_pre_hooks.clear()
        m._forward_pre_hooks.update(self.hooks)
        m._load_state_dict_post_hooks.clear()
        m._load_state_dict_post_hooks.update(self.load_hooks)
        for name in [k for k, v in m.__dict__.items() if is_tensor(v)]:
            if name not in self.tensors:
                del m.__dict__[name]
        m.__dict__.update(self.tensors)
        for key, methods in self.methods.items():
            hook: Any = self.hooks[key]
            hook._pruning_methods = methods
        if self.flat_weights is not None:
            m.__dict__["_flat_weights"][:] = self.flat_weights


@contextmanager
def transaction(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Run the block; if it raises (anything, KeyboardInterrupt included), restore every
    module in `modules` (each once) as it was when the block began, then re-raise."""
    snapshots: dict[int, Snapshot] = {}
    for module in modules:
        snapshots.setdefault(id(module), Snapshot(module))
    try:
        yield
    except BaseException:
        for snapshot in snapshots.values():
            snapshot.restore()
        raise
