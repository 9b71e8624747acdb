"""The count pass, a source a chunk at a time, and the settling of the marks it wrote.

The pass counts the entries below the lower bound and gathers those in between
(positions and magnitudes, all sources in order, in one buffer). Where the
caller wants the marks at once, it also writes each selection around the guess:
entries below the lower bound are chosen, those above the upper one are not,
and `settle` then ranks the gathered ones. The pass is the C loop (native.split,
which marks the entries in between below the best guess as chosen at once, and
native.settle then rewrites only those the guess got wrong) where it is built,
else tensor operations a chunk at a time; the two give the same selections, and
can write scores x mask alongside (`products`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from prunekit.select import native, trace, tuning
from prunekit.select.chunks import Chunks, ones, write
from prunekit.select.native import Gather
from prunekit.select.ties import select_sorted

__all__ = ["CountPass", "Gather", "Gathered", "Part", "settle", "split"]


@dataclass(frozen=True)
class CountPass:
    """How one count pass over a source marks and gathers.

    Attributes:
        bounds: (lower, mid, upper): entries below lower are chosen, those above upper not,
            those in between gathered (the C loop marks those below mid as chosen at once).
        hit: the mark of an entry chosen (1 - `hit` elsewhere).
        gather: where the entries in between go, with their positions.
        product: where scores x selection is written, if wanted.
        window: `out` is only a chunk's room, reused (the marks are not wanted: the
            threshold is not known yet).
    """

    bounds: tuple[float, float, float]
    hit: bool
    gather: Gather
    product: Tensor | None = None
    window: bool = False


@dataclass
class Part:
    """What the one pass found in one chunk (its entries in between go to a Gather)."""

    start: int  # where the chunk starts in its source
    size: int  # its entries
    below: int  # competing entries below the lower bound
    competing: int
    finite: Tensor | bool | None  # every score of the chunk finite (None: not known)


@dataclass
class Gathered:
    """One source after the one pass: its selection, its product and flat scores (if a
    product is asked) and the positions of its entries in between."""

    out: Tensor
    product: Tensor | None
    scores: Tensor | None
    where: Tensor


def settle(
    gathered: list[Gathered],
    values: Tensor,
    rank: int,
    hit: bool,
    mid: float,
    signed: bool,
    smallest: Callable[[Tensor, int], Tensor],
) -> None:
    """Choose the `rank` smallest of the entries the count pass gathered (all sources in
    order, their magnitudes `values`, or with `signed` their scores), each source's
    selection already marked around the guess `mid`: through the C loop where it makes
    the selections' dtype, else tensor operations, with `smallest` (the whole selection)
    ranking them when a sample would not hold them all."""
    trace.note("settle")
    if native.makes(gathered[0].out.dtype):
        native.settle(gathered, values, rank, hit, mid, signed)
    else:
        _settle_tensors(gathered, values, rank, hit, smallest)


def split(
    chunks: Chunks, scores: Tensor, alive: Tensor | None, out: Tensor, sweep: CountPass
) -> Iterator[Part]:
    """The count pass over one source, chunk by chunk, as `sweep` says: writes the entries
    chosen into `out`, and scores x out into its product if given; gathers the entries
    between its lower and upper bounds and yields counts per chunk.

    Chosen are the entries below mid in the C loop, below lower in the tensor operations:
    `settle` finishes either.
    """
    if not native.makes(out.dtype):
        yield from _split_tensors(chunks, scores, alive, out, sweep)
        return
    flat = scores.reshape(-1)
    # The C loop writes the product from the scores' bits: scores of the mask's dtype,
    # contiguous.
    product = sweep.product
    fused = product if product is not None and native.bits_of(flat, out) else None
    one = native.one_bits(out.dtype)
    marks = native.Marks(*((one, 0) if sweep.hit else (0, one)), sweep.bounds, chunks.plan.signed)
    for start, part, flags in chunks.read(scores, alive, chunks.step):
        n = part.numel()
        if part.dtype not in (torch.float32, torch.float64):
            part = chunks.wide[:n].copy_(part)  # 16-bit: widened (exactly)
        if flags is not None and not (native.makes(flags.dtype) and flags.is_contiguous()):
            flags = torch.eq(flags, 1, out=chunks.live[:n])  # the C loop reads 1s as bits
        piece = out[:n] if sweep.window else out[start : start + n]
        into = None if fused is None else (flat[start : start + n], fused[start : start + n])
        competing, below, finite = native.split(part, flags, piece, marks, sweep.gather, start,
                                                into)  # fmt: skip
        if product is not None and fused is None:
            torch.mul(flat[start : start + n].detach(), piece, out=product[start : start + n])
        yield Part(start, n, below, competing, finite)


def _split_tensors(
    chunks: Chunks, scores: Tensor, alive: Tensor | None, out: Tensor, sweep: CountPass
) -> Iterator[Part]:
    """`split` as tensor operations, a few per chunk (choosing below the lower bound)."""
    lower, _, upper = sweep.bounds
    hit, product, gather = sweep.hit, sweep.product, sweep.gather
    flat = scores.reshape(-1)
    for start, piece, magnitudes, competing in chunks.magnitudes(scores, alive, out, sweep.window):
        n = piece.numel()
        # NaN stands for the entries that do not compete, so only without flags does
        # the chunk's largest magnitude (signed: its least and greatest score) say
        # whether all are finite.
        finite = None
        if alive is None:
            finite = magnitudes.amax().isfinite()
            if chunks.plan.signed:
                finite = finite & magnitudes.amin().isfinite()
        # Compares into floats: several times faster here than into bool.
        low = torch.lt(magnitudes, lower, out=chunks.low[:n])
        between = torch.le(magnitudes, upper, out=chunks.high[:n]).sub_(low)
        below = ones(low)
        where = chunks.between[:n].copy_(between).nonzero().reshape(-1)
        values = magnitudes.index_select(0, where)
        write(piece, low, hit)
        if product is not None:
            torch.mul(flat[start : start + n].detach(), piece, out=product[start : start + n])
        gather.append(where.add_(start), values)
        yield Part(start, n, below, competing, finite)


def _settle_tensors(
    gathered: list[Gathered],
    values: Tensor,
    rank: int,
    hit: bool,
    smallest_k: Callable[[Tensor, int], Tensor],
) -> None:
    """Choose the `rank` smallest of the entries in between (all sources in order); many
    in between take the fast path again through `smallest_k`."""
    small = values.numel() <= tuning.get().sample  # a sample would hold them all: no guess
    picked = select_sorted(values, rank) if small else smallest_k(values, rank)
    offset = 0
    for entry in gathered:
        chosen = entry.where[picked[offset : offset + entry.where.numel()]]
        offset += entry.where.numel()
        entry.out[chosen] = hit
        if entry.product is not None:
            assert entry.scores is not None
            entry.product[chosen] = entry.scores[chosen] * entry.out[chosen]
