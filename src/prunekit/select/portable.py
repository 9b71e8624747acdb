"""The portable strategy of the one driver (engine.run): plain tensor methods a chunk at a
time, for any framework and device.

It serves whatever the engine's strategy (pieces.Bits) does not (TensorPlay tensors,
other devices, other dtypes, small inputs), by magnitude or by signed value, with
methods both frameworks share. Scores are read `tuning.portable_chunk` entries at a time
(tensors smaller than that share a chunk), so beyond the selections it returns its work
memory is a few chunks and a sample, whatever the model's size: no more than a chunk's
worth of scores is ever concatenated.

Its steps, as the driver calls them: the shortcut, when everything fits one chunk (read
once, ranked as one vector: kthvalue, or a stable sort when tiny); the guess, two
values of an evenly spaced sample (sample.guess, `inside`); the count pass, which counts
the entries in question below and at each and gathers those in between while they fit
(else samples them); the k-th value, among those gathered, or where they did not hold
it, in rounds: the k-th value lies below, at, between or above the pivots, so a round
either settles it or narrows the values in question to one side, leaving the pivots'
entries out (so the rounds end), its pivots from a sample of the values in question
(sample.within). The marks are made in chunk order, the first ties taken as they come.
NaN ranks last, as in a sort (callers check scores first; this only keeps the count
exact).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from prunekit.core.backend import namespace
from prunekit.select import sample, trace, tuning
from prunekit.select.engine import Cut
from prunekit.select.inputs import Count, Source, all_or_none, complement
from prunekit.select.process_group import Alone
from prunekit.select.sample import Bounds, coprime, in_question, within
from prunekit.select.strategy import Route
from prunekit.select.ties import only_first, select_sorted

__all__ = ["Ordered", "Portable"]


class Ordered:
    """A selection of the portable strategy: made already (`made`, bools), or marked
    source by source as asked, in order (below `cut`, then its first ties in order)."""

    held: list[Tensor] | None = None  # none written ahead: made in the dtype asked for

    def __init__(
        self,
        k: int,
        total: int,
        made: list[Tensor] | None = None,
        reader: _Reader | None = None,
        cut: Cut | None = None,
    ) -> None:
        self.k: int | None = k
        self.total: int | None = total
        self._made = made
        self._reader = reader
        self._cut = cut

    def masks(self, keep_dtype: torch.dtype | None) -> Iterator[Tensor]:
        """Every source's selection in order: flat bools (True: chosen), or with
        `keep_dtype` masks of that dtype (0: chosen). Read once."""
        if self._made is not None:
            return complement(iter(self._made), keep_dtype)
        assert self._reader is not None and self._cut is not None
        return complement(_marked(self._reader, self._cut), keep_dtype)


class Portable:
    """The steps of engine.run for `sources` in plain tensor methods (see the module):
    `total` competing entries in all, ranked by magnitude or by value."""

    def __init__(self, sources: Sequence[Source], plan: Route, magnitude: bool, total: int) -> None:
        trace.note("portable")
        self.sources = sources
        self.plan = plan
        self.magnitude = magnitude
        self.total: int | None = total
        self.reader = _Reader(sources, magnitude, plan)

    def all_or_none(self, k: int, total: int, found: _Tally | None) -> Ordered:
        trace.note("all or none")
        return Ordered(k, total, list(all_or_none(self.sources, k > 0, None)))

    def shortcut(self, k: int | None) -> Ordered | None:
        if self.plan.size > self.reader.chunk:
            return None
        assert k is not None and self.total is not None
        return Ordered(k, self.total, _one_chunk(self.reader, k))

    def guess(self, k: Count, total: int | None) -> Bounds | None:
        group = Alone()
        return sample.guess(
            self.sources, k, total, self.plan, group, inside=True, magnitude=self.magnitude
        )

    def count(self, bounds: Bounds | None) -> _Tally:
        assert self.total is not None
        return _tally(self.reader, None, None, bounds, self.total)

    def known(
        self, found: _Tally | None, count: Count, k: int | None, total: int | None
    ) -> tuple[int, int]:
        assert k is not None and total is not None  # known before
        return k, total

    def one_read(self, found: _Tally, rank: int) -> Ordered | None:
        return None  # the count pass writes no marks

    def nth(self, found: _Tally, rank: int) -> Cut:
        assert found.inner is not None
        return _cut_of(found.inner, rank)

    def search(self, found: _Tally | None, k: int) -> Cut:
        assert found is not None and self.total is not None
        return _rounds(self.reader, k, self.total, found)

    def selection(self, cut: Cut, k: int, total: int) -> Ordered:
        return Ordered(k, total, reader=self.reader, cut=cut)


@dataclass
class _Piece:
    """Entries start:stop of source `index`, which holds `size` in all."""

    index: int
    start: int
    stop: int
    size: int


@dataclass
class _Chunk:
    """Values (|scores| with `magnitude`) of one or more pieces, in order, and which compete."""

    values: Tensor
    live: Tensor | None
    pieces: list[_Piece]


class _Reader:
    """Reads the sources in chunks of at most `tuning.portable_chunk` entries: a larger
    tensor in slices, smaller ones several to a chunk."""

    def __init__(self, sources: Sequence[Source], magnitude: bool, plan: Route) -> None:
        self.sources = sources
        self.magnitude = magnitude
        self.dtype = plan.dtype
        self.size = plan.size
        self.chunk = max(1, tuning.get().portable_chunk)

    def values(self, scores: Tensor, start: int, stop: int, step: int = 1) -> Tensor:
        """Entries start:stop:step of `scores` (flat) as compared: |scores| with `magnitude`,
        in the sources' common dtype."""
        flat = scores.detach().reshape(-1)
        if step != 1 or stop - start != flat.numel():
            flat = flat[start:stop:step]
        if self.magnitude:
            flat = flat.abs()
        return flat if flat.dtype == self.dtype else flat.to(self.dtype)

    def chunks(self) -> Iterator[_Chunk]:
        """Every source's entries in order, chunk by chunk (each source called once)."""
        pending: list[_Chunk] = []
        held = 0
        for index, source in enumerate(self.sources):
            scores, alive = source()
            n = scores.numel()
            if n > self.chunk:
                if pending:
                    yield _packed(pending)
                    pending, held = [], 0
                for start in range(0, n, self.chunk):
                    stop = min(n, start + self.chunk)
                    piece = _Piece(index, start, stop, n)
                    yield _Chunk(
                        self.values(scores, start, stop), _live(alive, start, stop), [piece]
                    )
                continue
            if pending and held + n > self.chunk:
                yield _packed(pending)
                pending, held = [], 0
            piece = _Piece(index, 0, n, n)
            pending.append(_Chunk(self.values(scores, 0, n), _live(alive, 0, n), [piece]))
            held += n
        if pending:
            yield _packed(pending)


def _live(alive: Tensor | None, start: int, stop: int, step: int = 1) -> Tensor | None:
    """Flags start:stop:step as bools (True: competes), or None when all compete."""
    if alive is None:
        return None
    flags = alive.reshape(-1)[start:stop:step]
    return flags if flags.dtype == namespace(flags).bool else flags == 1


def _packed(chunks: list[_Chunk]) -> _Chunk:
    """Small tensors' chunks as one (at most a chunk's worth of entries)."""
    if len(chunks) == 1:
        return chunks[0]
    ns = namespace(chunks[0].values)
    values = ns.cat([c.values for c in chunks])
    live = None
    if any(c.live is not None for c in chunks):
        every = [
            ns.ones(c.values.numel(), dtype=ns.bool, device=values.device)
            if c.live is None
            else c.live
            for c in chunks
        ]
        live = ns.cat(every)
    return _Chunk(values, live, [piece for c in chunks for piece in c.pieces])


def _one_chunk(reader: _Reader, k: int) -> list[Tensor]:
    """The selections when every source fits one chunk: read once, ranked as one vector."""
    (chunk,) = reader.chunks()
    values, live = chunk.values, chunk.live
    if live is None:
        chosen = select_sorted(values, k)
    else:
        ns = namespace(values)
        index = live.nonzero().reshape(-1)
        picked = select_sorted(values[index], k)
        chosen = ns.zeros(values.shape, dtype=ns.bool, device=values.device)
        chosen[index] = picked
    out, offset = [], 0
    for piece in chunk.pieces:
        out.append(chosen[offset : offset + piece.size])
        offset += piece.size
    return out


def _rounds(reader: _Reader, k: int, total: int, tally: _Tally) -> Cut:
    """The k-th smallest value among all competing entries, in rounds from the first
    count pass's `tally` (see the module).

    The values in question lie strictly between lo and hi (None: no bound); `before`
    competing entries lie below them, and about `count` among them (NaN included while
    there is no upper bound). A round with pivots counts all entries below and at each;
    a round without (after a miss) samples the values in question anew.
    """
    lo: float | None = None
    hi: float | None = None
    before, count = 0, total
    while True:
        pivots = tally.pivots
        if pivots is None:
            if k - before > tally.real:  # the k-th is NaN: only while there is no upper bound
                return Cut(None, k - before - tally.real)
            if tally.inner is not None:
                return _cut_of(tally.inner, k - before)
            count = tally.real
            pivots = within(tally.sample(), k - before, count, lo, hi)
        else:
            a, b = pivots.lower, pivots.upper
            if k <= tally.lt_a:
                hi, count, pivots = a, tally.lt_a - before, None
            elif k <= tally.le_a:
                return Cut(a, k - tally.lt_a)
            elif k <= tally.lt_b:
                lo, hi, count, before = a, b, tally.lt_b - tally.le_a, tally.le_a
                if tally.inner is not None:
                    return _cut_of(tally.inner, k - before, lo, hi)
                pivots = within(tally.sample(), k - before, count, lo, hi)
            elif k <= tally.le_b:
                return Cut(b, k - tally.lt_b)
            else:
                lo, count, before, pivots = b, before + count - tally.le_b, tally.le_b, None
        tally = _tally(reader, lo, hi, pivots, count)


def _cut_of(
    gathered: list[Tensor], rank: int, lo: float | None = None, hi: float | None = None
) -> Cut:
    """The cut at the `rank`-th smallest of the gathered values (all real) strictly
    between lo and hi, if given."""
    values = gathered[0] if len(gathered) == 1 else namespace(gathered[0]).cat(gathered)
    if lo is not None or hi is not None:
        values = values[in_question(values, lo, hi)]
    kth = values.kthvalue(rank)[0].item()
    return Cut(kth, rank - int((values < kth).sum()))


def _competing(chunk: _Chunk) -> Tensor:
    """The chunk's values with those that do not compete as NaN (floats), or left out,
    so that no comparison counts them."""
    values, live = chunk.values, chunk.live
    if live is None:
        return values
    if values.dtype.is_floating_point:
        marked: Tensor = namespace(values).where(live, values, math.nan)
        return marked
    return values[live]


@dataclass
class _Tally:
    """One round's pass: with pivots, how many competing entries lie below and at each,
    in all; without, how many real values are in question. Those from one pivot to the
    other (or in question) are gathered while they fit, else sampled."""

    stride: int
    pivots: Bounds | None
    real: int = 0
    lt_a: int = 0
    eq_a: int = 0
    le_b: int = 0
    eq_b: int = 0
    inner: list[Tensor] | None = field(default_factory=list)
    held: int = 0
    sampled: list[Tensor] = field(default_factory=list)
    skip: int = 0

    def add(self, inner: Tensor, cap: int, most: int) -> None:
        """Gather `inner` while everything fits `cap`; past it, keep every stride-th only
        (at most about `most` in all)."""
        if self.inner is not None:
            self.inner.append(inner)
            self.held += inner.numel()
            if self.held <= cap:
                return
            pending, self.inner = self.inner, None
        else:
            pending = [inner]
        for part in pending:
            taken = part[self.skip :: self.stride]
            if taken.numel():
                self.sampled.append(taken.clone() if self.stride > 1 else taken)
            self.skip = (self.skip - part.numel()) % self.stride
        if sum(part.numel() for part in self.sampled) > 2 * most:  # more than expected
            self.sampled = [self.sample()[::2].clone()]
            self.stride *= 2

    @property
    def below(self) -> int:
        """Competing entries below the lower pivot (none below the values in question)."""
        return 0 if self.pivots is None else self.lt_a

    @property
    def kept(self) -> int:
        """Entries gathered from one pivot to the other (or in question); -1: sampled."""
        if self.inner is None:
            return -1
        return self.real if self.pivots is None else self.le_b - self.lt_a

    @property
    def le_a(self) -> int:
        return self.lt_a + self.eq_a

    @property
    def lt_b(self) -> int:
        return self.le_b - self.eq_b

    def sample(self) -> Tensor:
        parts = self.sampled
        return parts[0] if len(parts) == 1 else namespace(parts[0]).cat(parts)


def _tally(
    reader: _Reader, lo: float | None, hi: float | None, pivots: Bounds | None, count: int
) -> _Tally:
    """The pass of one round (see _Tally)."""
    most = max(1, tuning.get().sample)
    expected = count if pivots is None else pivots.expected
    tally = _Tally(coprime(max(1, math.ceil(expected / most))), pivots)
    for chunk in reader.chunks():
        values = _competing(chunk)
        if pivots is None:
            inner = values[in_question(values, lo, hi)]
            tally.real += inner.numel()
        else:
            below_a = values < pivots.lower
            tally.lt_a += int(below_a.count_nonzero())
            up_to_b = values <= pivots.upper
            tally.le_b += int(up_to_b.count_nonzero())
            # Up to b (never NaN) and not below a: from a to b. Few: their ties are
            # counted among them.
            inner = values[up_to_b & below_a.logical_not()]
            tally.eq_a += int((inner == pivots.lower).count_nonzero())
            tally.eq_b += int((inner == pivots.upper).count_nonzero())
        tally.add(inner, reader.chunk, most)
    return tally


def _marked(reader: _Reader, cut: Cut) -> Iterator[Tensor]:
    """Each source's selection: the entries below the cut, then its first `cut.take` ties."""
    take = cut.take
    partial: dict[int, Tensor] = {}  # sources spread over several chunks, until complete
    for chunk in reader.chunks():
        values, live = chunk.values, chunk.live
        chosen = values < cut.value if cut.value is not None else values == values
        if live is not None:
            chosen = chosen & live
        if take:
            ties: Tensor = values == cut.value if cut.value is not None else values != values
            if live is not None:
                ties = ties & live
            found = int(ties.sum())
            if found > take:
                ties = only_first(ties, take)
            take -= min(found, take)
            chosen = chosen | ties
        offset = 0
        for piece in chunk.pieces:
            part = chosen[offset : offset + piece.stop - piece.start]
            offset += piece.stop - piece.start
            if piece.start == 0 and piece.stop == piece.size:
                yield part  # the whole tensor in this chunk
                continue
            if piece.index not in partial:
                ns = namespace(part)
                partial[piece.index] = ns.empty(piece.size, dtype=ns.bool, device=part.device)
            partial[piece.index][piece.start : piece.stop] = part
            if piece.stop == piece.size:
                yield partial.pop(piece.index)
