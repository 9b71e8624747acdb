"""Whether a tensor holds only finite values, read a chunk at a time.

A finite sum clears a chunk quickly and ``isfinite()`` settles the rest, so no temporary as
large as the tensor is made. The argument checks of ``core.checks`` and the selection of
``select`` both ask it.
"""

from __future__ import annotations

import math

from torch import Tensor

from prunekit.core.backend import namespace

__all__ = ["CHUNK", "all_finite"]

CHUNK = 1 << 18
"""Entries read at once (``select.tuning``'s chunk by default)."""


def all_finite(t: Tensor, chunk: int = CHUNK) -> bool:
    """Whether `t` holds no NaN or infinity.

    Args:
        t: a tensor of any framework prunekit serves.
        chunk: how many entries are read at once.

    Returns:
        True if every entry is finite.
    """
    flat = t.reshape(-1)
    ns = namespace(flat)
    for start in range(0, flat.numel(), chunk):
        part = flat[start : start + chunk]
        if not math.isfinite(float(part.sum())) and not bool(ns.isfinite(part).all()):
            return False
    return True
