"""The portable path: plain tensor methods a chunk at a time, for any framework and device.

It serves whatever the fast path does not (TensorPlay tensors, other devices,
other dtypes, negative scores ranked by value, small inputs) with methods both
frameworks share. Scores are read `tuning.portable_chunk` entries at a time
(tensors smaller than that share a chunk), so beyond the selections it returns
its work memory is a few chunks and a sample, whatever the model's size: no more
than a chunk's worth of scores is ever concatenated.

When everything fits one chunk, it is read once and ranked as one vector
(kthvalue, or a stable sort when tiny). Otherwise the k-th smallest value is
found in rounds. Two pivots come from a sample; one pass counts the entries in
question below and at each, and gathers those in between while they fit. The
k-th value then lies below, at, between or above the pivots: a round either
settles it or narrows the values in question to one side, leaving the pivots'
entries out (so the rounds end). The first pivots come from an evenly spaced
sample, as the fast path's guess; later ones from a sample of the entries in
between, taken in the same pass. A last pass marks the entries below that value
and its first ties, in order. NaN ranks last, as in a sort (callers check
scores first; this only keeps the count exact).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from torch import Tensor

from prunekit.core.backend import namespace
from prunekit.select import trace, tuning
from prunekit.select.plan import Route
from prunekit.select.sample import coprime, enclose, places, spaced, stride
from prunekit.select.sources import Source
from prunekit.select.ties import only_first, select_sorted

__all__ = ["portable"]


def portable(
    sources: Sequence[Source], k: int, total: int, magnitude: bool, plan: Route
) -> Iterator[Tensor]:
    """Each source's share of the `k` smallest (0 < k < `total`, the entries competing)."""
    trace.note("portable")
    reader = _Reader(sources, magnitude, plan)
    if plan.size <= reader.chunk:
        return iter(_one_chunk(reader, k))
    return _marked(reader, _find(reader, k, total))


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


@dataclass
class _Cut:
    """The k-th smallest value (None: NaN, above every other) and how many of its ties,
    the first in order, are chosen."""

    value: float | None
    take: int


@dataclass
class _Pivots:
    """Two values in question (a <= b) and how many entries are expected between them."""

    a: float
    b: float
    expected: float


def _find(reader: _Reader, k: int, total: int) -> _Cut:
    """The k-th smallest value among all competing entries, in rounds (see the module).

    The values in question lie strictly between lo and hi (None: no bound); `before`
    competing entries lie below them, and about `count` among them (NaN included while
    there is no upper bound). A round with pivots counts all entries below and at each;
    a round without (after a miss) samples the values in question anew.
    """
    lo: float | None = None
    hi: float | None = None
    before, count = 0, total
    pivots = _pivots(_spaced_sample(reader), k, count, lo, hi)
    while True:
        tally = _tally(reader, lo, hi, pivots, count)
        if pivots is None:
            if k - before > tally.real:  # the k-th is NaN: only while there is no upper bound
                return _Cut(None, k - before - tally.real)
            if tally.inner is not None:
                return _cut_of(tally.inner, k - before)
            count = tally.real
            pivots = _pivots(tally.sample(), k - before, count, lo, hi)
            continue
        a, b = pivots.a, pivots.b
        if k <= tally.lt_a:
            hi, count, pivots = a, tally.lt_a - before, None
        elif k <= tally.le_a:
            return _Cut(a, k - tally.lt_a)
        elif k <= tally.lt_b:
            lo, hi, count, before = a, b, tally.lt_b - tally.le_a, tally.le_a
            if tally.inner is not None:
                return _cut_of(tally.inner, k - before, lo, hi)
            pivots = _pivots(tally.sample(), k - before, count, lo, hi)
        elif k <= tally.le_b:
            return _Cut(b, k - tally.lt_b)
        else:
            lo, count, before, pivots = b, before + count - tally.le_b, tally.le_b, None


def _cut_of(
    gathered: list[Tensor], rank: int, lo: float | None = None, hi: float | None = None
) -> _Cut:
    """The cut at the `rank`-th smallest of the gathered values (all real) strictly
    between lo and hi, if given."""
    values = gathered[0] if len(gathered) == 1 else namespace(gathered[0]).cat(gathered)
    if lo is not None or hi is not None:
        values = values[_in_question(values, lo, hi)]
    kth = values.kthvalue(rank)[0].item()
    return _Cut(kth, rank - int((values < kth).sum()))


def _spaced_sample(reader: _Reader) -> Tensor:
    """An evenly spaced sample of about `tuning.sample` competing values, NaN left out."""
    step = stride(reader.size, tuning.get().sample)
    sample = spaced(reader.sources, step, reader.dtype, reader.magnitude).values
    assert sample is not None  # the portable path has sources
    return sample[sample == sample]


def _pivots(
    sample: Tensor, rank: int, count: int, lo: float | None, hi: float | None
) -> _Pivots | None:
    """Sample values strictly between lo and hi, either side of the `rank`-th of `count`
    there (a margin of `tuning.spread` standard deviations), or None for an empty sample.
    """
    sample = sample[_in_question(sample, lo, hi)]
    size = sample.numel()
    if not size:
        return None
    a, b = enclose(sample, [min(rank / max(count, 1), 1.0)], inside=True)
    low, high = places([min(rank / max(count, 1), 1.0)], size)
    low, high = min(max(low, 1), size), min(max(high, 1), size)
    return _Pivots(a, b, max(high - low, 1) / size * count)


def _in_question(values: Tensor, lo: float | None, hi: float | None) -> Tensor:
    """Where `values` lie strictly between lo and hi (None: no bound), NaN never."""
    if lo is None:
        return values == values if hi is None else values < hi
    if hi is None:
        return values > lo
    return (values > lo) & (values < hi)


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
    def le_a(self) -> int:
        return self.lt_a + self.eq_a

    @property
    def lt_b(self) -> int:
        return self.le_b - self.eq_b

    def sample(self) -> Tensor:
        parts = self.sampled
        return parts[0] if len(parts) == 1 else namespace(parts[0]).cat(parts)


def _tally(
    reader: _Reader, lo: float | None, hi: float | None, pivots: _Pivots | None, count: int
) -> _Tally:
    """The pass of one round (see _Tally)."""
    most = max(1, tuning.get().sample)
    expected = count if pivots is None else pivots.expected
    tally = _Tally(coprime(max(1, math.ceil(expected / most))))
    for chunk in reader.chunks():
        values = _competing(chunk)
        if pivots is None:
            inner = values[_in_question(values, lo, hi)]
            tally.real += inner.numel()
        else:
            below_a = values < pivots.a
            tally.lt_a += int(below_a.count_nonzero())
            up_to_b = values <= pivots.b
            tally.le_b += int(up_to_b.count_nonzero())
            # Up to b (never NaN) and not below a: from a to b. Few: their ties are
            # counted among them.
            inner = values[up_to_b & below_a.logical_not()]
            tally.eq_a += int((inner == pivots.a).count_nonzero())
            tally.eq_b += int((inner == pivots.b).count_nonzero())
        tally.add(inner, reader.chunk, most)
    return tally


def _marked(reader: _Reader, cut: _Cut) -> Iterator[Tensor]:
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
