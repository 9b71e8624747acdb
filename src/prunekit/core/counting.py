"""How many entries of a tensor are zero, in one pass and without a bool copy."""

from __future__ import annotations

import torch
from torch import Tensor

from prunekit.core.backend import framework

__all__ = ["zero_count"]

_KEYS = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # floats' bits read as integers
_CHUNK = 1 << 20
"""Entries whose bits are masked at a time: the work buffer stays small (an embedding of
SmolLM2-135M is 28 M entries, whose copy was the largest allocation of a pruning call)."""


def zero_count(t: Tensor) -> int:
    """How many entries of the tensor `t` (of torch or TensorPlay) are zero (-0.0 included).

    torch's floats of 16, 32 and 64 bits are counted on their bits with the sign cleared
    (faster than on 16-bit floats themselves), a chunk of `_CHUNK` entries at a time when
    contiguous; float8 by comparison, as torch has no ``count_nonzero`` for it on the CPU;
    anything else by ``count_nonzero``.
    """
    if framework(t) != "torch" or not t.is_floating_point():
        return int(t.numel()) - int(t.count_nonzero())
    key = _KEYS.get(t.element_size())
    if key is None:
        return int((t == 0).sum())
    top = torch.iinfo(key).max
    if not t.is_contiguous() or t.numel() <= _CHUNK:
        magnitude = t.view(key) & top
        return t.numel() - int(magnitude.count_nonzero())
    bits = t.detach().reshape(-1).view(key)
    work = torch.empty(_CHUNK, dtype=key)
    nonzero = 0
    for start in range(0, bits.numel(), _CHUNK):
        part = bits[start : start + _CHUNK]
        nonzero += int(torch.bitwise_and(part, top, out=work[: part.numel()]).count_nonzero())
    return t.numel() - nonzero
