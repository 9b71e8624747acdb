"""Snapshot and restore of a model's modules, so a failed call leaves the model as it was.

It keeps each module's attribute dict and the contents of its parameter, buffer and hook dicts
(the dict objects themselves stay, so hook handles keep working). Tensors are never changed in
place by the callers, so references suffice.
"""

from __future__ import annotations

from typing import Any

from torch import nn

_DICTS = (
    "_parameters",
    "_buffers",
    "_modules",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


class Snapshot:
    """The state of every module of `model` now; `restore()` puts it back."""

    def __init__(self, model: nn.Module) -> None:
        self._saved: list[tuple[nn.Module, dict[str, Any], list[tuple[Any, Any]]]] = []
        for module in model.modules():
            inner: list[tuple[Any, Any]] = []
            for name in _DICTS:
                value = module.__dict__.get(name)
                if isinstance(value, dict):
                    inner.append((value, dict(value)))
            persistent = module.__dict__.get("_non_persistent_buffers_set")
            if isinstance(persistent, set):
                inner.append((persistent, set(persistent)))
            self._saved.append((module, dict(module.__dict__), inner))

    def restore(self) -> None:
        for module, attributes, inner in self._saved:
            for container, contents in inner:
                container.clear()
                container.update(contents)
            module.__dict__.clear()
            module.__dict__.update(attributes)
