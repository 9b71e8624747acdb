"""Which path a selection takes: the fast one (and how it reads the scores) or the portable one.

The fast path (the engine's strategy) covers CPU torch tensors of float16, bfloat16,
float32 and float64 holding more than `tuning.small` entries in all, ranked by
magnitude or by signed value (`Route.signed`: some score is negative); anything else
(other frameworks and devices, other dtypes, small inputs) takes the portable path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from prunekit.core.backend import namespace
from prunekit.select import tuning
from prunekit.select.inputs import Source, check_flags

__all__ = ["BITS", "KEYS", "Route", "budget", "make"]

BITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32, torch.float64: 64}
KEYS = {16: torch.int16, 32: torch.int32, 64: torch.int64}  # float bits read as integers


@dataclass(frozen=True)
class Route:
    """Which path a selection takes and how it reads the scores: their common dtype (of
    torch or TensorPlay), how many entries there are in all and in the largest source."""

    fast: bool
    dtype: Any
    size: int  # entries in all sources
    largest: int  # entries in the largest source
    each: tuple[tuple[int, Any], ...] = ()  # per source: its entries and dtype
    signed: bool = False  # ranked by signed value, some of which are negative

    @property
    def bits(self) -> int:
        """The fast path's float width: 16, 32 or 64."""
        return BITS[self.dtype]

    @property
    def work(self) -> torch.dtype:
        """The dtype magnitudes are compared in: 16-bit floats widen (exactly) to float32,
        whose arithmetic is several times faster here."""
        work: torch.dtype = torch.float32 if self.bits == 16 else self.dtype
        return work

    @property
    def key(self) -> torch.dtype:
        """The integer dtype of the same width, whose bits are viewed as keys."""
        return KEYS[self.bits]


def make(sources: Sequence[Source], magnitude: bool) -> Route:
    """The plan for these sources: the fast path where it applies (and pays), else the
    portable one. Checks every source's flags on the way."""
    dtype: Any = None
    fast = True
    size = largest = 0
    each = []
    for index, source in enumerate(sources):
        scores, alive = source()
        check_flags(index, scores, alive)  # here, where every source is read anyway
        each.append((scores.numel(), scores.dtype))
        size += scores.numel()
        largest = max(largest, scores.numel())
        if dtype is None:
            dtype = scores.dtype
        elif scores.dtype != dtype:
            dtype = namespace(scores).promote_types(dtype, scores.dtype)
        if not isinstance(scores, Tensor) or scores.dtype not in BITS:
            fast = False
        elif scores.device.type != "cpu":
            fast = False  # the chunk buffers live in CPU memory
    fast = fast and dtype is not None and size > tuning.get().small
    signed = False
    for source in sources if fast and not magnitude else ():
        scores, _ = source()
        if bool((scores < 0).any()):  # NaN among them or not
            signed = True  # else the magnitudes rank as the values do
            break
    return Route(fast, dtype, size, largest, tuple(each), signed)


def budget(plan: Route) -> int:
    """How many entries in between the one pass may gather: at most 1/16 of all (ranking
    them is then a much smaller problem), taking no more memory (a position and a value
    each) than the largest tensor (see `tuning.gather_share`, `tuning.gather_capped`)."""
    now = tuning.get()
    share = plan.size // now.gather_share
    if not now.gather_capped:
        return share
    item = torch.finfo(plan.work).bits // 8
    return min(share, plan.largest * item // (8 + item))
