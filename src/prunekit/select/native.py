"""The binding to the C loop (_native.c): its thread pool, and the split and settle calls.

The extension is optional: `_native` is None where it was not built, and
`loaded()` is None there or while `tuning.native` is off; the one pass then runs
as tensor operations. Each call hands the C code raw addresses of tensors the
caller owns and has checked; the C code runs with the GIL released, so a chunk
is split among threads that work on its parts at once.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from prunekit.select import tuning
from prunekit.select.ties import first

if TYPE_CHECKING:
    from prunekit.select.onepass import Gathered

_native: ModuleType | None
try:  # the one pass as a C loop (_native.c); without it, tensor operations do the same
    from prunekit.select import _native
except ImportError:  # pragma: no cover - not built here
    _native = None

__all__ = [
    "UNSIGNED",
    "Gather",
    "Marks",
    "bits_of",
    "loaded",
    "makes",
    "nth",
    "one_bits",
    "settle",
    "split",
]

UNSIGNED = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Gather:
    """The entries the C loop (or the tensor operations in its place) gathers between the
    bounds, all sources in order: their positions (in their tensor) and magnitudes,
    written in place, never concatenated.

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


def loaded() -> ModuleType | None:
    """The C loop, if it is built and `tuning.native` lets it run."""
    return _native if tuning.get().native else None


def makes(out_dtype: torch.dtype) -> bool:
    """Whether the C loop makes selections of `out_dtype` (1, 2, 4 or 8 bytes, real)."""
    return loaded() is not None and out_dtype.itemsize in UNSIGNED and not out_dtype.is_complex


def bits_of(scores: Tensor, out: Tensor) -> bool:
    """Whether the C loop can write a product from the bits of `scores` (flat) into a
    tensor like `out`: the same dtype, contiguous."""
    return scores.dtype == out.dtype and scores.is_contiguous()


def one_bits(dtype: torch.dtype) -> int:
    """The bits of 1 (True for bool) in `dtype`, read as an unsigned integer."""
    one = torch.ones((), dtype=dtype)
    return int(one.view(UNSIGNED[one.element_size()]).item()) & ((1 << 8 * one.element_size()) - 1)


POOL: list[tuple[int, ThreadPoolExecutor]] = []  # the C loop's threads (how many), once made


def _pool(workers: int) -> ThreadPoolExecutor:
    """A pool of at least `workers` threads, kept for later calls."""
    if not POOL or POOL[0][0] < workers:
        POOL[:] = [(workers, ThreadPoolExecutor(workers, thread_name_prefix="prunekit"))]
    return POOL[0][1]


os.register_at_fork(after_in_child=POOL.clear)  # the pool's threads do not survive a fork

R = TypeVar("R")


def share(run: Callable[..., R], jobs: Sequence[tuple[Any, ...]], threads: int) -> list[R]:
    """``[run(*job) for job in jobs]`` on up to `threads` threads, this one included. The
    pool's threads take jobs as they get to run; this one takes whatever is left, and waits
    only for jobs another thread has begun: on a machine whose other cores are busy, a pool
    thread that is not scheduled costs nothing (this one does its jobs) instead of the
    wait for a time slice."""
    results: list[R | None] = [None] * len(jobs)
    order = iter(range(len(jobs)))
    lock = threading.Lock()

    def take() -> None:
        while True:
            with lock:
                index = next(order, None)
            if index is None:
                return
            results[index] = run(*jobs[index])

    helpers = min(threads, len(jobs)) - 1
    pending = [_pool(helpers).submit(take) for _ in range(helpers)] if helpers > 0 else []
    try:
        take()
    finally:
        for future in pending:
            if not future.cancel():  # begun: its job is under way (or done)
                future.result()
    return results  # type: ignore[return-value]  # every job ran, or this raised


@dataclass(frozen=True)
class Marks:
    """What the C loop writes and compares in one count pass.

    Attributes:
        chosen: the bits `out` gets where chosen, read as an unsigned integer.
        other: the bits `out` gets where not chosen.
        bounds: (lower, mid, upper), see ``onepass.CountPass``.
        signed: the scores themselves are compared and gathered, not their magnitudes.
    """

    chosen: int
    other: int
    bounds: tuple[float, float, float]
    signed: bool = False


def split(
    scores: Tensor,
    flags: Tensor | None,
    out: Tensor,
    marks: Marks,
    gather: Gather,
    base: int,
    product: tuple[Tensor, Tensor] | None = None,
) -> tuple[int, int, bool]:
    """One chunk through the C loop, in as many parts as `tuning.threads()` allows (each
    at least `tuning.part` entries): the parts run at once, the GIL released. The entries
    between `marks`' lower and upper bounds are appended to `gather`, their positions
    counted from `base` (which must have room for the chunk). With `product`, (orig, into):
    writes orig x out into `into`, both of out's dtype.

    Returns how many entries compete, how many are below, and whether all scores are
    finite.
    """
    c = loaded()
    assert c is not None
    now = tuning.get()
    n = scores.numel()
    count = max(1, min(now.threads(), n // now.part))
    parts = list(itertools.pairwise(n * i // count for i in range(count + 1)))
    at = gather.size  # each part gathers from at + its start, then they close ranks
    alive_one = 0 if flags is None else one_bits(flags.dtype)
    positions, values = gather.positions, gather.values

    def run(start: int, end: int) -> tuple[int, int, int, bool]:
        tally: tuple[int, int, int, bool] = c.split(
            scores.data_ptr() + start * scores.element_size(),
            scores.element_size(),
            0 if flags is None else flags.data_ptr() + start * flags.element_size(),
            0 if flags is None else flags.element_size(),
            alive_one,
            out.data_ptr() + start * out.element_size(),
            out.element_size(),
            marks.chosen,
            marks.other,
            0 if product is None else product[0].data_ptr() + start * out.element_size(),
            0 if product is None else product[1].data_ptr() + start * out.element_size(),
            end - start,
            *marks.bounds,
            positions.data_ptr() + (at + start) * positions.element_size(),
            values.data_ptr() + (at + start) * values.element_size(),
            base + start,
            *((True,) if marks.signed else ()),  # magnitudes: the call as before signed ranking
        )
        return tally

    tallies = share(run, parts, count)
    _close_ranks(
        gather, at, [(start, tally[1]) for (start, _), tally in zip(parts, tallies, strict=True)]
    )
    return (
        sum(tally[2] for tally in tallies),
        sum(tally[0] for tally in tallies),
        all(tally[3] for tally in tallies),
    )


def _close_ranks(gather: Gather, at: int, found: list[tuple[int, int]]) -> None:
    """Move what each part gathered (from `at` + its start: (start, how many)) down next to
    what the part before it gathered, and set the gather's size past the last."""
    positions, values = gather.positions, gather.values
    end = at
    for start, size in found:
        if size and at + start != end:  # move down next to the part before
            source = slice(at + start, at + start + size)
            overlap = end + size > at + start
            positions[end : end + size] = (
                positions[source].clone() if overlap else positions[source]
            )
            values[end : end + size] = values[source].clone() if overlap else values[source]
        end += size
    gather.size = end


def nth(values: Tensor, rank: int, signed: bool = False) -> tuple[float, int]:
    """The `rank`-th smallest (1-based) of contiguous float32 or float64 `values`, through
    the C loop (its histograms of the bits of magnitudes, the values left as they are), and
    how many entries equal to it are among the `rank` smallest. With `signed` (values of
    either sign, whose bits do not order them), kthvalue finds it."""
    if signed:
        kth: float = values.kthvalue(rank)[0].item()
    else:
        c = loaded()
        assert c is not None
        kth = c.kth(values.data_ptr(), values.element_size(), values.numel(), rank - 1)
    return kth, rank - int((values < kth).sum())


def settle(
    gathered: list[Gathered], values: Tensor, rank: int, hit: bool, mid: float, signed: bool
) -> None:
    """Choose the `rank` smallest of the entries in between (all sources in order) through
    the C loop: from the k-th smallest value and how many of its ties each source takes
    (the earlier sources first), each source's entries in between are settled in one go,
    sources side by side on the pool's threads (the one pass marked those below `mid` as
    chosen)."""
    c = loaded()
    assert c is not None
    kth, left = nth(values, rank, signed)
    ends = itertools.accumulate((entry.where.numel() for entry in gathered), initial=0)
    mine = [values[start:end] for start, end in itertools.pairwise(ends)]
    ties = first((int((part == kth).sum()) for part in mine), left)
    jobs = list(zip(gathered, mine, ties, strict=True))

    def run(entry: Gathered, mine: Tensor, take: int) -> None:
        out, product, scores = entry.out, entry.product, entry.scores
        one = one_bits(out.dtype)
        fused = scores is not None and bits_of(scores, out)
        c.settle(
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

    now = tuning.get()  # threads by size: each at least `part` entries in between
    share(run, jobs, max(1, min(now.threads(), len(jobs), values.numel() // now.part)))
    for entry in gathered:  # here: the caller's modes (inference mode) are per thread
        scores, product = entry.scores, entry.product
        if product is not None and scores is not None and not bits_of(scores, entry.out):
            torch.mul(scores, entry.out, out=product)
