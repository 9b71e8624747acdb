"""The k smallest magnitudes of tensors held in pieces (by several processes, or streamed from
disk): one threshold and the ties it takes, found in a few passes, never holding the model.

The pieces rank as one list ordered by `Piece.key` (a tensor's place in the model), then by
the global flat position inside the tensor: the same order as ``smallest_k_many`` over the
whole tensors in one process, so the selections are the same. A piece is a tensor, or a part
of one (a DTensor shard) made of `Run`\\ s, stretches contiguous both in the piece and in the
whole tensor.

What travels between processes does not grow with the model: an evenly spaced sample (about
2**17 magnitudes in all), counts, and 65536-bin histograms. The steps:

1. The sample is gathered; two of its order statistics enclose the k-th smallest magnitude
   with near certainty.
2. One pass counts the entries below the lower bound and keeps, locally, the magnitudes in
   between (a small share); the counts are summed.
3. Histograms of those kept magnitudes' bits, 16 at a time, summed over the ranks, give the
   k-th value exactly. Where the bounds missed, the same histograms run over the tensors
   themselves (two passes for float32).
4. Entries equal to the threshold are taken in order: per tensor the counts are gathered,
   and within the one tensor the threshold splits, per run.

Choosing is then local: below the threshold, or among the ties a run takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from prunekit.distributed.group import Group
from prunekit.select import Source, alive_count

__all__ = ["Piece", "Run", "Selection", "Unrankable", "select"]

CHUNK = 1 << 18  # entries read at a time
SAMPLE = 1 << 17  # entries sampled in all, over every rank
HOLD_ALL = 1 << 18  # up to this many entries in all, no sample: every competing one is kept
SPREAD = 6.0  # standard deviations of the sampled share the bounds leave either side
BINS = 1 << 16


class Unrankable(ValueError):
    """Some scores are NaN or infinite; `pieces` are the local ones that hold them."""

    def __init__(self, pieces: list[int]) -> None:
        super().__init__("the scores hold NaN or infinity, which cannot be ranked")
        self.pieces = pieces


@dataclass(frozen=True)
class Run:
    """`length` entries contiguous at `local` in the piece and at `start` in the whole tensor."""

    local: int
    start: int
    length: int


@dataclass
class Piece:
    """A tensor, or this process's part of one, as the selection reads it.

    `source` returns the piece's scores and which of them compete (see prunekit.select);
    it is called once per pass. `key` orders the tensors. `counts` is False for a replica
    whose entries another process counts (it is still marked). `competing` is how many
    entries compete if known (None: counted from the flags).
    """

    source: Source
    numel: int
    dtype: torch.dtype
    key: int
    runs: tuple[Run, ...] = ()
    counts: bool = True
    competing: int | None = None

    def __post_init__(self) -> None:
        if not self.runs:
            self.runs = (Run(0, 0, self.numel),)


@dataclass
class _Ties:
    """Which entries equal to the threshold a piece takes: all, none, or per run."""

    every: bool = False
    per_run: dict[int, int] = field(default_factory=dict)  # run index -> how many


class Selection:
    """The threshold and the ties each piece takes; marks one piece at a time."""

    def __init__(
        self, pieces: Sequence[Piece], work: torch.dtype, bound: float, ties: list[_Ties]
    ) -> None:
        self.pieces = pieces
        self.work = work
        self.bound = torch.tensor(bound, dtype=work)
        self.ties = ties

    def chunks(self, index: int) -> Iterator[tuple[int, Tensor]]:
        """(start, bool chunk, True where chosen) over the piece `index`, in order."""
        piece, ties = self.pieces[index], self.ties[index]
        left = dict(ties.per_run)
        scores, alive = piece.source()
        for start, m, live in _magnitudes(scores, alive, self.work):
            pick = m <= self.bound if ties.every else m < self.bound
            if live is not None:
                pick &= live
            for run_index in [r for r, n in left.items() if n]:
                run = piece.runs[run_index]
                lo = max(run.local, start) - start
                hi = min(run.local + run.length, start + m.numel()) - start
                if lo >= hi:
                    continue
                equal = m[lo:hi] == self.bound
                if live is not None:
                    equal &= live[lo:hi]
                where = equal.nonzero().reshape(-1)[: left[run_index]]
                pick[where + lo] = True
                left[run_index] -= where.numel()
            yield start, pick

    def chosen(self, index: int) -> Tensor:
        """A flat bool tensor, True at the piece's entries chosen."""
        out = torch.empty(self.pieces[index].numel, dtype=torch.bool)
        for start, pick in self.chunks(index):
            out[start : start + pick.numel()] = pick
        return out

    def keep(self, index: int, dtype: torch.dtype) -> Tensor:
        """A flat mask of `dtype`: 0 at the entries chosen, 1 elsewhere."""
        out = torch.empty(self.pieces[index].numel, dtype=dtype)
        for start, pick in self.chunks(index):
            out[start : start + pick.numel()] = torch.logical_not(pick)
        return out


def select(pieces: Sequence[Piece], count: Callable[[int], int], group: Group) -> Selection:
    """Choose ``count(total)`` entries among the `total` competing in all pieces of all
    ranks: those of smallest magnitude, ties by key, then position in the tensor.

    Every rank calls it with its own pieces. Raises Unrankable (on every rank) if a
    score is NaN or infinite, after any error `count` raises.
    """
    work = _work_dtype(pieces, group)
    owned = [i for i, p in enumerate(pieces) if p.counts]
    size, total = (
        int(v)
        for v in group.sum(
            torch.tensor(
                [sum(pieces[i].numel for i in owned), sum(_competing(pieces[i]) for i in owned)],
                dtype=torch.int64,
            )
        )
    )
    k = count(total)
    if k in (0, total):
        _refuse_non_finite(pieces, owned, work, group)
        bound = math.inf if k else 0.0
        return Selection(pieces, work, bound, [_Ties() for _ in pieces])
    bounds = _bounds(pieces, owned, work, k, size, total, group)
    held, below, kept, nonfinite = _held(pieces, owned, work, bounds, size, group)
    if nonfinite:
        raise Unrankable(_non_finite_pieces(pieces, owned, work))
    if 0 < k - below <= kept:  # the k-th lies between the bounds: rank what was kept
        key, take, _ = _radix(lambda: _held_keys(held, work), k - below, work, group)
        bound = _float(key, work)
        mine = {i: int((values.to(work) == bound).sum()) for i, values in held.items()}
    else:  # the bounds missed (or too much fell between): histograms of the tensors
        held.clear()
        key, take, _ = _radix(lambda: _data_keys(pieces, owned, work), k, work, group)
        bound = _float(key, work)
        mine = {i: _equal_count(pieces[i], work, bound) for i in owned}
    ties = _share_ties(pieces, mine, take, work, bound, group)
    return Selection(pieces, work, bound, ties)


def _competing(piece: Piece) -> int:
    if piece.competing is not None:
        return piece.competing
    return alive_count(*piece.source())


def _work_dtype(pieces: Sequence[Piece], group: Group) -> torch.dtype:
    """float64 if any rank's scores are float64, else float32 (16-bit floats widen to it
    exactly): the dtype magnitudes are compared in."""
    wide = any(p.dtype == torch.float64 for p in pieces)
    return torch.float64 if int(group.sum(torch.tensor([int(wide)]))[0]) else torch.float32


def _magnitudes(
    scores: Tensor, alive: Tensor | None, work: torch.dtype, step: int = CHUNK
) -> Iterator[tuple[int, Tensor, Tensor | None]]:
    """(start, magnitudes in `work`, competing flags as bool or None) per chunk."""
    flat = scores.detach().reshape(-1)
    flags = None if alive is None else alive.reshape(-1)
    for start in range(0, flat.numel(), step):
        part = flat[start : start + step]
        m = part.abs() if part.dtype == work else part.to(work).abs_()
        live = None
        if flags is not None:
            live = flags[start : start + step]
            live = live if live.dtype == torch.bool else live == 1
        yield start, m, live


def _bounds(
    pieces: Sequence[Piece],
    owned: list[int],
    work: torch.dtype,
    k: int,
    size: int,
    total: int,
    group: Group,
) -> tuple[float, float]:
    """Magnitudes that very likely enclose the k-th smallest, from an evenly spaced
    sample gathered from every rank; (0, inf), keeping every competing entry, for few
    entries or too small a sample."""
    if size <= HOLD_ALL:
        return 0.0, math.inf
    stride = max(1, size // SAMPLE)
    while math.gcd(stride, 210) != 1:  # prime to 2, 3, 5, 7: rows, columns, kernels
        stride += 1
    parts, offset = [], 0
    for i in owned:
        scores, alive = pieces[i].source()
        first = (-offset) % stride
        part = scores.detach().reshape(-1)[first::stride].to(work).abs()
        if alive is not None:
            part = part[alive.reshape(-1)[first::stride] == 1]
        parts.append(part[part.isfinite()])
        offset += pieces[i].numel
    mine = torch.cat(parts) if parts else torch.empty(0, dtype=work)
    sample = torch.cat(group.gather(mine))
    n = sample.numel()
    if n < SAMPLE // 8:
        return 0.0, math.inf
    share = k / total
    margin = SPREAD * math.sqrt(share * (1 - share) / n) + 2 / n
    low, high = math.floor((share - margin) * n), math.ceil((share + margin) * n)
    lower = float(sample.kthvalue(low)[0]) if low >= 1 else 0.0
    upper = float(sample.kthvalue(high)[0]) if high <= n else math.inf
    return lower, upper


def _held(
    pieces: Sequence[Piece],
    owned: list[int],
    work: torch.dtype,
    bounds: tuple[float, float],
    size: int,
    group: Group,
) -> tuple[dict[int, Tensor], int, int, int]:
    """One pass: the competing magnitudes between the bounds, kept per piece (16-bit ones
    in their own dtype); summed over the ranks, how many compete below the lower bound,
    how many were kept (-1 if a rank went over its budget: none are kept then) and how
    many scores are not finite."""
    lower, upper = bounds
    budget = size if size <= HOLD_ALL else max(size // 16, HOLD_ALL)
    held: dict[int, Tensor] = {}
    kept = below = nonfinite = 0
    for i in owned:
        scores, alive = pieces[i].source()
        keep_as = scores.dtype if scores.dtype.itemsize == 2 else work
        parts = []
        for _, m, live in _magnitudes(scores, alive, work):
            if not math.isfinite(float(m.sum())):
                nonfinite += int((~m.isfinite()).sum())
            under = m < lower
            between = (m <= upper) & ~under
            if live is not None:
                under &= live
                between &= live
            below += int(under.sum())
            if kept > budget:
                continue
            values = m[between]
            kept += values.numel()
            parts.append(values.to(keep_as))
        if parts and kept <= budget:
            held[i] = torch.cat(parts)
    over = kept > budget
    if over:
        held.clear()
    totals = group.sum(torch.tensor([below, kept, int(over), nonfinite], dtype=torch.int64))
    kept_all = -1 if int(totals[2]) else int(totals[1])
    return held, int(totals[0]), kept_all, int(totals[3])


def _key_dtype(work: torch.dtype) -> torch.dtype:
    return torch.int64 if work == torch.float64 else torch.int32


def _float(key: int, work: torch.dtype) -> float:
    return float(torch.tensor([key], dtype=_key_dtype(work)).view(work)[0])


def _held_keys(held: dict[int, Tensor], work: torch.dtype) -> Iterator[Tensor]:
    for values in held.values():
        for start in range(0, values.numel(), CHUNK):
            yield values[start : start + CHUNK].to(work).view(_key_dtype(work))


def _data_keys(pieces: Sequence[Piece], owned: list[int], work: torch.dtype) -> Iterator[Tensor]:
    for i in owned:
        for _, m, live in _magnitudes(*pieces[i].source(), work):
            keys = m.view(_key_dtype(work))
            yield keys if live is None else keys[live]


def _radix(
    keys: Callable[[], Iterable[Tensor]], rank: int, work: torch.dtype, group: Group
) -> tuple[int, int, int]:
    """The `rank`-th smallest (1-based) of the non-negative float bits `keys()` yields on
    all ranks, 16 bits at a time from the top, with histograms summed over the ranks;
    also how many equal to it are taken and how many there are."""
    bits = torch.finfo(work).bits
    prefix = equal = 0
    for level, shift in enumerate(range(bits - 16, -1, -16)):
        hist = torch.zeros(BINS, dtype=torch.int64)
        for part in keys():
            if level:
                part = part[(part >> (shift + 16)) == prefix]
            hist += torch.bincount(((part >> shift) & 0xFFFF).to(torch.int64), minlength=BINS)
        hist = group.sum(hist)
        cum = hist.cumsum(0)
        digit = int((cum < rank).sum())
        rank -= int(cum[digit - 1]) if digit else 0
        equal = int(hist[digit])
        prefix = (prefix << 16) | digit
    return prefix, rank, equal


def _equal_count(piece: Piece, work: torch.dtype, bound: float, run: Run | None = None) -> int:
    """How many competing entries of `piece` (of one `run` of it) equal `bound`."""
    scores, alive = piece.source()
    if run is not None:
        scores = scores.detach().reshape(-1)[run.local : run.local + run.length]
        alive = None if alive is None else alive.reshape(-1)[run.local : run.local + run.length]
    count = 0
    for _, m, live in _magnitudes(scores, alive, work):
        equal = m == bound
        count += int((equal & live if live is not None else equal).sum())
    return count


def _share_ties(
    pieces: Sequence[Piece],
    mine: dict[int, int],
    take: int,
    work: torch.dtype,
    bound: float,
    group: Group,
) -> list[_Ties]:
    """Which of the entries equal to the threshold each piece takes: the first `take` of
    them in key order, then by position in the tensor."""
    per_key: dict[int, int] = {}
    for found in group.objects([(pieces[i].key, n) for i, n in mine.items() if n]):
        for key, n in found:
            per_key[key] = per_key.get(key, 0) + n
    every, split, left = set(), None, take
    for key in sorted(per_key):
        if left >= per_key[key]:
            every.add(key)
            left -= per_key[key]
        elif left:
            split = key
            break
    ties = [_Ties(every=p.key in every) for p in pieces]
    if split is None:
        return ties
    # The one tensor the threshold splits: its ties per run, in the tensor's order.
    runs = [
        (run.start, _equal_count(p, work, bound, run) if len(p.runs) > 1 else mine.get(i, 0))
        for i, p in enumerate(pieces)
        if p.key == split and p.counts
        for run in p.runs
    ]
    share: dict[int, int] = {}
    for start, n in sorted(r for found in group.objects(runs) for r in found):
        share[start] = min(n, left)
        left -= share[start]
    for i, p in enumerate(pieces):
        if p.key == split:
            ties[i].per_run = {r: share.get(run.start, 0) for r, run in enumerate(p.runs)}
    return ties


def _refuse_non_finite(
    pieces: Sequence[Piece], owned: list[int], work: torch.dtype, group: Group
) -> None:
    """Raise Unrankable on every rank if any rank's scores hold NaN or infinity."""
    bad = _non_finite_pieces(pieces, owned, work)
    if int(group.sum(torch.tensor([len(bad)], dtype=torch.int64))[0]):
        raise Unrankable(bad)


def _non_finite_pieces(pieces: Sequence[Piece], owned: list[int], work: torch.dtype) -> list[int]:
    bad = []
    for i in owned:
        scores, _ = pieces[i].source()
        if any(not bool(m.isfinite().all()) for _, m, _ in _magnitudes(scores, None, work)):
            bad.append(i)
    return bad
