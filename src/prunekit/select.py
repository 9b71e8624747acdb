"""Selection kernels: which k entries of one or many score tensors are the smallest.

Every method ranks through here, so the rule is the same everywhere: exactly
k entries are chosen, and among equal scores the lower flat index goes first
(across several tensors: the earlier tensor first, then the lower index).

The fast path never sorts. A float's bits, read as 16-bit digits from the
top, order non-negative floats the same way as their values; a histogram of
the top digit (one ``bincount``) finds the bucket that holds the k-th value,
the next digits are counted only inside that bucket, and a last pass marks
the entries below it. Ties are resolved only when they straddle the k-th
value. Tensors are read one at a time, so the work memory (beyond the
selections returned) is bounded by the largest one, and counts are Python
ints, so totals above 2**31 are fine.
The fast path covers torch tensors of float16, bfloat16, float32 and
float64 holding more than 2**14 entries in all; anything else (other
frameworks, negative scores, small inputs) takes a portable path built from
plain tensor methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from prunekit._backend import namespace

__all__ = ["Source", "alive_count", "smallest_k", "smallest_k_many"]

Source = Callable[[], tuple[Tensor, Tensor | None]]
"""Returns one tensor's scores and its alive flags (bool, or None for all alive).

Called once per pass, so a source may recompute its scores instead of holding them.
"""

_DIGITS = {torch.float16: 1, torch.bfloat16: 1, torch.float32: 2, torch.float64: 4}
_TOP_BINS = 1 << 15  # the top digit without its sign bit
_LOW_BINS = 1 << 16
_DEAD = 0x7FFF  # a NaN pattern in the top digit of every supported format
_CHUNK = 1 << 16
_SMALL = 1 << 14  # below this many entries a few plain calls beat the passes


def smallest_k(
    scores: Tensor, k: int, alive: Tensor | None = None, *, magnitude: bool = False
) -> Tensor:
    """Return a bool tensor shaped like `scores`, True at its `k` smallest entries.

    Only entries where `alive` is True compete (all of them when it is None).
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
) -> Iterator[Tensor]:
    """Yield, for each source in turn, a flat bool tensor marking its share of the `k` smallest.

    The scores of all sources rank together as if concatenated in order, but
    are never concatenated: each source is called once per pass and dropped.
    With several float32/float64 sources the selections are begun during the
    ranking passes and held until yielded. With `keep_dtype`, each yields the
    complement instead, as 1s (kept) and 0s (chosen) of that dtype: a mask,
    made without an intermediate bool tensor.
    """
    total = sum(alive_count(*source()) for source in sources)
    if not 0 <= k <= total:
        raise ValueError(f"smallest_k: k={k} is outside [0, {total}], the entries that compete")
    if k == 0 or k == total:
        chosen: Iterator[Tensor] = (_filled(*source(), everything=k > 0) for source in sources)
    else:
        plan = _fast_plan(sources, magnitude)
        if plan is not None and plan.size > _SMALL:
            reader = _Reader(sources, plan, keep_dtype)
            return _mark(reader, _find_cut(reader, k), keep_dtype)
        chosen = iter(_portable(sources, k, magnitude))
    if keep_dtype is None:
        return chosen
    return ((~pick).to(keep_dtype) for pick in chosen)


@dataclass(frozen=True)
class _Plan:
    """How the fast path reads scores: their common dtype and digits per entry."""

    dtype: torch.dtype
    digits: int
    size: int  # entries in all sources


@dataclass
class _Cut:
    """The k-th key: top digit, lower digits as one int, and how many ties to take."""

    top: int
    low: int
    ties: int


def alive_count(scores: Tensor, alive: Tensor | None) -> int:
    """How many entries of `scores` compete: those where `alive` is True (all for None)."""
    return scores.numel() if alive is None else int(alive.count_nonzero())


def _filled(scores: Tensor, alive: Tensor | None, everything: bool) -> Tensor:
    flat = scores.reshape(-1)
    if alive is not None:
        return alive.reshape(-1).clone() if everything else alive.reshape(-1) & False
    ns = namespace(scores)
    fill = ns.ones if everything else ns.zeros
    filled: Tensor = fill(flat.shape, dtype=ns.bool, device=flat.device)
    return filled


def _fast_plan(sources: Sequence[Source], magnitude: bool) -> _Plan | None:
    """The dtype all scores are read in, or None when the fast path does not apply."""
    dtype: torch.dtype | None = None
    size = 0
    for source in sources:
        scores, _ = source()
        size += scores.numel()
        if not isinstance(scores, Tensor) or scores.dtype not in _DIGITS:
            return None
        if not magnitude and scores.numel() and bool(scores.min() < 0):
            return None
        dtype = scores.dtype if dtype is None else torch.promote_types(dtype, scores.dtype)
    assert dtype is not None
    return _Plan(dtype, _DIGITS[dtype], size)


def _digits(scores: Tensor, plan: _Plan) -> Tensor:
    """The entries' bits as int16 digits, shape (n, digits), least significant first."""
    flat = scores.reshape(-1)
    if flat.dtype != plan.dtype:
        flat = flat.to(plan.dtype)
    return flat.contiguous().view(torch.int16).view(-1, plan.digits)


def _top(digits: Tensor, alive: Tensor | None) -> Tensor:
    """The top digit without the sign (so |score| ranks), dead entries pushed past all."""
    top = digits[:, -1] & 0x7FFF
    if alive is None:
        return top
    return torch.where(alive.reshape(-1), top, _DEAD)


def _low(digits: Tensor) -> Tensor:
    """The digits below the top one as a single non-negative int64 per entry."""
    low = torch.zeros(digits.shape[0], dtype=torch.int64, device=digits.device)
    for j in range(digits.shape[1] - 2, -1, -1):
        low = (low << 16) | (digits[:, j].to(torch.int64) & 0xFFFF)
    return low


def _pick(hist: Tensor, rank: int) -> tuple[int, int]:
    """The bin holding the `rank`-th entry (1-based) and how many entries lie below it."""
    cum = hist.cumsum(0)
    index = int((cum < rank).count_nonzero())
    below = int(cum[index - 1]) if index else 0
    return index, below


class _Reader:
    """Reads each source's digits and top digits; keeps them when there is one source."""

    def __init__(
        self, sources: Sequence[Source], plan: _Plan, keep_dtype: torch.dtype | None
    ) -> None:
        self.sources = sources
        self.plan = plan
        self.keep_dtype = keep_dtype
        self.keep = len(sources) == 1
        self.kept: dict[object, tuple[Tensor, ...]] = {}
        self.buckets: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
        self.budget = 0  # bucket entries (16 bytes each) still allowed to be kept
        self.early: dict[int, Tensor] = {}  # selections begun while reading the bucket

    def begin(self, index: int, value: int) -> tuple[Tensor, Tensor]:
        """bucket(), and with several sources also the selection by top digit alone.

        The top digit of the cut is known once the first histogram is summed, so
        the pass that reads the bucket can start each source's selection too,
        sparing a read when marking.
        """
        if self.keep or (index, value) in self.buckets:
            return self.bucket(index, value)
        digits, top = self.top(index)
        self.early[index] = _below(top, value, self.keep_dtype)
        return self._gather(index, value, digits, top)

    def top(self, index: int) -> tuple[Tensor, Tensor]:
        """(digits, top digits) of source `index`."""
        if "top" in self.kept:
            digits, top = self.kept["top"]
            return digits, top
        scores, alive = self.sources[index]()
        digits = _digits(scores, self.plan)
        top = _top(digits, alive)
        if self.keep:
            self.kept["top"] = (digits, top)
        return digits, top

    def bucket(self, index: int, value: int) -> tuple[Tensor, Tensor]:
        """Positions of source `index`'s entries whose top digit is `value`, and their lows."""
        if (index, value) in self.buckets:
            return self.buckets[index, value]
        digits, top = self.top(index)
        return self._gather(index, value, digits, top)

    def _gather(self, index: int, value: int, digits: Tensor, top: Tensor) -> tuple[Tensor, Tensor]:
        """The bucket read from `digits`; kept for the next pass if it fits the budget."""
        found = (top == value).nonzero().reshape(-1)
        low = _low(digits[found])
        if self.keep or found.numel() <= self.budget:
            self.budget -= found.numel()
            self.buckets[index, value] = (found, low)
        return found, low


def _find_cut(reader: _Reader, k: int) -> _Cut:
    """Locate the k-th smallest key, a digit at a time, with histograms only."""
    count = len(reader.sources)
    hist = None
    for i in range(count):
        digits = reader.top(i)[1]
        reader.budget = max(reader.budget, digits.numel() // 4)
        part = torch.bincount(digits, minlength=_TOP_BINS)
        hist = part if hist is None else hist + part
    assert hist is not None
    top, below = _pick(hist, k)
    del digits
    rank = k - below
    low = 0
    for shift in range(16 * (reader.plan.digits - 2), -1, -16):
        parts = []
        for i in range(count):
            lows = (reader.begin if shift == 16 * (reader.plan.digits - 2) else reader.bucket)(
                i, top
            )[1]
            lows = lows[(lows >> (shift + 16)) == (low >> (shift + 16))]
            parts.append(torch.bincount((lows >> shift) & 0xFFFF, minlength=_LOW_BINS))
        digit, below = _pick(sum(parts[1:], parts[0]), rank)
        rank -= below
        low |= digit << shift
    return _Cut(top, low, rank)


def _mark(reader: _Reader, cut: _Cut, keep_dtype: torch.dtype | None) -> Iterator[Tensor]:
    """Yield each source's selection: keys below the cut, then the first `cut.ties` ties."""
    ties = cut.ties
    hit = keep_dtype is None
    for i in range(len(reader.sources)):
        top: Tensor | None = None
        out = reader.early.pop(i, None)
        if out is None:
            top = reader.top(i)[1]
            out = _below(top, cut.top, keep_dtype)
        take = 0
        if reader.plan.digits > 1:
            where, low = reader.bucket(i, cut.top)
            out[where[low < cut.low]] = hit
            if ties:
                equal = where[low == cut.low]
                take = min(int(equal.numel()), ties)
                out[equal[:take]] = hit
        elif ties:
            flags = (reader.top(i)[1] if top is None else top) == cut.top
            count = int(flags.count_nonzero())
            take = min(count, ties)
            if take < count:
                _keep_first(flags, take)
            out.masked_fill_(flags, hit)
            del flags
        del top
        ties -= take
        yield out


def _below(top: Tensor, value: int, keep_dtype: torch.dtype | None) -> Tensor:
    """True where the top digit is below `value`; with `keep_dtype`, 1 where it is not."""
    if keep_dtype is None:
        return top < value
    out = torch.empty(top.shape, dtype=keep_dtype, device=top.device)
    return torch.ge(top, value, out=out)


def _keep_first(flags: Tensor, count: int) -> None:
    """Clear every True of 1-D bool `flags` after the first `count` (>= 1), in place."""
    size = flags.numel()
    full = size // _CHUNK * _CHUNK
    start, seen = 0, 0
    if full:
        sums = flags[:full].view(-1, _CHUNK).sum(1).cumsum(0)
        chunk = int((sums < count).count_nonzero())
        if chunk < sums.numel():
            start = chunk * _CHUNK
            seen = int(sums[chunk - 1]) if chunk else 0
        else:
            start, seen = full, int(sums[-1])
    end = min(start + _CHUNK, size)
    where = flags[start:end].nonzero().reshape(-1)
    last = start + int(where[count - seen - 1])
    flags[last + 1 :] = False


def _portable(sources: Sequence[Source], k: int, magnitude: bool) -> list[Tensor]:
    """Reference-style selection with plain tensor methods: gather, kthvalue, compare."""
    parts, lives = [], []
    for source in sources:
        scores, alive = source()
        flat = scores.reshape(-1)
        parts.append(flat.abs() if magnitude else flat)
        lives.append(None if alive is None else alive.reshape(-1))
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
