"""The engine's passes (see pieces.py): each reads every piece once, a chunk at a time, and sums
what it counted over the ranks: the count pass (`between`, onepass.split per piece), the 16-bit
histograms, the histograms of bits over the scores, the ties at the threshold.

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

from prunekit.select import native, onepass, trace, tuning
from prunekit.select.chunks import Chunks, ones
from prunekit.select.inputs import competing_finite
from prunekit.select.native import Gather
from prunekit.select.onepass import Gathered
from prunekit.select.process_group import Group
from prunekit.select.radix import find, top_digits
from prunekit.select.strategy import KEYS

if TYPE_CHECKING:
    from prunekit.select.pieces import Piece

# Read a chunk (tuning.chunk) at a time; sample tuning.sample entries in all, over every
# rank, from tuning.guess entries on (fewer: every competing one is kept); gather between
# the bounds at most 1/tuning.gather_share of the entries. The same tuning as select's.
HALF = 1 << 15  # 16-bit magnitudes: the bits without the sign
INFINITY = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}  # bits of +inf: above, NaN


class Buffers:
    """Work buffers of one chunk's size, reused from chunk to chunk; `signed`: the scores
    are read as they are, not as magnitudes."""

    def __init__(self, work: torch.dtype, size: int | None = None, signed: bool = False) -> None:
        size = tuning.get().chunk if size is None else size
        self.work = work
        self.signed = signed
        self.m = torch.empty(size, dtype=work)
        self.live = torch.empty(size, dtype=work)
        self.a = torch.empty(size, dtype=work)
        self.b = torch.empty(size, dtype=work)


def magnitudes(
    scores: Tensor, alive: Tensor | None, buffers: Buffers, step: int | None = None
) -> Iterator[tuple[int, Tensor, Tensor | None]]:
    """(start, magnitudes (scores, for signed buffers), 0/1 competing flags or None) per
    chunk (of `step` entries, by default the buffers' size), in `buffers`: valid until the
    next chunk."""
    step = buffers.m.numel() if step is None else step
    flat = scores.detach().reshape(-1)
    flags = None if alive is None else alive.reshape(-1)
    for start in range(0, flat.numel(), step):
        part = flat[start : start + step]
        n = part.numel()
        m = buffers.m[:n].copy_(part)
        if not buffers.signed:
            m.abs_()
        live = None
        if flags is not None:
            live = torch.eq(flags[start : start + step], 1, out=buffers.live[:n])
        yield start, m, live


def non_finite(pieces: Sequence[Piece], owned: list[int]) -> list[int]:
    """The local pieces whose competing scores hold NaN or infinity (what lies behind the
    flags never counts)."""
    return [i for i in owned if not competing_finite(*pieces[i].source())]


def histograms(
    pieces: Sequence[Piece], owned: list[int], fmt: torch.dtype, group: Group
) -> tuple[Tensor, dict[int, Tensor], int]:
    """For scores all of one 16-bit float format: the histogram of the competing
    magnitudes' bits (summed over the ranks), each local piece's own, and how many
    competing scores are not finite (summed; those behind the flags never count). One
    pass, no sample: the bits are the values."""
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
                keys.masked_fill_(out, HALF - 1)  # a NaN's bits: never counted below
            hist += torch.bincount(keys, minlength=HALF)
        nonfinite += int(hist[infinity:].sum()) - dead  # the dead all lie there
        mine[i] = hist
    local = sum(mine.values(), torch.zeros(HALF, dtype=torch.int64))
    summed = group.sum(torch.cat([local, torch.tensor([nonfinite])]))
    return summed[:HALF], mine, int(summed[HALF])


@dataclass
class Marks:
    """The count pass's one-read option, for whole tensors in one process: it also writes
    each tensor's selection around the guess (`keep_dtype`: as a mask of that dtype, 1
    kept, else as bools) and scores x mask into `products` (per tensor, or None)."""

    keep_dtype: torch.dtype | None
    products: Sequence[Tensor | None] | None
    finite: bool  # refuse non-finite scores (NotFinite) once the count is known
    # the `k` smallest of the entries gathered between the bounds, when many are and the C
    # loop cannot settle them: the whole selection again (choose's; passed down, not imported)
    rank: Callable[[Tensor, int], Tensor]


@dataclass
class Counted:
    """What the count pass counted, summed over the ranks, and what it kept locally."""

    below: int  # competing entries below the lower bound
    kept: int  # entries kept between the bounds in all; -1 if a rank went over its budget
    nonfinite: int  # pieces whose competing scores are not all finite
    competing: int  # entries competing (-1: the pass stopped early)
    held: dict[int, Tensor]  # per local piece: the magnitudes kept
    values: Tensor  # the magnitudes kept, all local pieces in order
    marked: list[Gathered]  # with Marks: each piece's selection and positions kept
    finite: bool  # every competing score was read, and found finite


def between(
    pieces: Sequence[Piece],
    owned: list[int],
    chunks: Chunks,
    bounds: tuple[float, float, float],
    budget: int,
    group: Group,
    marks: Marks | None = None,
) -> Counted:
    """The count pass (onepass.split, the C loop or tensor operations): counts the
    competing entries below the lower bound and keeps, per piece, the magnitudes
    between the bounds (lower, mid, upper), up to `budget` entries per rank; past it,
    it only counts. With `marks`, it also writes the selections around mid, and stops
    as soon as the budget is passed (the marks are then of no use)."""
    plan = chunks.plan
    room = min(max(chunks.step, chunks.chunk), plan.largest)
    gather = Gather(budget + room, plan.work)  # a chunk is gathered, then checked
    hit = marks is None or marks.keep_dtype is None
    out_dtype = torch.bool if marks is None or marks.keep_dtype is None else marks.keep_dtype
    scratch = torch.empty(room, dtype=torch.bool if native.makes(torch.bool) else plan.work)
    held: dict[int, Tensor] = {}
    marked: list[Gathered] = []
    below = competing = nonfinite = 0
    over = unknown = False
    for i in owned:
        scores, alive = pieces[i].source()
        out, product = scratch, None
        if marks is not None:
            out = torch.empty(scores.numel(), dtype=out_dtype)
            product = None if marks.products is None else marks.products[i]
        first = gather.size
        peaks: list[Tensor | bool] | None = []  # per chunk: finite? (None: not known)
        sweep = onepass.CountPass(bounds, hit, gather, product, window=marks is None)
        parts = onepass.split(chunks, scores, alive, out, sweep)
        for part in parts:
            below += part.below
            competing += part.competing
            if part.finite is None:
                peaks = None
            elif peaks is not None:
                peaks.append(part.finite)
            if gather.size > budget:
                if marks is not None:
                    return _summed([below, 0, 1, 0, -1], held, gather, marked, False, group)
                over, gather.size, first = True, 0, 0  # the count goes on, nothing is kept
        if peaks is None:
            unknown = True
            finite = marks is not None or competing_finite(scores, alive)  # marks: not asked
        else:
            # The C loop tells of every entry: where some do not compete, a chunk it found
            # not finite is read again for the competing ones alone (what lies behind the
            # flags never counts).
            finite = all(bool(peak) for peak in peaks)
            finite = finite or (alive is not None and competing_finite(scores, alive))
        nonfinite += not finite
        if marks is not None:
            # Scores are kept only where a product needs them: sources may make theirs anew.
            flat = None if product is None else scores.detach().reshape(-1)
            marked.append(Gathered(out, product, flat, gather.positions[first : gather.size]))
        elif not over and gather.size > first:
            held[i] = gather.values[first : gather.size]
    counts = [below, gather.size, int(over), nonfinite, competing]
    return _summed(counts, held, gather, marked, not unknown and not nonfinite, group)


def _summed(
    counts: list[int],
    held: dict[int, Tensor],
    gather: Gather,
    marked: list[Gathered],
    finite: bool,
    group: Group,
) -> Counted:
    """The pass's counts (below, kept, over, not finite, competing) summed over the ranks."""
    below, kept, over, nonfinite, competing = group.sum(torch.tensor(counts)).tolist()
    values = gather.values[: gather.size]
    kept = -1 if over else kept
    return Counted(below, kept, nonfinite, competing, held, values, marked, finite)


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
    pieces: Sequence[Piece], owned: list[int], buffers: Buffers, negative: bool | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """The competing magnitudes of the local pieces, as radix.find reads them; with
    `negative` (signed buffers), only those of the negative scores (True) or of the
    others (False)."""
    for i in owned:
        for _, m, live in magnitudes(*pieces[i].source(), buffers):
            part = m if live is None else m[live == 1]
            if negative is not None:
                part = part[(part < 0) == negative].abs_()
            yield part, top_digits(part)


def real_count(pieces: Sequence[Piece], owned: list[int], buffers: Buffers) -> int:
    """How many competing scores of the local pieces are not NaN."""
    return sum(int((part == part).sum()) for part, _ in data_keys(pieces, owned, buffers))


def negatives(pieces: Sequence[Piece], owned: list[int], buffers: Buffers) -> int:
    """How many competing scores of the local pieces are negative (signed buffers)."""
    return sum(part.numel() for part, _ in data_keys(pieces, owned, buffers, True))


def radix(
    keys: Callable[[], Iterable[tuple[Tensor, Tensor]]], rank: int, work: torch.dtype, group: Group
) -> tuple[int, int, int]:
    """The `rank`-th smallest (1-based) of the non-negative floats `keys()` yields on all
    ranks, as its bits (radix.find), how many entries equal to it are among the `rank`
    smallest, and how many equal it in all."""
    trace.note("radix")
    return find(keys, rank, torch.finfo(work).bits, group)


def equal_count(
    piece: Piece, buffers: Buffers, bound: float, span: tuple[int, int] | None = None
) -> int:
    """How many competing entries of `piece` (in its flat `span`) equal `bound` (NaN: are
    NaN)."""
    scores, alive = piece.source()
    if span is not None:
        scores = scores.detach().reshape(-1)[span[0] : span[1]]
        alive = None if alive is None else alive.reshape(-1)[span[0] : span[1]]
    count = 0
    for _, m, live in magnitudes(scores, alive, buffers):
        if math.isnan(bound):  # NaN ranks last: NaN of any bits are its ties
            equal = torch.ne(m, m, out=buffers.a[: m.numel()])
        else:
            equal = torch.eq(m, bound, out=buffers.a[: m.numel()])
        count += ones(equal if live is None else equal.mul_(live))
    return count
