"""The one pass: every selection written at once around the sampled guess, the few entries
in between gathered and then settled.

Entries below the lower bound are chosen, those above the upper one are not,
and those in between are gathered (positions and magnitudes, all sources in
order, in one buffer) and ranked apart. The pass is the C loop (native.split,
which marks the entries in between below the best guess as chosen at once, and
native.settle then rewrites only those the guess got wrong) where it is built,
else tensor operations a chunk at a time; the two give the same selections, and
can write scores x mask alongside (`products`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from prunekit.select import native, plan, trace, tuning
from prunekit.select.chunks import Chunks, ones, write
from prunekit.select.native import Gather
from prunekit.select.portable import select_sorted
from prunekit.select.sources import Count, count_of

__all__ = ["Gather", "Gathered", "mark_between"]


@dataclass
class Part:
    """What the one pass found in one chunk (its entries in between go to a Gather)."""

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


def mark_between(
    chunks: Chunks,
    k: Count,
    bounds: tuple[float, float, float],
    keep_dtype: torch.dtype | None,
    products: Sequence[Tensor | None] | None = None,
) -> list[Tensor] | None:
    """The selections in one pass, if the k-th smallest magnitude lies in [lower, upper]
    (`bounds`: lower, mid, upper).

    None when the guess was wrong or too many entries fall in between.
    """
    held = _mark_between(chunks, k, bounds, keep_dtype, products)
    trace.note("one pass" if held is not None else "one pass missed")
    return held


def _mark_between(
    chunks: Chunks,
    k: Count,
    bounds: tuple[float, float, float],
    keep_dtype: torch.dtype | None,
    products: Sequence[Tensor | None] | None,
) -> list[Tensor] | None:
    hit = keep_dtype is None
    out_dtype = torch.bool if keep_dtype is None else keep_dtype
    most = plan.budget(chunks.plan)
    # Room for the budget and one more chunk: a chunk is gathered before it is counted.
    extra = min(max(chunks.step, chunks.chunk), chunks.plan.largest)
    gather = Gather(most + extra, chunks.plan.work)
    gathered: list[Gathered] = []
    below = counted = 0
    peaks: list[Tensor | bool] | None = []  # per chunk: finite? (None: not known)
    for index, (scores, alive) in enumerate(source() for source in chunks.sources):
        out = torch.empty(scores.numel(), dtype=out_dtype)
        product = None if products is None else products[index]
        first = gather.size
        for part in split(chunks, scores, alive, out, bounds, hit, product, gather):
            counted += part.competing
            below += part.below
            if part.finite is None:
                peaks = None
            elif peaks is not None:
                peaks.append(part.finite)
            if gather.size > most:
                return None
        where = gather.positions[first : gather.size]
        # Scores are kept only where a product needs them: sources may make theirs anew.
        held = None if product is None else scores.detach().reshape(-1)
        gathered.append(Gathered(out, product, held, where))
    chunks.counted = counted
    if peaks:
        chunks.finite = all(bool(peak) for peak in peaks)
    rank = count_of(k, counted) - below
    values_all = gather.values[: gather.size]
    if not 0 < rank <= values_all.numel():
        return None
    trace.note("settle")
    if native.makes(out_dtype):
        native.settle(gathered, values_all, rank, hit, bounds[1])
    else:
        _settle_tensors(gathered, values_all, rank, hit)
    return [entry.out for entry in gathered]


def split(
    chunks: Chunks,
    scores: Tensor,
    alive: Tensor | None,
    out: Tensor,
    bounds: tuple[float, float, float],
    hit: bool,
    product: Tensor | None,
    gather: Gather,
) -> Iterator[Part]:
    """The one pass over one source, chunk by chunk, given (lower, mid, upper): writes
    the entries chosen into `out` (`hit` where chosen, else 1 - `hit`), and scores x
    out into `product` if given; gathers the entries between lower and upper into
    `gather` and yields counts per chunk.

    Chosen are the entries below mid in the C loop, below lower in the tensor operations:
    native.settle and _settle_tensors finish each.
    """
    if not native.makes(out.dtype):
        yield from _split_tensors(chunks, scores, alive, out, bounds, hit, product, gather)
        return
    flat = scores.reshape(-1)
    # The C loop writes the product from the scores' bits: scores of the mask's dtype,
    # contiguous.
    fused = product if product is not None and native.bits_of(flat, out) else None
    one = native.one_bits(out.dtype)
    chosen, other = (one, 0) if hit else (0, one)
    for start, part, flags in chunks.read(scores, alive, chunks.step):
        n = part.numel()
        if part.dtype not in (torch.float32, torch.float64):
            part = chunks.wide[:n].copy_(part)  # 16-bit: widened (exactly)
        if flags is not None and not (native.makes(flags.dtype) and flags.is_contiguous()):
            flags = torch.eq(flags, 1, out=chunks.live[:n])  # the C loop reads 1s as bits
        piece = out[start : start + n]
        into = None if fused is None else (flat[start : start + n], fused[start : start + n])
        competing, below, finite = native.split(
            part, flags, piece, (chosen, other), bounds, gather, start, into
        )
        if product is not None and fused is None:
            torch.mul(flat[start : start + n].detach(), piece, out=product[start : start + n])
        yield Part(below, competing, finite)


def _split_tensors(
    chunks: Chunks,
    scores: Tensor,
    alive: Tensor | None,
    out: Tensor,
    bounds: tuple[float, float, float],
    hit: bool,
    product: Tensor | None,
    gather: Gather,
) -> Iterator[Part]:
    """`split` as tensor operations, a few per chunk (choosing below the lower bound)."""
    lower, _, upper = bounds
    flat = scores.reshape(-1)
    for start, piece, magnitudes, competing in chunks.magnitudes(scores, alive, out):
        n = piece.numel()
        # NaN stands for the entries that do not compete, so only without flags does
        # the chunk's largest magnitude say whether all are finite.
        finite = magnitudes.amax().isfinite() if alive is None else None
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
        yield Part(below, competing, finite)


def _settle_tensors(gathered: list[Gathered], values: Tensor, rank: int, hit: bool) -> None:
    """Choose the `rank` smallest of the entries in between (all sources in order)."""
    # many in between: the fast path again (a cycle: choose calls this module)
    from prunekit.select.choose import smallest_k  # noqa: PLC0415

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
