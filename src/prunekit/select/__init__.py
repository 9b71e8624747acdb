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
the few in between, which are ranked apart (_mark_between). That pass is a
C loop (_native.c, split among torch's threads, which marks entries below
the sample's best guess and then settles the gathered ones) where it was
built, else tensor operations a chunk at a time; the two give the same
selections, and can write scores x mask alongside (`products`). When the guess
misses, histograms take over (_find_cut, _mark): a float's bits, read as
16-bit digits from the top, order non-negative floats the same way as their
values, so a ``bincount`` of the top digit finds the bucket that holds the
k-th value, the next digits are counted only inside that bucket, and a last
pass compares every magnitude with the k-th one. Ties are resolved only
where they straddle the k-th value. Counts are Python ints, so totals above
2**31 are fine.
In the tensor operations, comparisons write 0/1 floats (several times faster
here than bools, and summed to count), and entries that do not compete read
as NaN, which every comparison leaves out: no branch, no masked write.
The fast path covers CPU torch tensors of float16, bfloat16, float32 and
float64 holding more than 2**16 entries in all (the sampled guess from 2**18
on); anything else (other frameworks and devices, negative scores, small
inputs) takes a portable path built from plain tensor methods.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor

from prunekit.core.backend import namespace

_native: ModuleType | None
try:  # the one pass as a C loop (_native.c); without it, tensor operations do the same
    from prunekit.select import _native
except ImportError:  # pragma: no cover - not built here
    _native = None

__all__ = ["NotFinite", "Source", "alive_count", "all_finite", "smallest_k", "smallest_k_many"]

Count = int | Callable[[int], int]
"""How many entries to choose: a number, or a function of how many compete."""

Source = Callable[[], tuple[Tensor, Tensor | None]]
"""Returns one tensor's scores and which of them compete: True or 1 there (None: all do).

The flags may be a bool tensor or a mask of any dtype (entries equal to 1 compete).

Called about once per pass, so a source may recompute its scores instead of holding them.
"""

_BITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32, torch.float64: 64}
_KEYS = {16: torch.int16, 32: torch.int32, 64: torch.int64}
_TOP_BINS = 1 << 15  # the top digit without its sign bit
_LOW_BINS = 1 << 16
_DEAD = 0x7FFF  # top digit, sign cleared, of entries that do not compete: NaN in every format
_CHUNK = 1 << 18  # entries read at a time: the work buffers stay in cache (L2)
_STEP = 1 << 20  # entries per call of the C loop, which blocks them itself (fewer calls: faster)
_SMALL = 1 << 16  # up to this many entries a few plain calls beat the passes (measured)
_TINY = 1 << 10  # up to this many, one stable sort beats kthvalue and its compares
_SAMPLE = 1 << 17  # entries sampled to guess where the k-th value lies
_GUESS = 1 << 18  # from this many entries on, a sample is a fraction of them: worth taking
_SPREAD = 6.0  # how many standard deviations of the guess the bounds leave either side
_ONE = torch.ones(())  # 1 - chosen = kept
_PART = 1 << 16  # the C loop splits a chunk among threads in parts at least this large
_threads = torch.get_num_threads  # how many threads the C loop may use: as many as torch


class NotFinite(ValueError):
    """Raised, when asked, if a score is NaN or infinite."""


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
    k: Count,
    *,
    magnitude: bool = False,
    keep_dtype: torch.dtype | None = None,
    total: int | None = None,
    finite: bool = False,
    products: Sequence[Tensor | None] | None = None,
) -> Iterator[Tensor]:
    """Yield, for each source in turn, a flat bool tensor marking its share of the `k` smallest.

    The scores of all sources rank together as if concatenated in order, but
    are never concatenated: each source is called once per pass and dropped.
    When the sampled guess holds, all selections are made in one pass and held
    until yielded; otherwise each is made when asked for. With `keep_dtype`, each yields
    the complement instead, as 1s (kept, or not competing) and 0s (chosen) of
    that dtype: a mask, made without an intermediate bool tensor. `total`, if
    the caller knows it, is how many entries compete in all. `k` may be a
    function of that count: the one pass then counts the competing entries
    itself instead of reading them beforehand. The function may be called with
    estimates of the count too, and raise ValueError to refuse one: a refused
    estimate costs speed only, a refused count is raised. With `finite`, raises
    NotFinite if a score is NaN or infinite, after any error about `k` and before
    yielding anything (all scores count here, competing or not).

    `products` (with `keep_dtype`) may hold, per source, a flat tensor of that dtype
    into which the source's scores times its mask are written by the time the mask
    is yielded: in the one pass, as the mask is written, while the scores are read
    anyway. A source given a product must have no flags and finite scores.
    """
    if products is not None:
        _check_products(sources, products, keep_dtype)
    plan = _fast_plan(sources, magnitude)
    if plan is None and total is None:
        total = _competing(sources)
    count = None if total is None else _resolve(k, total)  # a bad k is named before bad scores
    chunks = done = None
    if plan is not None and (count is None or count not in (0, total)):  # a selection to make
        chunks = _Chunks(sources, plan)
        bounds = _guess(chunks, k, total)
        done = None if bounds is None else _mark_between(chunks, k, *bounds, keep_dtype, products)
        if total is None:
            total = _competing(sources) if chunks.counted is None else chunks.counted
            count = _resolve(k, total)
    assert total is not None and count is not None
    if finite and not (chunks is not None and chunks.finite):
        _refuse_non_finite(sources)  # not read in full, or not finite: the exact check says
    if done is not None:
        return iter(done)
    if count in (0, total):
        masks = _all_or_none(sources, count > 0, keep_dtype)
    elif chunks is None:
        masks = _complement(iter(_portable(sources, count, magnitude)), keep_dtype)
    else:
        masks = _mark(chunks, _find_cut(chunks, count), keep_dtype)
    return masks if products is None else _multiplied(masks, sources, products)


def _check_flags(index: int, scores: Tensor, alive: Tensor | None) -> None:
    """Raise ValueError unless a source's flags (if any) are as many as its scores."""
    if alive is not None and alive.numel() != scores.numel():
        raise ValueError(
            f"smallest_k_many: source {index} has {scores.numel()} scores and "
            f"{alive.numel()} flags; expected one flag per score"
        )


def _check_products(
    sources: Sequence[Source], products: Sequence[Tensor | None], keep_dtype: torch.dtype | None
) -> None:
    """Raise ValueError unless each product is a contiguous tensor of `keep_dtype` with
    as many entries as its source's scores, on their device, not sharing their memory."""
    if keep_dtype is None:
        raise ValueError("smallest_k_many: products need keep_dtype, the masks' dtype")
    for index, (source, product) in enumerate(zip(sources, products, strict=True)):
        if product is None:
            continue
        scores = source()[0]
        n = scores.numel()
        if not (
            product.numel() == n
            and product.dtype == keep_dtype
            and product.is_contiguous()
            and product.device == scores.device
            and not (n and _same_memory(product, scores))
        ):
            raise ValueError(
                f"smallest_k_many: products[{index}] is {product.numel()} "
                f"{'contiguous' if product.is_contiguous() else 'strided'} {product.dtype} "
                f"entries on {product.device}; expected {n} contiguous {keep_dtype} entries "
                f"on {scores.device}, as its scores, and in memory of its own"
            )


def _same_memory(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors live in the same storage."""
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _multiplied(
    masks: Iterator[Tensor], sources: Sequence[Source], products: Sequence[Tensor | None]
) -> Iterator[Tensor]:
    """The masks as they are, each product written as its mask is yielded."""
    for mask, source, product in zip(masks, sources, products, strict=True):
        if product is not None:
            torch.mul(source()[0].detach().reshape(-1), mask, out=product)
        yield mask


def all_finite(t: Tensor) -> bool:
    """True if `t` holds no NaN or infinity. Read a chunk at a time: a finite sum clears
    a chunk quickly, isfinite() settles the rest; no temporary as large as `t`."""
    flat = t.reshape(-1)
    ns = namespace(flat)
    for start in range(0, flat.numel(), _CHUNK):
        part = flat[start : start + _CHUNK]
        if not math.isfinite(float(part.sum())) and not bool(ns.isfinite(part).all()):
            return False
    return True


def _refuse_non_finite(sources: Sequence[Source]) -> None:
    """Raise NotFinite if any score is NaN or infinite."""
    if not all(all_finite(source()[0]) for source in sources):
        raise NotFinite("the scores hold NaN or infinity, which cannot be ranked")


def _competing(sources: Sequence[Source]) -> int:
    return sum(alive_count(*source()) for source in sources)


def _all_or_none(
    sources: Sequence[Source], everything: bool, keep_dtype: torch.dtype | None
) -> Iterator[Tensor]:
    chosen = (_filled(*source(), everything=everything) for source in sources)
    return _complement(chosen, keep_dtype)


def _complement(chosen: Iterator[Tensor], keep_dtype: torch.dtype | None) -> Iterator[Tensor]:
    """The selections as they are, or with `keep_dtype` as masks (1 = not chosen)."""
    if keep_dtype is None:
        return chosen
    return ((~pick).to(keep_dtype) for pick in chosen)


def _resolve(k: Count, total: int) -> int:
    """The number of entries to choose among `total`, checked."""
    count = k(total) if callable(k) else k
    if not 0 <= count <= total:
        raise ValueError(f"smallest_k: k={count} is outside [0, {total}], the entries that compete")
    return count


@dataclass(frozen=True)
class _Plan:
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


@dataclass
class _Cut:
    """The k-th smallest key, how many entries hold it, and how many of those are chosen."""

    key: int
    equal: int
    take: int


@dataclass
class _Part:
    """What the one pass found in one chunk (its entries in between go to a _Gather)."""

    below: int  # competing entries below the lower bound
    competing: int
    finite: Tensor | bool | None  # every score of the chunk finite (None: not known)


class _Gather:
    """The entries the one pass gathers between the bounds, all sources in order: their
    positions (in their tensor) and magnitudes, written in place, never concatenated.

    Room for `capacity` entries; only the pages written are ever mapped.
    """

    def __init__(self, capacity: int, dtype: torch.dtype) -> None:
        self.positions = torch.empty(capacity, dtype=torch.int64)
        self.values = torch.empty(capacity, dtype=dtype)
        self.size = 0

    def append(self, positions: Tensor, values: Tensor) -> None:
        end = self.size + positions.numel()
        self.positions[self.size : end] = positions
        self.values[self.size : end] = values
        self.size = end


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
    """How to read the scores, or None when the fast path does not apply (or does not pay).
    Checks every source's flags on the way."""
    dtype: torch.dtype | None = None
    fast = True
    size = largest = 0
    for index, source in enumerate(sources):
        scores, alive = source()
        _check_flags(index, scores, alive)  # here, where every source is read anyway
        if not fast or not isinstance(scores, Tensor) or scores.dtype not in _BITS:
            fast = False
            continue
        if scores.device.type != "cpu":
            fast = False  # the chunk buffers live in CPU memory
            continue
        size += scores.numel()
        largest = max(largest, scores.numel())
        dtype = scores.dtype if dtype is None else torch.promote_types(dtype, scores.dtype)
    if not fast or dtype is None or size <= _SMALL:
        return None
    for source in () if magnitude else sources:
        scores, _ = source()
        if scores.numel() and bool(scores.min() < 0):
            return None
    return _Plan(dtype, _BITS[dtype], size, largest)


def _guess(chunks: _Chunks, k: Count, total: int | None) -> tuple[Tensor, Tensor, Tensor] | None:
    """Magnitudes that very likely enclose the k-th smallest, from an evenly spaced sample,
    and the sample's best guess of it in between.

    The spacing is prime to 2, 3, 5 and 7, so rows, columns and kernel positions
    are all sampled. None for fewer than _GUESS entries (a sample would be most of
    them) or a sample too small to say much. When the number competing is not
    known yet, the sample's share of them stands in for it, and the bounds widen
    to allow for that estimate's error.
    """
    plan = chunks.plan
    if plan.size < _GUESS:
        return None
    stride = max(1, plan.size // _SAMPLE)
    while math.gcd(stride, 210) != 1:
        stride += 1
    parts = []
    flagged = False
    seen = 0  # entries sampled, competing or not
    for source in chunks.sources:
        scores, alive = source()
        part = scores.detach().reshape(-1)[::stride].to(plan.dtype).abs()
        seen += part.numel()
        if alive is not None:
            part = part[alive.reshape(-1)[::stride] == 1]
            flagged = True
        parts.append(part)
    sample = torch.cat(parts)
    size = sample.numel()
    if size < _SAMPLE // 8:
        return None
    if total is None and not flagged:
        total = plan.size
    if total is not None:
        totals = [total]
    else:
        share = size / seen
        error = _SPREAD * math.sqrt(share * (1 - share) / seen) + 1 / seen
        totals = [max(1, round(plan.size * (share + side * error))) for side in (-1, 1)]
    try:
        shares = [_resolve(k, t) / t for t in totals]
    except ValueError:
        return None  # refused for an estimate: the exact count will say
    spread = max(p * (1 - p) for p in shares)
    margin = _SPREAD * math.sqrt(spread / size) + 2 / size
    low = math.floor((min(shares) - margin) * size)
    high = math.ceil((max(shares) + margin) * size)
    middle = min(max(round(sum(shares) / len(shares) * size), 1), size)
    zero = torch.zeros((), dtype=plan.dtype)
    lower = sample.kthvalue(low)[0] if low >= 1 else zero
    upper = sample.kthvalue(high)[0] if high <= size else zero + math.inf
    mid = sample.kthvalue(middle)[0].clamp(lower, upper)
    if not bool(lower <= upper):
        return None  # NaN in the sample: no guess (scores must be checked, not ranked)
    return lower, mid, upper


def _mark_between(
    chunks: _Chunks,
    k: Count,
    lower: Tensor,
    mid: Tensor,
    upper: Tensor,
    keep_dtype: torch.dtype | None,
    products: Sequence[Tensor | None] | None = None,
) -> list[Tensor] | None:
    """The selections in one pass, if the k-th smallest magnitude lies in [lower, upper].

    Entries below `lower` are chosen, those above `upper` are not, and those in
    between are gathered and ranked apart (they are few). None when the guess
    was wrong or too many entries fall in between. The C loop marks those in
    between below `mid` (the best guess) as chosen at once, and settles only the
    ones that guess got wrong.
    """
    hit = keep_dtype is None
    out_dtype = torch.bool if keep_dtype is None else keep_dtype
    budget = _budget(chunks.plan)
    # Room for the budget and one more chunk: a chunk is gathered before it is counted.
    gather = _Gather(budget + min(max(_STEP, _CHUNK), chunks.plan.largest), chunks.plan.work)
    gathered: list[_Gathered] = []
    below = counted = 0
    peaks: list[Tensor | bool] | None = []  # per chunk: finite? (None: not known)
    for index, (scores, alive) in enumerate(source() for source in chunks.sources):
        out = torch.empty(scores.numel(), dtype=out_dtype)
        product = None if products is None else products[index]
        first = gather.size
        for part in chunks.split(scores, alive, out, (lower, mid, upper), hit, product, gather):
            counted += part.competing
            below += part.below
            if part.finite is None:
                peaks = None
            elif peaks is not None:
                peaks.append(part.finite)
            if gather.size > budget:
                return None
        where = gather.positions[first : gather.size]
        # Scores are kept only where a product needs them: sources may make theirs anew.
        held = None if product is None else scores.detach().reshape(-1)
        gathered.append(_Gathered(out, product, held, where))
    chunks.counted = counted
    if peaks:
        chunks.finite = all(bool(peak) for peak in peaks)
    rank = _resolve(k, counted) - below
    values_all = gather.values[: gather.size]
    if not 0 < rank <= values_all.numel():
        return None
    if chunks.native(out_dtype):
        _settle_native(gathered, values_all, rank, hit, float(mid))
    else:
        _settle_tensors(gathered, values_all, rank, hit)
    return [entry.out for entry in gathered]


@dataclass
class _Gathered:
    """One source after the one pass: its selection, its product and flat scores (if a
    product is asked) and the positions of its entries in between."""

    out: Tensor
    product: Tensor | None
    scores: Tensor | None
    where: Tensor


def _settle_tensors(gathered: list[_Gathered], values: Tensor, rank: int, hit: bool) -> None:
    """Choose the `rank` smallest of the entries in between (all sources in order)."""
    small = values.numel() <= _SAMPLE  # a sample would hold them all: no guess
    picked = _select_sorted(values, rank) if small else smallest_k(values, rank)
    offset = 0
    for entry in gathered:
        chosen = entry.where[picked[offset : offset + entry.where.numel()]]
        offset += entry.where.numel()
        entry.out[chosen] = hit
        if entry.product is not None:
            assert entry.scores is not None
            entry.product[chosen] = entry.scores[chosen] * entry.out[chosen]


def _settle_native(
    gathered: list[_Gathered], values: Tensor, rank: int, hit: bool, mid: float
) -> None:
    """`_settle_tensors` through the C loop: from the k-th smallest value and how many
    of its ties each source takes (the earlier sources first), each source's entries
    in between are settled in one go, sources side by side on torch's threads (the one
    pass marked those below `mid` as chosen)."""
    assert _native is not None
    kth = _native.kth(values.data_ptr(), values.element_size(), values.numel(), rank - 1)
    left = rank - int((values < kth).sum())
    jobs = []
    offset = 0
    for entry in gathered:
        count = entry.where.numel()
        ties = int((values[offset : offset + count] == kth).sum()) if left else 0
        jobs.append((entry, values[offset : offset + count], min(ties, left)))
        left -= min(ties, left)
        offset += count

    def settle(entry: _Gathered, mine: Tensor, take: int) -> None:
        out, product = entry.out, entry.product
        one = _one_bits(out.dtype)
        scores = entry.scores
        fused = scores is not None and _bits_of(scores, out)
        assert _native is not None
        _native.settle(
            out.data_ptr(),
            out.element_size(),
            one if hit else 0,
            0 if hit else one,
            scores.data_ptr() if fused and scores is not None else 0,
            product.data_ptr() if fused and product is not None else 0,
            entry.where.data_ptr(),
            mine.data_ptr(),
            mine.element_size(),
            mine.numel(),
            kth,
            mid,
            take,
        )

    threads = max(1, min(_threads(), len(jobs)))
    others = [job for i, job in enumerate(jobs) if i % threads]  # for the pool's threads
    pending = [_pool(threads - 1).submit(settle, *job) for job in others]
    for job in jobs[::threads]:
        settle(*job)
    for future in pending:
        future.result()
    for entry in gathered:  # here: the caller's modes (inference mode) are per thread
        scores, product = entry.scores, entry.product
        if product is not None and scores is not None and not _bits_of(scores, entry.out):
            torch.mul(scores, entry.out, out=product)


def _budget(plan: _Plan) -> int:
    """How many entries in between the one pass may gather: at most 1/16 of all (ranking
    them is then a much smaller problem), taking no more memory (a position and a value
    each) than the largest tensor."""
    item = torch.finfo(plan.work).bits // 8
    return min(plan.size // 16, plan.largest * item // (8 + item))


class _Chunks:
    """Reads the sources a chunk at a time into work buffers reused from chunk to chunk.

    Working in chunks keeps every intermediate small (and in cache): only the
    selections themselves take memory the size of a tensor.
    """

    def __init__(self, sources: Sequence[Source], plan: _Plan) -> None:
        self.sources = sources
        self.plan = plan
        self.counted: int | None = None  # entries competing, once a pass has read them all
        self.finite = False  # True once a pass has read every score and found them finite
        size = min(_CHUNK, plan.largest)
        self.top = torch.empty(size, dtype=torch.int16)
        self.dead = torch.empty(size, dtype=torch.bool)
        self.all_bits = torch.empty(size, dtype=torch.int8)  # -1 where dead, else 0
        self.flags = torch.empty(size, dtype=torch.bool)
        self.between = torch.empty(size, dtype=torch.bool)
        self.values = torch.empty(size, dtype=plan.work)
        # 0/1 as floats: compares write floats several times faster than bools here.
        self.low = torch.empty(size, dtype=plan.work)
        self.high = torch.empty(size, dtype=plan.work)
        self.alive = torch.empty(size, dtype=plan.work)
        self.zeros = torch.zeros(size, dtype=plan.work)
        # The C loop's: 16-bit scores widened, other flags as bools. Only the pages
        # written are ever mapped.
        step = min(_STEP, plan.largest) if _native else 0
        self.wide = torch.empty(step if plan.bits == 16 else 0, dtype=plan.work)
        self.live = torch.empty(step, dtype=torch.bool)

    def read(
        self, scores: Tensor, alive: Tensor | None, step: int | None = None
    ) -> Iterator[tuple[int, Tensor, Tensor | None]]:
        """(start, scores, alive flags or None) for each chunk (of `step` entries,
        _CHUNK by default) of one source's scores."""
        step = step or _CHUNK
        flat = scores.detach().reshape(-1)
        live = None if alive is None else alive.reshape(-1)
        for start in range(0, flat.numel(), step):
            part = flat[start : start + step]
            if part.dtype != self.plan.dtype:
                part = part.to(self.plan.dtype)
            flags = None if live is None else live[start : start + step]
            yield start, part.contiguous(), flags

    def magnitudes(
        self, scores: Tensor, alive: Tensor | None, out: Tensor
    ) -> Iterator[tuple[int, Tensor, Tensor, int]]:
        """(start, the chunk's slice of `out`, its |scores|, how many compete) per chunk.

        Entries that do not compete read as NaN, so every comparison leaves them out.

        The magnitudes are written into the slice of `out` itself when `out` has the
        dtype they are compared in (callers then overwrite them with the selection),
        else into a buffer.
        """
        for start, part, flags in self.read(scores, alive):
            n = part.numel()
            piece = out[start : start + n]
            magnitudes = piece if out.dtype == self.plan.work else self.values[:n]
            if part.dtype == magnitudes.dtype:
                torch.abs(part, out=magnitudes)
            else:
                magnitudes.copy_(part).abs_()  # widened: exact
            if flags is None:
                live_count = n
            else:
                # |x| + 0 / alive: |x| + 0/1 (exact) where alive, |x| + 0/0 = NaN where not.
                # Branch-free, unlike masked_fill_ or where() on scattered flags.
                live = self.alive[:n]
                if flags.dtype == torch.bool:
                    live.copy_(flags)
                elif flags.dtype != live.dtype and _widens(flags.dtype, live.dtype):
                    torch.eq(live.copy_(flags), 1, out=live)  # faster than mixed dtypes
                else:
                    torch.eq(flags, 1, out=live)
                magnitudes.addcdiv_(self.zeros[:n], live)
                live_count = _ones(live)
            yield start, piece, magnitudes, live_count

    def native(self, out_dtype: torch.dtype) -> bool:
        """Whether the C loop makes selections of `out_dtype` (1, 2, 4 or 8 bytes, real)."""
        return _native is not None and out_dtype.itemsize in _UNSIGNED and not out_dtype.is_complex

    def split(
        self,
        scores: Tensor,
        alive: Tensor | None,
        out: Tensor,
        bounds: tuple[Tensor, Tensor, Tensor],
        hit: bool,
        product: Tensor | None,
        gather: _Gather,
    ) -> Iterator[_Part]:
        """The one pass over one source, chunk by chunk, given (lower, mid, upper): writes
        the entries chosen into `out` (`hit` where chosen, else 1 - `hit`), and scores x
        out into `product` if given; gathers the entries between lower and upper into
        `gather` and yields counts per chunk.

        Chosen are the entries below mid in the C loop, below lower in the tensor operations:
        _settle_native and _settle_tensors finish each.
        """
        lower, mid, upper = bounds
        if not self.native(out.dtype):
            yield from self._split_tensors(scores, alive, out, lower, upper, hit, product, gather)
            return
        flat = scores.reshape(-1)
        # The C loop writes the product from the scores' bits: scores of the mask's dtype,
        # contiguous.
        fused = product if product is not None and _bits_of(flat, out) else None
        one = _one_bits(out.dtype)
        chosen, other = (one, 0) if hit else (0, one)
        cuts = float(lower), float(mid), float(upper)
        for start, part, flags in self.read(scores, alive, _STEP):
            n = part.numel()
            if part.dtype not in (torch.float32, torch.float64):
                part = self.wide[:n].copy_(part)  # 16-bit: widened (exactly)
            if flags is not None and not (self.native(flags.dtype) and flags.is_contiguous()):
                flags = torch.eq(flags, 1, out=self.live[:n])  # the C loop reads 1s as bits
            piece = out[start : start + n]
            into = None if fused is None else (flat[start : start + n], fused[start : start + n])
            competing, below, finite = _native_split(
                part, flags, piece, chosen, other, cuts, gather, start, into
            )
            if product is not None and fused is None:
                torch.mul(flat[start : start + n].detach(), piece, out=product[start : start + n])
            yield _Part(below, competing, finite)

    def _split_tensors(
        self,
        scores: Tensor,
        alive: Tensor | None,
        out: Tensor,
        lower: Tensor,
        upper: Tensor,
        hit: bool,
        product: Tensor | None,
        gather: _Gather,
    ) -> Iterator[_Part]:
        """`split` as tensor operations, a few per chunk."""
        flat = scores.reshape(-1)
        for start, piece, magnitudes, competing in self.magnitudes(scores, alive, out):
            n = piece.numel()
            # NaN stands for the entries that do not compete, so only without flags does
            # the chunk's largest magnitude say whether all are finite.
            finite = magnitudes.amax().isfinite() if alive is None else None
            # Compares into floats: several times faster here than into bool.
            low = torch.lt(magnitudes, lower, out=self.low[:n])
            between = torch.le(magnitudes, upper, out=self.high[:n]).sub_(low)
            below = _ones(low)
            where = self.between[:n].copy_(between).nonzero().reshape(-1)
            values = magnitudes.index_select(0, where)
            _write(piece, low, hit)
            if product is not None:
                torch.mul(flat[start : start + n].detach(), piece, out=product[start : start + n])
            gather.append(where.add_(start), values)
            yield _Part(below, competing, finite)

    def tops(self, index: int) -> Iterator[tuple[int, Tensor, Tensor]]:
        """(start, scores, top digits) per chunk: the top 16 bits without the sign,
        _DEAD where the entry does not compete."""
        step = self.plan.bits // 16
        for start, part, flags in self.read(*self.sources[index]()):
            n = part.numel()
            digits = part.view(torch.int16)[step - 1 :: step]  # little-endian: top digit last
            top = self.top[:n]
            if flags is not None:
                dead = self.dead[:n]
                if flags.dtype == torch.bool:
                    torch.logical_not(flags, out=dead)
                else:
                    torch.ne(flags, 1, out=dead)
                # All bits set where dead (-1 as int8 widens to 0xFFFF), then the sign
                # cleared: _DEAD. Branch-free, unlike masked_fill_ on scattered flags.
                ones = torch.neg(dead.view(torch.int8), out=self.all_bits[:n])
                torch.bitwise_or(digits, ones, out=top)
                digits = top
            torch.bitwise_and(digits, _DEAD, out=top)  # the sign cleared: all ones is _DEAD
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
    out_dtype = torch.bool if keep_dtype is None else keep_dtype
    # With no ties at the cut the chosen are exactly the keys up to it.
    take = 0 if cut.take == cut.equal else cut.take
    below = torch.le if take == 0 else torch.lt
    for scores, alive in (source() for source in chunks.sources):
        out = torch.empty(scores.numel(), dtype=out_dtype)
        for start, piece, magnitudes, _ in chunks.magnitudes(scores, alive, out):
            n = piece.numel()
            equal = None
            if take:
                flags = chunks.flags[:n].copy_(torch.eq(magnitudes, bound, out=chunks.low[:n]))
                equal = flags.nonzero().reshape(-1)[:take] + start
                take -= equal.numel()
            chosen = below(magnitudes, bound, out=chunks.low[:n])  # never where NaN
            _write(piece, chosen, hit)
            if equal is not None:
                out[equal] = hit
        yield out


_UNSIGNED = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits_of(scores: Tensor, out: Tensor) -> bool:
    """Whether the C loop can write a product from the bits of `scores` (flat) into a
    tensor like `out`: the same dtype, contiguous."""
    return scores.dtype == out.dtype and scores.is_contiguous()


def _one_bits(dtype: torch.dtype) -> int:
    """The bits of 1 (True for bool) in `dtype`, read as an unsigned integer."""
    one = torch.ones((), dtype=dtype)
    return int(one.view(_UNSIGNED[one.element_size()]).item()) & ((1 << 8 * one.element_size()) - 1)


_POOL: list[tuple[int, ThreadPoolExecutor]] = []  # the C loop's threads (how many), once made


def _pool(workers: int) -> ThreadPoolExecutor:
    """A pool of at least `workers` threads, kept for later calls."""
    if not _POOL or _POOL[0][0] < workers:
        _POOL[:] = [(workers, ThreadPoolExecutor(workers, thread_name_prefix="prunekit"))]
    return _POOL[0][1]


os.register_at_fork(after_in_child=_POOL.clear)  # the pool's threads do not survive a fork


def _native_split(
    scores: Tensor,
    flags: Tensor | None,
    out: Tensor,
    chosen: int,
    other: int,
    bounds: tuple[float, float, float],
    gather: _Gather,
    base: int,
    product: tuple[Tensor, Tensor] | None = None,
) -> tuple[int, int, bool]:
    """One chunk through the C loop, in as many parts as torch has threads (each at
    least _PART entries): the parts run at once, the GIL released. `bounds`: (lower,
    mid, upper), see _Chunks.split. The entries in between are appended to `gather`,
    their positions counted from `base` (which must have room for the chunk). With
    `product`, (orig, into): writes orig x out into `into`, both of out's dtype.

    Returns how many entries compete, how many are below, and whether all scores are
    finite.
    """
    assert _native is not None
    n = scores.numel()
    count = max(1, min(_threads(), n // _PART))
    parts = list(itertools.pairwise(n * i // count for i in range(count + 1)))
    at = gather.size  # each part gathers from at + its start, then they close ranks
    alive_one = 0 if flags is None else _one_bits(flags.dtype)
    positions, values = gather.positions, gather.values

    def run(start: int, end: int) -> tuple[int, int, int, bool]:
        tally: tuple[int, int, int, bool] = _native.split(
            scores.data_ptr() + start * scores.element_size(),
            scores.element_size(),
            0 if flags is None else flags.data_ptr() + start * flags.element_size(),
            0 if flags is None else flags.element_size(),
            alive_one,
            out.data_ptr() + start * out.element_size(),
            out.element_size(),
            chosen,
            other,
            0 if product is None else product[0].data_ptr() + start * out.element_size(),
            0 if product is None else product[1].data_ptr() + start * out.element_size(),
            end - start,
            *bounds,
            positions.data_ptr() + (at + start) * positions.element_size(),
            values.data_ptr() + (at + start) * values.element_size(),
            base + start,
        )
        return tally

    pending = [_pool(count - 1).submit(run, *part) for part in parts[1:]]
    tallies = [run(*parts[0]), *(future.result() for future in pending)]
    end = at
    for (start, _), tally in zip(parts, tallies, strict=True):
        found = tally[1]
        if found and at + start != end:  # move down next to the part before
            source = slice(at + start, at + start + found)
            overlap = end + found > at + start
            gather.positions[end : end + found] = (
                positions[source].clone() if overlap else positions[source]
            )
            gather.values[end : end + found] = values[source].clone() if overlap else values[source]
        end += found
    gather.size = end
    return (
        sum(tally[2] for tally in tallies),
        sum(tally[0] for tally in tallies),
        all(tally[3] for tally in tallies),
    )


def _widens(source: torch.dtype, target: torch.dtype) -> bool:
    """True if `source` is a float type that `target` holds exactly (so == 1 is kept)."""
    return source.is_floating_point and torch.promote_types(source, target) == target


def _ones(flags: Tensor) -> int:
    """How many 1s a chunk of 0/1 floats holds (float32 sums are exact that far)."""
    return int(flags.sum(dtype=torch.float32))


def _write(piece: Tensor, chosen: Tensor, hit: bool) -> None:
    """Write 0/1 floats `chosen` into `piece`: as they are (`hit`), or as 1 - chosen."""
    if hit:
        piece.copy_(chosen)
    elif piece.dtype == chosen.dtype:
        torch.sub(_ONE, chosen, out=piece)
    else:
        piece.copy_(torch.sub(_ONE, chosen, out=chosen))  # faster than mixed dtypes


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
    """The k smallest of a 1-D tensor via kthvalue (a stable sort if tiny), ties by lowest index."""
    if isinstance(flat, Tensor) and flat.numel() <= _TINY:
        chosen_few = torch.zeros(flat.shape, dtype=torch.bool, device=flat.device)
        chosen_few[torch.argsort(flat, stable=True)[:k]] = True
        return chosen_few
    threshold = flat.kthvalue(k)[0]
    chosen = flat < threshold
    missing = k - int(chosen.sum())
    at_threshold = flat == threshold
    if int(at_threshold.sum()) > missing:
        rank = at_threshold.cumsum(0)
        at_threshold = at_threshold & (rank <= missing)
    result: Tensor = chosen | at_threshold
    return result
