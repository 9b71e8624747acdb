"""Selection kernels: which k entries of one or many score tensors are the smallest.

Every method ranks through here, so the rule is the same everywhere: exactly
k entries are chosen, and among equal scores the lower flat index goes first
(across several tensors: the earlier tensor first, then the lower index).

The fast path never sorts. Scores are read a chunk at a time into small
buffers reused throughout, so the work memory (beyond the selections
returned) is a few MiB plus the entries gathered below, never more than the
largest tensor, and no tensor is concatenated.
An evenly spaced sample gives two magnitudes that almost surely enclose the
k-th smallest; one pass marks the entries below the lower one and gathers
the few in between, which are ranked apart (_mark_between). When the guess
misses, histograms take over (_find_cut, _mark): a float's bits, read as
16-bit digits from the top, order non-negative floats the same way as their
values, so a ``bincount`` of the top digit finds the bucket that holds the
k-th value, the next digits are counted only inside that bucket, and a last
pass compares every magnitude with the k-th one. Ties are resolved only
where they straddle the k-th value. Counts are Python ints, so totals above
2**31 are fine.
The fast path covers torch tensors of float16, bfloat16, float32 and
float64 holding more than 2**14 entries in all; anything else (other
frameworks, negative scores, small inputs) takes a portable path built from
plain tensor methods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from prunekit._backend import namespace

__all__ = ["Source", "alive_count", "smallest_k", "smallest_k_many"]

Source = Callable[[], tuple[Tensor, Tensor | None]]
"""Returns one tensor's scores and which of them compete: True or 1 there (None: all do).

The flags may be a bool tensor or a mask of any dtype (entries equal to 1 compete).

Called once per pass, so a source may recompute its scores instead of holding them.
"""

_BITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32, torch.float64: 64}
_KEYS = {16: torch.int16, 32: torch.int32, 64: torch.int64}
_TOP_BINS = 1 << 15  # the top digit without its sign bit
_LOW_BINS = 1 << 16
_DEAD = 0x7FFF  # a NaN pattern in the top digit of every supported format
_CHUNK = 1 << 18  # entries read at a time: the work buffers stay in cache (L2)
_SMALL = 1 << 14  # below this many entries a few plain calls beat the passes
_SAMPLE = 1 << 17  # entries sampled to guess where the k-th value lies
_SPREAD = 6.0  # how many standard deviations of the guess the bounds leave either side


def smallest_k(
    scores: Tensor, k: int, alive: Tensor | None = None, *, magnitude: bool = False
) -> Tensor:
    """Return a bool tensor shaped like `scores`, True at its `k` smallest entries.

    Only entries where `alive` is True or 1 compete (all of them when it is None).
    With `magnitude`, entries rank by absolute value. Ties go to the lower
    flat index. `scores` must hold no NaN among the competing entries.
    """
    flat = scores.reshape(-1)
    live = None if alive is None else alive.reshape(-1)
    chosen = next(smallest_k_many([lambda: (flat, live)], k, magnitude=magnitude))
    return chosen.reshape(scores.shape)


def smallest_k_many(
    sources: Sequence[Source],
    k: int,
    *,
    magnitude: bool = False,
    keep_dtype: torch.dtype | None = None,
    total: int | None = None,
) -> Iterator[Tensor]:
    """Yield, for each source in turn, a flat bool tensor marking its share of the `k` smallest.

    The scores of all sources rank together as if concatenated in order, but
    are never concatenated: each source is called once per pass and dropped.
    When the sampled guess holds, all selections are made in one pass and held
    until yielded; otherwise each is made when asked for. With `keep_dtype`, each yields
    the complement instead, as 1s (kept, or not competing) and 0s (chosen) of
    that dtype: a mask, made without an intermediate bool tensor. `total`, if
    the caller knows it, is how many entries compete in all.
    """
    if total is None:
        total = sum(alive_count(*source()) for source in sources)
    if not 0 <= k <= total:
        raise ValueError(f"smallest_k: k={k} is outside [0, {total}], the entries that compete")
    if k == 0 or k == total:
        chosen: Iterator[Tensor] = (_filled(*source(), everything=k > 0) for source in sources)
    else:
        plan = _fast_plan(sources, magnitude)
        if plan is not None and plan.size > _SMALL:
            chunks = _Chunks(sources, plan)
            bounds = _guess(chunks, k, total)
            done = None if bounds is None else _mark_between(chunks, k, *bounds, keep_dtype)
            if done is not None:
                return iter(done)
            return _mark(chunks, _find_cut(chunks, k), keep_dtype)
        chosen = iter(_portable(sources, k, magnitude))
    if keep_dtype is None:
        return chosen
    return ((~pick).to(keep_dtype) for pick in chosen)


@dataclass(frozen=True)
class _Plan:
    """How the fast path reads scores: their common float dtype and its bit width."""

    dtype: torch.dtype
    bits: int  # 16, 32 or 64
    size: int  # entries in all sources
    largest: int  # entries in the largest source

    @property
    def key(self) -> torch.dtype:
        """The integer dtype of the same width, whose bits are viewed as keys."""
        return _KEYS[self.bits]


@dataclass
class _Cut:
    """The k-th smallest key, how many entries hold it, and how many of those are chosen."""

    key: int
    equal: int
    take: int


def alive_count(scores: Tensor, alive: Tensor | None) -> int:
    """How many entries of `scores` compete: those where `alive` is 1/True (all for None)."""
    if alive is None:
        return scores.numel()
    if alive.dtype == namespace(alive).bool:
        return int(alive.count_nonzero())
    if not isinstance(alive, Tensor):
        return int((alive == 1).count_nonzero())
    flat = alive.reshape(-1)
    flags = torch.empty(min(_CHUNK, flat.numel()), dtype=torch.bool)
    count = 0
    for start in range(0, flat.numel(), _CHUNK):
        part = flat[start : start + _CHUNK]
        count += int(torch.eq(part, 1, out=flags[: part.numel()]).count_nonzero())
    return count


def _filled(scores: Tensor, alive: Tensor | None, everything: bool) -> Tensor:
    flat = scores.reshape(-1)
    ns = namespace(scores)
    if alive is not None:
        live = alive.reshape(-1)
        live = live.clone() if live.dtype == ns.bool else live == 1
        return live if everything else live & False
    fill = ns.ones if everything else ns.zeros
    filled: Tensor = fill(flat.shape, dtype=ns.bool, device=flat.device)
    return filled


def _fast_plan(sources: Sequence[Source], magnitude: bool) -> _Plan | None:
    """How to read the scores, or None when the fast path does not apply."""
    dtype: torch.dtype | None = None
    size = largest = 0
    for source in sources:
        scores, _ = source()
        if not isinstance(scores, Tensor) or scores.dtype not in _BITS:
            return None
        if not magnitude and scores.numel() and bool(scores.min() < 0):
            return None
        size += scores.numel()
        largest = max(largest, scores.numel())
        dtype = scores.dtype if dtype is None else torch.promote_types(dtype, scores.dtype)
    assert dtype is not None
    return _Plan(dtype, _BITS[dtype], size, largest)


def _guess(chunks: _Chunks, k: int, total: int) -> tuple[Tensor, Tensor] | None:
    """Magnitudes that very likely enclose the k-th smallest, from an evenly spaced sample.

    The spacing is prime to 2, 3, 5 and 7, so rows, columns and kernel positions
    are all sampled. None when the sample is too small to say much.
    """
    plan = chunks.plan
    stride = max(1, plan.size // _SAMPLE)
    while math.gcd(stride, 210) != 1:
        stride += 1
    parts = []
    for source in chunks.sources:
        scores, alive = source()
        part = scores.reshape(-1)[::stride].to(plan.dtype).abs()
        if alive is not None:
            part = part[alive.reshape(-1)[::stride] == 1]
        parts.append(part)
    sample = torch.cat(parts)
    size = sample.numel()
    if size < _SAMPLE // 8:
        return None
    share = k / total
    margin = _SPREAD * math.sqrt(share * (1 - share) / size) + 2 / size
    low = math.floor((share - margin) * size)
    high = math.ceil((share + margin) * size)
    zero = torch.zeros((), dtype=plan.dtype)
    lower = sample.kthvalue(low)[0] if low >= 1 else zero
    upper = sample.kthvalue(high)[0] if high <= size else zero + math.inf
    return lower, upper


def _mark_between(
    chunks: _Chunks, k: int, lower: Tensor, upper: Tensor, keep_dtype: torch.dtype | None
) -> list[Tensor] | None:
    """The selections in one pass, if the k-th smallest magnitude lies in [lower, upper].

    Entries below `lower` are chosen, those above `upper` are not, and those in
    between are gathered and ranked apart (they are few). None when the guess
    was wrong or too many entries fall in between.
    """
    plan = chunks.plan
    hit = keep_dtype is None
    out_dtype = torch.bool if hit else keep_dtype
    # Those in between (a position and a value each) may take no more memory than the
    # largest tensor, and are at most 1/16 of all: ranking them is a smaller problem.
    item = torch.finfo(plan.dtype).bits // 8
    budget = min(plan.size // 16, plan.largest * item // (8 + item))
    outs, places, values = [], [], []
    below = offset = 0
    for scores, alive in (source() for source in chunks.sources):
        out = torch.empty(scores.numel(), dtype=out_dtype)
        for start, piece, magnitudes, dead in chunks.magnitudes(scores, alive, out):
            n = piece.numel()
            low = torch.lt(magnitudes, lower, out=piece if hit else chunks.flags[:n])
            between = torch.le(magnitudes, upper, out=chunks.between[:n])
            if dead is not None:
                live = torch.logical_not(dead, out=dead)
                low &= live
                between &= live
            between ^= low  # lower <= magnitude <= upper, alive
            below += int(low.count_nonzero())
            where = between.nonzero().reshape(-1)
            budget -= where.numel()
            if budget < 0:
                return None
            places.append(where + (offset + start))
            values.append(magnitudes[where])
            if not hit:
                if dead is None and magnitudes is piece:
                    torch.ge(piece, lower, out=piece)
                else:
                    piece.copy_(low.logical_not_())
        outs.append(out)
        offset += scores.numel()
    rank = k - below
    values_all = torch.cat(values)
    if not 0 < rank <= values_all.numel():
        return None
    chosen = torch.cat(places)[smallest_k(values_all, rank)]
    offset = 0
    for out in outs:
        inside = chosen[(chosen >= offset) & (chosen < offset + out.numel())]
        out[inside - offset] = hit
        offset += out.numel()
    return outs


class _Chunks:
    """Reads the sources a chunk at a time into work buffers reused from chunk to chunk.

    Working in chunks keeps every intermediate small (and in cache): only the
    selections themselves take memory the size of a tensor.
    """

    def __init__(self, sources: Sequence[Source], plan: _Plan) -> None:
        self.sources = sources
        self.plan = plan
        size = min(_CHUNK, plan.largest)
        self.top = torch.empty(size, dtype=torch.int16)
        self.dead = torch.empty(size, dtype=torch.bool)
        self.all_bits = torch.empty(size, dtype=torch.int8)  # -1 where dead, else 0
        self.flags = torch.empty(size, dtype=torch.bool)
        self.between = torch.empty(size, dtype=torch.bool)
        self.values = torch.empty(size, dtype=plan.dtype)

    def read(
        self, scores: Tensor, alive: Tensor | None
    ) -> Iterator[tuple[int, Tensor, Tensor | None]]:
        """(start, scores, dead flags or None) for each chunk of one source's scores."""
        flat = scores.reshape(-1)
        live = None if alive is None else alive.reshape(-1)
        for start in range(0, flat.numel(), _CHUNK):
            part = flat[start : start + _CHUNK]
            if part.dtype != self.plan.dtype:
                part = part.to(self.plan.dtype)
            dead = None
            if live is not None:
                flags = live[start : start + _CHUNK]
                dead = self.dead[: part.numel()]
                if flags.dtype == torch.bool:
                    torch.logical_not(flags, out=dead)
                else:
                    torch.ne(flags, 1, out=dead)
            yield start, part.contiguous(), dead

    def magnitudes(
        self, scores: Tensor, alive: Tensor | None, out: Tensor
    ) -> Iterator[tuple[int, Tensor, Tensor, Tensor | None]]:
        """(start, the chunk's slice of `out`, its |scores|, dead flags or None) per chunk.

        The magnitudes are written into the slice of `out` itself when `out` has the
        scores' dtype (callers then overwrite them with the selection), else into a buffer.
        """
        for start, part, dead in self.read(scores, alive):
            piece = out[start : start + part.numel()]
            magnitudes = piece if out.dtype == self.plan.dtype else self.values[: part.numel()]
            torch.abs(part, out=magnitudes)
            yield start, piece, magnitudes, dead

    def tops(self, index: int) -> Iterator[tuple[int, Tensor, Tensor]]:
        """(start, scores, top digits) per chunk: the top 16 bits without the sign,
        _DEAD where the entry does not compete."""
        step = self.plan.bits // 16
        for start, part, dead in self.read(*self.sources[index]()):
            digits = part.view(torch.int16)[step - 1 :: step]  # little-endian: top digit last
            top = self.top[: part.numel()]
            if dead is not None:
                # All bits set where dead (-1 as int8 widens to 0xFFFF), then the sign
                # cleared: _DEAD. Branch-free, unlike masked_fill_ on scattered flags.
                ones = torch.neg(dead.view(torch.int8), out=self.all_bits[: part.numel()])
                torch.bitwise_or(digits, ones, out=top)
                digits = top
            torch.bitwise_and(digits, 0x7FFF, out=top)
            yield start, part, top


def _find_cut(chunks: _Chunks, k: int) -> _Cut:
    """Locate the k-th smallest key, 16 bits at a time, with histograms only."""
    count = len(chunks.sources)
    hist = torch.zeros(_TOP_BINS, dtype=torch.int64)
    for i in range(count):
        for _, _, top in chunks.tops(i):
            hist += torch.bincount(top, minlength=_TOP_BINS)
    digit, rank, equal = _pick(hist, k)
    prefix = digit
    sign_off = (1 << (chunks.plan.bits - 1)) - 1
    for shift in range(chunks.plan.bits - 32, -1, -16):
        hist = torch.zeros(_LOW_BINS, dtype=torch.int64)
        for i in range(count):
            for _, part, top in chunks.tops(i):
                bucket = torch.eq(top, digit, out=chunks.flags[: top.numel()])
                keys = part.view(chunks.plan.key)[bucket] & sign_off
                keys = keys[(keys >> (shift + 16)) == prefix]
                hist += torch.bincount((keys >> shift) & 0xFFFF, minlength=_LOW_BINS)
        low, rank, equal = _pick(hist, rank)
        prefix = (prefix << 16) | low
    return _Cut(prefix, equal, rank)


def _pick(hist: Tensor, rank: int) -> tuple[int, int, int]:
    """The bin holding the `rank`-th entry (1-based), that entry's rank within the bin,
    and the bin's count."""
    cum = hist.cumsum(0)
    index = int((cum < rank).count_nonzero())
    below = int(cum[index - 1]) if index else 0
    return index, rank - below, int(hist[index])


def _mark(chunks: _Chunks, cut: _Cut, keep_dtype: torch.dtype | None) -> Iterator[Tensor]:
    """Yield each source's selection: keys below the cut, then the first `cut.take` equal ones.

    Compares magnitudes as floats against the float whose bits are the cut: for
    non-negative floats that is the same order as their bits.
    """
    plan = chunks.plan
    bound = torch.tensor([cut.key], dtype=plan.key).view(plan.dtype)[0]
    hit = keep_dtype is None
    out_dtype = torch.bool if hit else keep_dtype
    # With no ties at the cut the chosen are exactly the keys up to it.
    take = 0 if cut.take == cut.equal else cut.take
    below = torch.le if take == 0 else torch.lt
    above = torch.gt if take == 0 else torch.ge
    for i in range(len(chunks.sources)):
        scores, alive = chunks.sources[i]()
        out = torch.empty(scores.numel(), dtype=out_dtype)
        for start, piece, magnitudes, dead in chunks.magnitudes(scores, alive, out):
            n = piece.numel()
            equal = None
            if take:
                flags = torch.eq(magnitudes, bound, out=chunks.flags[:n])
                if dead is not None:
                    flags &= ~dead
                where = flags.nonzero().reshape(-1)[:take]
                equal = where + start
                take -= where.numel()
            if dead is None:
                (below if hit else above)(magnitudes, bound, out=piece)
            elif hit:
                below(magnitudes, bound, out=piece)
                piece &= ~dead
            else:
                # Through bool, then one copy: cheaper than masked_fill_ on scattered flags.
                flags = above(magnitudes, bound, out=chunks.flags[:n])
                piece.copy_(flags.logical_or_(dead))
            if equal is not None:
                out[equal] = hit
        yield out


def _portable(sources: Sequence[Source], k: int, magnitude: bool) -> list[Tensor]:
    """Reference-style selection with plain tensor methods: gather, kthvalue, compare."""
    parts, lives = [], []
    for source in sources:
        scores, alive = source()
        flat = scores.reshape(-1)
        parts.append(flat.abs() if magnitude else flat)
        live = None if alive is None else alive.reshape(-1)
        if live is not None and live.dtype != namespace(live).bool:
            live = live == 1
        lives.append(live)
    ns = namespace(parts[0])
    flat = ns.cat(parts) if len(parts) > 1 else parts[0]
    if any(live is not None for live in lives):
        live = ns.cat(
            [
                ns.ones_like(p, dtype=ns.bool) if a is None else a
                for p, a in zip(parts, lives, strict=True)
            ]
        )
        index = live.nonzero().reshape(-1)
        picked = _select_sorted(flat[index], k)
        chosen = ns.zeros(flat.shape, dtype=ns.bool, device=flat.device)
        chosen[index] = picked
    else:
        chosen = _select_sorted(flat, k)
    out, offset = [], 0
    for part in parts:
        out.append(chosen[offset : offset + part.numel()])
        offset += part.numel()
    return out


def _select_sorted(flat: Tensor, k: int) -> Tensor:
    """The k smallest of a 1-D tensor via kthvalue, ties by lowest index."""
    threshold = flat.kthvalue(k)[0]
    chosen = flat < threshold
    missing = k - int(chosen.sum())
    at_threshold = flat == threshold
    if int(at_threshold.sum()) > missing:
        rank = at_threshold.cumsum(0)
        at_threshold = at_threshold & (rank <= missing)
    result: Tensor = chosen | at_threshold
    return result
