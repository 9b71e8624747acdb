"""The forward-reuse cache: gradient-free forwards keep ``module.<name>`` while nothing
it was made from has changed.

What changes when a tensor's values may have: its storage, dtype, device and version
counter. Writes through ``.data`` bypass version counters and are the one change the
cache cannot see (``prunekit.refresh_pruned`` or ``forward_reuse(model, False)`` then).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

__all__ = ["Reuse", "state_of"]


def state_of(*tensors: Any) -> tuple[Any, ...] | None:
    """Storage, dtype, device and version counter of each tensor; None for tensors without
    a version counter (inference tensors)."""
    try:
        return tuple((t.data_ptr(), t.dtype, t.device, t._version) for t in tensors)
    except (RuntimeError, AttributeError):
        return None


class Reuse:
    """mask * orig made by a gradient-free forward, with what it was made from."""

    __slots__ = ("mask", "masked", "orig", "state")

    def __init__(self, orig: Tensor, mask: Tensor, masked: Tensor, state: tuple[Any, ...]):
        self.orig, self.mask, self.masked, self.state = orig, mask, masked, state

    @classmethod
    def of(cls, orig: Tensor, mask: Tensor, masked: Tensor) -> Reuse | None:
        state = state_of(orig, mask, masked)
        return None if state is None else cls(orig, mask, masked, state)

    def holds(self, orig: Tensor, mask: Tensor, current: Any) -> bool:
        """Whether ``module.<name>`` (`current`) is still mask * orig as made."""
        return (
            self.orig is orig
            and self.mask is mask
            and current is self.masked
            and state_of(orig, mask, current) == self.state
        )
