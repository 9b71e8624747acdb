"""Which path a selection takes: the fast one (and how it reads the scores) or the portable one.

The fast path covers CPU torch tensors of float16, bfloat16, float32 and float64
holding more than `tuning.small` entries in all, ranked by magnitude or all
non-negative; anything else (other frameworks and devices, other dtypes,
negative scores, small inputs) takes the portable path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from prunekit.select import tuning
from prunekit.select.sources import Source, check_flags

__all__ = ["BITS", "Plan", "budget", "fast_plan"]

BITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32, torch.float64: 64}
_KEYS = {16: torch.int16, 32: torch.int32, 64: torch.int64}


@dataclass(frozen=True)
class Plan:
    """How the fast path reads scores: their common float dtype and its bit width."""

    dtype: torch.dtype
    bits: int  # 16, 32 or 64
    size: int  # entries in all sources
    largest: int  # entries in the largest source

    @property
    def work(self) -> torch.dtype:
        """The dtype magnitudes are compared in: 16-bit floats widen (exactly) to float32,
        whose arithmetic is several times faster here."""
        return torch.float32 if self.bits == 16 else self.dtype

    @property
    def key(self) -> torch.dtype:
        """The integer dtype of the same width, whose bits are viewed as keys."""
        return _KEYS[self.bits]


def fast_plan(sources: Sequence[Source], magnitude: bool) -> Plan | None:
    """How to read the scores, or None when the fast path does not apply (or does not pay).
    Checks every source's flags on the way."""
    dtype: torch.dtype | None = None
    fast = True
    size = largest = 0
    for index, source in enumerate(sources):
        scores, alive = source()
        check_flags(index, scores, alive)  # here, where every source is read anyway
        if not fast or not isinstance(scores, Tensor) or scores.dtype not in BITS:
            fast = False
            continue
        if scores.device.type != "cpu":
            fast = False  # the chunk buffers live in CPU memory
            continue
        size += scores.numel()
        largest = max(largest, scores.numel())
        dtype = scores.dtype if dtype is None else torch.promote_types(dtype, scores.dtype)
    if not fast or dtype is None or size <= tuning.get().small:
        return None
    for source in () if magnitude else sources:
        scores, _ = source()
        if scores.numel() and bool(scores.min() < 0):
            return None
    return Plan(dtype, BITS[dtype], size, largest)


def budget(plan: Plan) -> int:
    """How many entries in between the one pass may gather: at most 1/16 of all (ranking
    them is then a much smaller problem), taking no more memory (a position and a value
    each) than the largest tensor (see `tuning.gather_share`, `tuning.gather_capped`)."""
    now = tuning.get()
    share = plan.size // now.gather_share
    if not now.gather_capped:
        return share
    item = torch.finfo(plan.work).bits // 8
    return min(share, plan.largest * item // (8 + item))
