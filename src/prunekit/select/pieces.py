"""The engine's strategy of the one driver (engine.run): the k smallest magnitudes (or, in
one process, values) of tensors in pieces, over a group of processes, one threshold and the
ties it takes found in a few passes, never holding the model.

Every selection of CPU torch floats runs here (see prunekit.select): whole tensors in one process
(smallest_k_many, each tensor a piece, the group Alone), tensors held by several processes
(prunekit.distributed) or streamed from disk (io/sharded.py). The pieces rank as one list
ordered by `Piece.key` (a tensor's place in the model), then by the global flat position
inside the tensor. A piece is a tensor, or a part of one (a DTensor shard) made of `Run`\\ s,
stretches contiguous both in the piece and in the whole tensor.

What travels between processes does not grow with the model: an evenly spaced sample (about
2**17 magnitudes in all), counts, and histograms of at most 65536 bins. Scores all of one
16-bit format (bfloat16, float16) need no sample when marked later: one pass of histograms
of their bits, which are their values, finds the threshold (the shortcut step). Otherwise,
the steps `Bits` makes for the driver:

1. sample: two order statistics of the sample enclose the k-th smallest magnitude with near
   certainty, its best guess between them (sample.guess);
2. count: one pass counts the entries below the lower bound and keeps, locally, the
   magnitudes in between (a small share); the counts are summed (passes.between);
3. refine: the k-th value among those kept (native.nth in one process, else histograms of
   their bits summed over the ranks); where the bounds missed, the same histograms run over
   the scores themselves (two passes for float32);
4. ties: entries equal to the threshold are taken in order: per tensor the counts are
   gathered, and within the one tensor the threshold splits, per run;
5. mark: choosing is then local, one piece at a time as asked (`Selection`): below the
   threshold, or among the ties a run takes.

With `Marks` (whole tensors in one process), the count pass also writes every selection
around the guess, and where the guess held, steps 3 to 5 are the settling of the entries
gathered (onepass.settle): the scores are read once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from prunekit.select import engine, native, onepass, passes, sample, strategy, trace, tuning
from prunekit.select.chunks import Chunks
from prunekit.select.engine import Cut
from prunekit.select.inputs import (
    Count,
    Source,
    alive_count,
    competing,
    count_of,
    refuse_non_finite,
    refusing_meta,
)
from prunekit.select.native import Gather
from prunekit.select.passes import Buffers, Marks
from prunekit.select.process_group import Group
from prunekit.select.radix import pick
from prunekit.select.sample import Bounds
from prunekit.select.strategy import Route
from prunekit.select.ties import first

__all__ = ["Bits", "Marks", "Piece", "Run", "Selection", "Unrankable", "select"]


class Unrankable(ValueError):
    """Some competing scores are NaN or infinite; `pieces` are the local ones that hold
    them."""

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
    """The threshold and the ties each piece takes; marks one piece at a time, through
    the count pass (onepass.split), with the bounds set about the threshold. With `held`,
    the selections the count pass wrote (see select's `marks`), as they are. `k` and
    `total`: how many were chosen among how many competing (None: not known here);
    `finite`: every competing score was read and found finite."""

    def __init__(
        self,
        pieces: Sequence[Piece],
        route: Route,
        bound: float,
        ties: list[_Ties],
        *,
        total: int | None = None,
        k: int | None = None,
        finite: bool = False,
        held: list[Tensor] | None = None,
    ) -> None:
        self.pieces = pieces
        self.route = route
        self.bound = bound
        self.ties = ties or [_Ties() for _ in pieces]
        self.total = total
        self.k = k
        self.finite = finite
        self.held = held
        self._chunks: Chunks | None = None

    def masks(self, keep_dtype: torch.dtype | None) -> Iterator[Tensor]:
        """Every piece's selection in order: flat bools (True: chosen), or with
        `keep_dtype` masks of that dtype (0: chosen)."""
        if self.held is not None:
            yield from self.held
            return
        for index in range(len(self.pieces)):
            yield self.chosen(index) if keep_dtype is None else self.keep(index, keep_dtype)

    def kept(self, index: int) -> Iterator[tuple[int, Tensor]]:
        """(start, chunk) over the piece `index` in order: 0/1 floats, 0 where chosen.
        A chunk is valid until the next one."""
        chunks = self._reader()
        room = min(max(chunks.step, chunks.chunk), self.pieces[index].numel)
        out = torch.empty(room, dtype=self.route.work)
        for start, n in self._marked(index, out, False, True):
            yield start, out[:n]

    def chosen(self, index: int) -> Tensor:
        """A flat bool tensor, True at the piece's entries chosen."""
        out = torch.empty(self.pieces[index].numel, dtype=torch.bool)
        for _ in self._marked(index, out, True, False):
            pass
        return out

    def keep(self, index: int, dtype: torch.dtype) -> Tensor:
        """A flat mask of `dtype`: 0 at the entries chosen, 1 elsewhere."""
        out = torch.empty(self.pieces[index].numel, dtype=dtype)
        for _ in self._marked(index, out, False, False):
            pass
        return out

    def _reader(self) -> Chunks:
        if self._chunks is None:
            self._chunks = Chunks(self.route)
        return self._chunks

    def _marked(
        self, index: int, out: Tensor, hit: bool, window: bool
    ) -> Iterator[tuple[int, int]]:
        """Mark the piece's selection into `out` (`hit` where chosen, else 1 - `hit`; with
        `window`, `out` is a chunk's room, reused), yielding each chunk's start and size
        once it is marked: the count pass with the bounds about the threshold marks those
        below it (or up to it, when the piece takes all its ties) and gathers the ties the
        piece takes in part, marked after in each run's order. A NaN threshold (scores
        not checked rank NaN last) chooses every real score, and its ties are the NaN."""
        piece, ties = self.pieces[index], self.ties[index]
        left = {r: n for r, n in ties.per_run.items() if n}
        bound = self.bound
        nan = math.isnan(bound)
        # Chosen: below `lower` (tensor operations) or `mid` (the C loop), the same here;
        # gathered: in [lower, upper], the ties when some are taken in part, or all of
        # them at infinity (no float lies above it to compare with).
        every_infinite = (ties.every and bound == math.inf) or nan
        if nan:
            bounds = (math.inf, math.inf, math.inf)
        elif ties.every and not every_infinite:
            up = _next_up(bound, self.route.work)
            bounds = (up, up, -math.inf)
        else:
            bounds = (bound, bound, bound if left or every_infinite else -math.inf)
        chunks = self._reader()
        gather = Gather(min(max(chunks.step, chunks.chunk), piece.numel), self.route.work)
        scores, alive = piece.source()
        sweep = onepass.CountPass(bounds, hit, gather, window=window)
        parts = onepass.split(chunks, scores, alive, out, sweep)
        for part in parts:
            found = gather.positions[: gather.size]
            gather.size = 0
            if every_infinite:
                out[found - part.start if window else found] = hit
            if nan:
                found = _nans(scores, alive, part.start, part.size)
                if ties.every:
                    out[found - part.start if window else found] = hit
            for r in [r for r, count in left.items() if count]:
                run = piece.runs[r]
                inside = found[(found >= run.local) & (found < run.local + run.length)]
                where = inside[: left[r]]
                out[where - part.start if window else where] = hit
                left[r] -= where.numel()
            yield part.start, part.size


def _nans(scores: Tensor, alive: Tensor | None, start: int, size: int) -> Tensor:
    """The positions of the competing NaN among entries start:start+size of a piece."""
    span = slice(start, start + size)
    nan = scores.detach().reshape(-1)[span].isnan()
    if alive is not None:
        nan &= alive.reshape(-1)[span] == 1
    return nan.nonzero().reshape(-1).add_(start)


def _next_up(value: float, dtype: torch.dtype) -> float:
    """The least float of `dtype` above `value` (so that below it is up to `value`)."""
    here = torch.tensor(value, dtype=dtype)
    return float(torch.nextafter(here, torch.tensor(math.inf, dtype=dtype)))


def select(
    pieces: Sequence[Piece],
    count: Count,
    group: Group,
    total: int | None = None,
    marks: Marks | None = None,
    signed: bool = False,
    owner: str = "select",
) -> Selection:
    """Choose ``count(total)`` entries among the `total` competing in all pieces of all
    ranks: those of smallest magnitude (with `signed`, of smallest value: whole tensors
    in one process), ties by key, then position in the tensor.

    Every rank calls it with its own pieces. Raises Unrankable (on every rank) if a
    competing score is NaN or infinite, after any error `count` raises; what lies behind
    the flags never counts, whatever it holds. `total`, if known, is how
    many compete in all (else counted first, or in the count pass with `marks`).

    With `marks` (whole tensors in one process), the count pass also writes every
    selection around the sampled guess, settled after when the guess holds; scores
    that are not finite are then refused only as `marks` asks, NaN ranking last.

    A piece whose source gives scores or flags on the meta device raises ValueError
    naming `owner` (the caller's entry point) and the piece, before the C loop reads them.
    """
    checked = [
        replace(piece, source=refusing_meta(piece.source, f"pieces[{i}]", owner))
        for i, piece in enumerate(pieces)
    ]
    return engine.run(Bits(checked, group, total, marks, signed), count)


class Bits:
    """The engine's steps of engine.run (see the module): CPU torch floats in pieces over
    a group, read through the count pass, refined from histograms of their bits."""

    def __init__(
        self,
        pieces: Sequence[Piece],
        group: Group,
        total: int | None,
        marks: Marks | None,
        signed: bool = False,
    ) -> None:
        formats = _formats(pieces, group)
        owned = [i for i, p in enumerate(pieces) if p.counts]
        known = total is not None or marks is not None
        competing_here = 0 if known else sum(_competing(pieces[i]) for i in owned)
        mine = [sum(pieces[i].numel for i in owned), competing_here]
        size, counted = (int(v) for v in group.sum(torch.tensor(mine, dtype=torch.int64)))
        # The work buffers' size: every piece is marked, replicas another rank counts too.
        largest = max((p.numel for p in pieces), default=0)
        dtype = functools.reduce(torch.promote_types, formats) if formats else torch.float32
        self.pieces = pieces
        self.group = group
        self.marks = marks
        self.owned = owned
        self.formats = formats
        self.given = total  # as the caller knew it
        self.total = total if known else counted
        self.k: int | None = None
        self.finite = False  # every competing score read by the count pass, found finite
        self.route = Route(True, dtype, size, largest, signed=signed)
        self.buffers = Buffers(self.route.work, signed=signed)
        self.limits = (0.0, 0.0, math.inf)
        self.found: passes.Counted | None = None

    def all_or_none(self, k: int, total: int, found: passes.Counted | None) -> Selection:
        """None chosen, or all: known first, the scores checked here; known from the
        count pass (only when the caller did not know the total), checked there."""
        if self.given is None and self.marks is not None:
            return Selection(self.pieces, self.route, 0.0, [], total=total, k=k, finite=self.finite)
        return _all_or_none(self.pieces, self.owned, self.route, k, total, self.group, self.marks)

    def shortcut(self, k: int | None) -> Selection | None:
        """Scores all of one 16-bit format, marked later: their bits' histograms."""
        one = len(self.formats) == 1 and self.formats[0] in passes.INFINITY
        if self.marks is None and one and not self.route.signed:
            assert k is not None  # 16-bit: the bits are the values
            return _in_16_bits(self.pieces, self.owned, self.route, k, self.group)
        return None

    def guess(self, k: Count, total: int | None) -> Bounds | None:
        sources = [self.pieces[i].source for i in self.owned]
        if self.route.signed:
            return sample.guess(sources, k, total, self.route, self.group, magnitude=False)
        return sample.guess(sources, k, total, self.route, self.group)

    def count(self, bounds: Bounds | None) -> passes.Counted | None:
        """The count pass about `bounds` (without a guess: over no bounds, unless marks
        want one: then nothing to mark around, and no pass)."""
        if bounds is None and self.marks is not None:
            return None
        if bounds is not None:
            self.limits = (bounds[0], bounds[1], bounds[2])
        route, now = self.route, tuning.get()
        if self.marks is not None:
            budget = strategy.budget(route)
        else:
            size = route.size
            budget = size if size <= now.guess else max(size // now.gather_share, now.guess)
        found = passes.between(
            self.pieces, self.owned, Chunks(route), self.limits, budget, self.group, self.marks
        )
        if found.nonfinite and self.marks is None:
            raise Unrankable(passes.non_finite(self.pieces, self.owned))
        self.found = found
        return found

    def known(
        self, found: passes.Counted | None, count: Count, k: int | None, total: int | None
    ) -> tuple[int, int]:
        """k and total, counted in the pass (with marks) or now; with marks asking, the
        scores checked where the pass could not say they are finite."""
        if k is None or total is None:  # with marks: counted in the pass, or now
            counted = found.competing if found is not None and found.competing >= 0 else -1
            total = counted if counted >= 0 else competing([p.source for p in self._owned()])
            k = count_of(count, total)
        self.finite = found is not None and found.finite
        if self.marks is not None and self.marks.finite and not self.finite:
            # not read in full, or not finite: the exact check says
            refuse_non_finite([p.source for p in self._owned()])
        self.total, self.k = total, k
        return k, total

    def one_read(self, found: passes.Counted, rank: int) -> Selection | None:
        """With marks: the one read, its marks settled."""
        if self.marks is None:
            return None
        keep = self.marks.keep_dtype is None
        signed = self.route.signed
        limit = self.limits[1]
        onepass.settle(found.marked, found.values, rank, keep, limit, signed, self.marks.rank)
        trace.note("one pass")
        outs = [entry.out for entry in found.marked]
        return Selection(
            self.pieces,
            self.route,
            0.0,
            [],
            total=self.total,
            k=self.k,
            finite=self.finite,
            held=outs,
        )

    def nth(self, found: passes.Counted, rank: int) -> Cut:
        """The k-th value among those kept: ranked at once where all are here, else from
        their bits' histograms over the ranks."""
        work, signed = self.route.work, self.route.signed
        if signed or (self.group.size == 1 and native.loaded() is not None):
            bound, take = native.nth(found.values, rank, signed)  # signed: one process
            return Cut(bound, take)
        keys = lambda: passes.held_keys(found.held, work)  # noqa: E731
        key, take, _ = passes.radix(keys, rank, work, self.group)
        return Cut(passes.as_float(key, work), take)

    def search(self, found: passes.Counted | None, k: int) -> Cut:
        """The k-th value from histograms of the scores' bits."""
        if self.marks is not None and found is not None:
            trace.note("one pass missed")
        self.found = None  # its ties are counted over the scores
        work, pieces, owned, buffers = self.route.work, self.pieces, self.owned, self.buffers
        negative = None
        if self.route.signed:  # the negative scores' magnitudes ranked the other way
            below_zero = passes.negatives(pieces, owned, buffers)
            negative = int(self.group.sum(torch.tensor([below_zero]))[0])
        side = None if negative is None else k <= negative
        keys = lambda: passes.data_keys(pieces, owned, buffers, side)  # noqa: E731
        if negative is not None and k <= negative:  # the k-th is the m-th greatest of them
            key, taken, equal = passes.radix(keys, negative - k + 1, work, self.group)
            return Cut(-passes.as_float(key, work), equal - taken + 1, equal)
        key, take, equal = passes.radix(keys, k - (negative or 0), work, self.group)
        value = passes.as_float(key, work)
        if math.isnan(value):  # NaN ranks last (marks): its ties are every NaN, any bits
            assert self.total is not None
            real = int(self.group.sum(torch.tensor([passes.real_count(pieces, owned, buffers)])))
            return Cut(value, k - real, self.total - real)
        return Cut(value, take, equal)

    def selection(self, cut: Cut, k: int, total: int) -> Selection:
        """The threshold and the ties each piece takes."""
        assert cut.value is not None  # scores are finite here
        bound, pieces = cut.value, self.pieces
        finite = self.finite
        if self.found is not None:  # ties among those kept
            held = self.found.held
            ties = {i: int((values == bound).sum()) for i, values in held.items()}
            shared = _share_ties(pieces, ties, cut.take, self.buffers, bound, self.group)
        elif cut.take == cut.equal:  # every tie is taken: no need to count them per piece
            shared = [_Ties(every=True) for _ in pieces]
        else:
            ties = {i: passes.equal_count(pieces[i], self.buffers, bound) for i in self.owned}
            shared = _share_ties(pieces, ties, cut.take, self.buffers, bound, self.group)
        return Selection(pieces, self.route, bound, shared, total=total, k=k, finite=finite)

    def _owned(self) -> list[Piece]:
        return [self.pieces[i] for i in self.owned]


def _all_or_none(
    pieces: Sequence[Piece],
    owned: list[int],
    route: Route,
    k: int,
    total: int,
    group: Group,
    marks: Marks | None,
) -> Selection:
    """None of the competing entries chosen (k = 0), or all of them; the scores checked."""
    if marks is None:
        bad = passes.non_finite(pieces, owned)
        if int(group.sum(torch.tensor([len(bad)]))[0]):
            raise Unrankable(bad)
    elif marks.finite:
        refuse_non_finite([pieces[i].source for i in owned])
    bound = math.inf if k else 0.0
    return Selection(pieces, route, bound, [_Ties() for _ in pieces], total=total, k=k)


def _in_16_bits(
    pieces: Sequence[Piece], owned: list[int], route: Route, k: int, group: Group
) -> Selection:
    """Scores all of one 16-bit format: one pass of histograms of their bits, which are
    their values, finds the threshold; no sample."""
    fmt = route.dtype
    hist, held, nonfinite = passes.histograms(pieces, owned, fmt, group)
    if nonfinite:
        raise Unrankable(passes.non_finite(pieces, owned))
    key, take, _ = pick(hist, k)
    bound = passes.as_float(key, fmt)
    ties = {i: int(h[key]) for i, h in held.items()}
    buffers = Buffers(route.work)
    shared = _share_ties(pieces, ties, take, buffers, bound, group)
    return Selection(pieces, route, bound, shared)


def _competing(piece: Piece) -> int:
    if piece.competing is not None:
        return piece.competing
    return alive_count(*piece.source())


def _formats(pieces: Sequence[Piece], group: Group) -> list[torch.dtype]:
    """The float formats of the scores on all ranks."""
    known = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    here = torch.tensor([int(any(p.dtype == d for p in pieces)) for d in known])
    return [d for d, n in zip(known, group.sum(here).tolist(), strict=True) if n]


def _share_ties(
    pieces: Sequence[Piece],
    mine: dict[int, int],
    take: int,
    buffers: Buffers,
    bound: float,
    group: Group,
) -> list[_Ties]:
    """Which of the entries equal to the threshold each piece takes: the first `take` of
    them in key order, then by position in the tensor."""
    per_key: dict[int, int] = {}
    for found in group.objects([(pieces[i].key, n) for i, n in mine.items() if n]):
        for key, n in found:
            per_key[key] = per_key.get(key, 0) + n
    order = sorted(per_key)
    taken = dict(zip(order, first((per_key[key] for key in order), take), strict=True))
    every = {key for key in order if taken[key] == per_key[key]}
    split = next((key for key in order if 0 < taken[key] < per_key[key]), None)
    left = 0 if split is None else taken[split]
    ties = [_Ties(every=p.key in every) for p in pieces]
    if split is None:
        return ties
    # The one tensor the threshold splits: its ties per run, in the tensor's order.
    runs = [
        (run.start, _run_ties(p, run, buffers, bound) if len(p.runs) > 1 else mine.get(i, 0))
        for i, p in enumerate(pieces)
        if p.key == split and p.counts
        for run in p.runs
    ]
    found = sorted(r for ranks in group.objects(runs) for r in ranks)
    share = dict(
        zip((start for start, _ in found), first((n for _, n in found), left), strict=True)
    )
    for i, p in enumerate(pieces):
        if p.key == split:
            ties[i].per_run = {r: share.get(run.start, 0) for r, run in enumerate(p.runs)}
    return ties


def _run_ties(piece: Piece, run: Run, buffers: Buffers, bound: float) -> int:
    return passes.equal_count(piece, buffers, bound, (run.local, run.local + run.length))
