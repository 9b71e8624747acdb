"""The passes of the selection in pieces (see pieces.py): each reads every piece once, a chunk at
a time, and sums what it counted over the ranks.

Comparisons write 0/1 floats into buffers reused from chunk to chunk (several times faster
here than bool tensors), and sums of them count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from prunekit.select import native, tuning
from prunekit.select.chunks import ones
from prunekit.select.group import Group
from prunekit.select.plan import KEYS
from prunekit.select.radix import find, top_digits
from prunekit.select.sample import enclose, spaced, stride
from prunekit.select.sources import all_finite

if TYPE_CHECKING:
    from prunekit.select.pieces import Piece

# Read a chunk (tuning.chunk) at a time; sample tuning.sample entries in all, over every
# rank, from tuning.guess entries on (fewer: every competing one is kept); gather between
# the bounds at most 1/tuning.gather_share of the entries. The same tuning as select's.
HALF = 1 << 15  # 16-bit magnitudes: the bits without the sign
INFINITY = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}  # bits of +inf: above, NaN


class Buffers:
    """Work buffers of one chunk's size, reused from chunk to chunk."""

    def __init__(self, work: torch.dtype, size: int | None = None) -> None:
        size = tuning.get().chunk if size is None else size
        self.work = work
        self.m = torch.empty(size, dtype=work)
        self.live = torch.empty(size, dtype=work)
        self.a = torch.empty(size, dtype=work)
        self.b = torch.empty(size, dtype=work)


def magnitudes(
    scores: Tensor, alive: Tensor | None, buffers: Buffers, step: int | None = None
) -> Iterator[tuple[int, Tensor, Tensor | None]]:
    """(start, magnitudes, 0/1 competing flags or None) per chunk (of `step` entries, by
    default the buffers' size), in `buffers`: valid until the next chunk."""
    step = buffers.m.numel() if step is None else step
    flat = scores.detach().reshape(-1)
    flags = None if alive is None else alive.reshape(-1)
    for start in range(0, flat.numel(), step):
        part = flat[start : start + step]
        n = part.numel()
        m = buffers.m[:n].copy_(part).abs_()
        live = None
        if flags is not None:
            live = torch.eq(flags[start : start + step], 1, out=buffers.live[:n])
        yield start, m, live


def non_finite(pieces: Sequence[Piece], owned: list[int]) -> list[int]:
    """The local pieces whose scores (any, competing or not) hold NaN or infinity."""
    return [i for i in owned if not all_finite(pieces[i].source()[0])]


@dataclass
class Counted:
    """What a pass counted, summed over the ranks, and what it kept locally."""

    below: int  # competing entries below the lower bound (or the threshold)
    kept: int  # entries kept in all; -1 if a rank went over its budget
    nonfinite: int
    held: dict[int, Tensor]  # per local piece: magnitudes kept, or a histogram


def histograms(
    pieces: Sequence[Piece], owned: list[int], fmt: torch.dtype, group: Group
) -> tuple[Tensor, dict[int, Tensor], int]:
    """For scores all of one 16-bit float format: the histogram of the competing
    magnitudes' bits (summed over the ranks), each local piece's own, and how many
    scores are not finite (summed). One pass, no sample: the bits are the values."""
    infinity = INFINITY[fmt]
    mine: dict[int, Tensor] = {}
    nonfinite = 0
    for i in owned:
        scores, alive = pieces[i].source()
        flat = scores.detach().reshape(-1).view(torch.int16)
        flags = None if alive is None else alive.reshape(-1)
        hist = torch.zeros(HALF, dtype=torch.int64)
        dead = 0
        step = tuning.get().chunk
        for start in range(0, flat.numel(), step):
            keys = flat[start : start + step] & (HALF - 1)
            if flags is not None:
                out = flags[start : start + step]
                out = out.logical_not() if out.dtype == torch.bool else out != 1
                dead += int(out.count_nonzero())
                nonfinite += int((out & (keys >= infinity)).count_nonzero())
                keys.masked_fill_(out, HALF - 1)  # a NaN's bits: never counted below
            hist += torch.bincount(keys, minlength=HALF)
        nonfinite += int(hist[infinity:].sum()) - dead
        mine[i] = hist
    local = sum(mine.values(), torch.zeros(HALF, dtype=torch.int64))
    summed = group.sum(torch.cat([local, torch.tensor([nonfinite])]))
    return summed[:HALF], mine, int(summed[HALF])


def bounds(
    pieces: Sequence[Piece],
    owned: list[int],
    buffers: Buffers,
    k: int,
    size: int,
    total: int,
    group: Group,
) -> tuple[float, float]:
    """Magnitudes that very likely enclose the k-th smallest, from an evenly spaced
    sample gathered from every rank; (0, inf), keeping every competing entry, for few
    entries or too small a sample."""
    now = tuning.get()
    if size <= now.guess:
        return 0.0, math.inf
    step = stride(size, now.sample)
    taken = spaced([pieces[i].source for i in owned], step, buffers.work).values
    mine = torch.empty(0, dtype=buffers.work) if taken is None else taken[taken.isfinite()]
    sample = torch.cat(group.gather(mine))
    if sample.numel() < now.sample // 8:
        return 0.0, math.inf
    return enclose(sample, [k / total])


def between(
    pieces: Sequence[Piece],
    owned: list[int],
    buffers: Buffers,
    limits: tuple[float, float],
    size: int,
    group: Group,
) -> Counted:
    """One pass: counts the competing entries below the lower limit and keeps, per
    piece, the competing magnitudes between the limits (16-bit ones in their own
    dtype), up to a budget of 1/16 of all entries per rank."""
    now = tuning.get()
    budget = size if size <= now.guess else max(size // now.gather_share, now.guess)
    count = _between_native if native.loaded() is not None else _between_tensors
    below, kept, nonfinite, held = count(pieces, owned, buffers, limits, budget)
    over = kept > budget
    if over:
        held.clear()
    totals = group.sum(torch.tensor([below, kept, int(over), nonfinite], dtype=torch.int64))
    return Counted(int(totals[0]), -1 if int(totals[2]) else int(totals[1]), int(totals[3]), held)


Tally = tuple[int, int, int, dict[int, Tensor]]  # below, kept, not finite (> 0: some), held


def _between_tensors(
    pieces: Sequence[Piece],
    owned: list[int],
    buffers: Buffers,
    limits: tuple[float, float],
    budget: int,
) -> Tally:
    """`between`'s pass as tensor operations, a few per chunk (16-bit magnitudes kept in
    their own dtype); past the budget, it only counts."""
    lower, upper = limits
    held: dict[int, Tensor] = {}
    kept = below = nonfinite = 0
    for i in owned:
        scores, alive = pieces[i].source()
        keep_as = scores.dtype if scores.dtype.itemsize == 2 else buffers.work
        parts = []
        for _, m, live in magnitudes(scores, alive, buffers):
            n = m.numel()
            if not math.isfinite(float(m.sum())):
                nonfinite += int((~m.isfinite()).sum())
            under = torch.lt(m, lower, out=buffers.a[:n])
            inside = torch.le(m, upper, out=buffers.b[:n]).sub_(under)
            if live is not None:
                under.mul_(live)
                inside.mul_(live)
            below += ones(under)
            if kept > budget:
                continue
            values = m[inside.nonzero().reshape(-1)]
            kept += values.numel()
            parts.append(values.to(keep_as))
        if parts and kept <= budget:
            held[i] = torch.cat(parts)
    return below, kept, nonfinite, held


def _between_native(
    pieces: Sequence[Piece],
    owned: list[int],
    buffers: Buffers,
    limits: tuple[float, float],
    budget: int,
) -> Tally:
    """`between`'s pass through the C loop, the whole-tensor path's one pass (its marks
    go to a scratch buffer: the threshold is not known yet): one read of each score.
    The magnitudes kept are views of one buffer, in the work dtype; past the budget, it
    only counts."""
    lower, upper = limits
    step = tuning.get().step
    room = min(step, max((pieces[i].numel for i in owned), default=0))
    gather = native.Gather(budget + room, buffers.work)  # a chunk is gathered, then checked
    scratch = torch.empty(room, dtype=torch.bool)
    live = torch.empty(room, dtype=torch.bool)
    held: dict[int, Tensor] = {}
    below = nonfinite = 0
    over = False
    for i in owned:
        scores, alive = pieces[i].source()
        flat = scores.detach().reshape(-1)
        flags = None if alive is None else alive.reshape(-1)
        first = gather.size
        for start in range(0, flat.numel(), step):
            part = flat[start : start + step].to(buffers.work).contiguous()  # 16-bit: exact
            n = part.numel()
            chunk = None if flags is None else flags[start : start + step]
            if chunk is not None and not (native.makes(chunk.dtype) and chunk.is_contiguous()):
                chunk = torch.eq(chunk, 1, out=live[:n])  # the C loop reads 1s as bits
            marks, cuts = (1, 0), (lower, lower, upper)
            _, under, finite = native.split(part, chunk, scratch[:n], marks, cuts, gather, start)
            below += under
            nonfinite += not finite
            if gather.size > budget:
                over, gather.size = True, 0  # the count goes on, nothing more is kept
        if not over and gather.size > first:
            held[i] = gather.values[first : gather.size]
    return below, budget + 1 if over else gather.size, nonfinite, held


def as_float(key: int, dtype: torch.dtype) -> float:
    """The float whose bits are `key` in `dtype`."""
    bits = KEYS[8 * dtype.itemsize]
    return float(torch.tensor([key], dtype=bits).view(dtype)[0])


def held_keys(held: dict[int, Tensor], work: torch.dtype) -> Iterator[tuple[Tensor, Tensor]]:
    """The magnitudes kept, as radix.find reads them (in `work`, with their top digits)."""
    step = tuning.get().chunk
    for values in held.values():
        for start in range(0, values.numel(), step):
            part = values[start : start + step].to(work)
            yield part, top_digits(part)


def data_keys(
    pieces: Sequence[Piece], owned: list[int], buffers: Buffers
) -> Iterator[tuple[Tensor, Tensor]]:
    """The competing magnitudes of the local pieces, as radix.find reads them."""
    for i in owned:
        for _, m, live in magnitudes(*pieces[i].source(), buffers):
            part = m if live is None else m[live == 1]
            yield part, top_digits(part)


def radix(
    keys: Callable[[], Iterable[tuple[Tensor, Tensor]]], rank: int, work: torch.dtype, group: Group
) -> tuple[int, int]:
    """The `rank`-th smallest (1-based) of the non-negative floats `keys()` yields on all
    ranks, as its bits (radix.find), and how many entries equal to it are among the
    `rank` smallest."""
    key, take, _ = find(keys, rank, torch.finfo(work).bits, group)
    return key, take


def equal_count(
    piece: Piece, buffers: Buffers, bound: float, span: tuple[int, int] | None = None
) -> int:
    """How many competing entries of `piece` (in its flat `span`) equal `bound`."""
    scores, alive = piece.source()
    if span is not None:
        scores = scores.detach().reshape(-1)[span[0] : span[1]]
        alive = None if alive is None else alive.reshape(-1)[span[0] : span[1]]
    count = 0
    for _, m, live in magnitudes(scores, alive, buffers):
        equal = torch.eq(m, bound, out=buffers.a[: m.numel()])
        count += ones(equal if live is None else equal.mul_(live))
    return count
