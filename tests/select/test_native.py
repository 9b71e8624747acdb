"""The one pass's C loop (prunekit.select._native) against the same pass in tensor operations."""

from __future__ import annotations

import math
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from prunekit import select
from prunekit.select import native as binding
from prunekit.select import onepass, tuning

native = select._native
needs_native = pytest.mark.skipif(native is None, reason="the C loop is not built")


def test_the_c_loop_is_built() -> None:
    # Installing from source builds it wherever a C compiler is found, as here.
    assert native is not None


def reference(
    scores: torch.Tensor, alive: torch.Tensor | None, lower: float, mid: float, upper: float
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Marked flags (below mid), in-between positions, competing and below-lower counts,
    as tensor operations."""
    magnitudes = scores.abs()
    on = torch.ones_like(scores, dtype=torch.bool) if alive is None else alive == 1
    between = on & (magnitudes >= lower) & (magnitudes <= upper)
    below = int((on & (magnitudes < lower)).sum())
    return on & (magnitudes < mid), between.nonzero().reshape(-1), int(on.sum()), below


def run(
    scores: torch.Tensor,
    alive: torch.Tensor | None,
    out: torch.Tensor,
    chosen: int,
    other: int,
    lower: float,
    upper: float,
    mid: float | None = None,
) -> tuple[int, int, torch.Tensor, torch.Tensor, bool]:
    """The C loop over one chunk: competing and below counts, the positions and values
    gathered, and whether all scores are finite."""
    gather = onepass.Gather(scores.numel() + 5, scores.dtype)
    gather.size = 5  # after entries gathered before
    bounds = (lower, lower if mid is None else mid, upper)
    marks = binding.Marks(chosen, other, bounds)
    competing, below, finite = binding.split(scores, alive, out, marks, gather, 0)
    found = slice(5, gather.size)
    return competing, below, gather.positions[found], gather.values[found], finite


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("out_dtype", [torch.bool, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("size", [1, 7, 2047, 2048, 2049, 10_003])
@pytest.mark.parametrize("flags", [None, torch.bool, torch.bfloat16, torch.float32, torch.int64])
@pytest.mark.parametrize("mid", [0.5, 0.7])
def test_matches_tensor_operations(
    dtype: torch.dtype, out_dtype: torch.dtype, size: int, flags: torch.dtype | None, mid: float
) -> None:
    g = torch.Generator().manual_seed(size)
    scores = torch.randn(size, generator=g, dtype=torch.float64).to(dtype)
    scores[::5] = 0.5  # ties at a bound
    alive = None
    if flags is not None:  # a mask: 1 competes, anything else does not
        alive = (torch.rand(size, generator=g) * 1.4).to(torch.int64).to(flags)
        if flags.is_floating_point:
            alive[1::7] = 0.5
    lower, upper = 0.5, 0.9
    out = torch.full((size,), 7, dtype=out_dtype)  # every entry must be written
    one = int(torch.ones((), dtype=out_dtype).view(binding.UNSIGNED[out.element_size()]))
    hit = out_dtype == torch.bool
    chosen, other = (one, 0) if hit else (0, one)
    competing, below, positions, values, finite = run(
        scores, alive, out, chosen, other, lower, upper, mid
    )
    low, where, want_competing, want_below = reference(scores, alive, lower, mid, upper)
    assert torch.equal(out, (low if hit else ~low).to(out_dtype))
    assert torch.equal(positions, where)
    assert torch.equal(values, scores.abs()[where])
    assert (competing, below, finite) == (want_competing, want_below, True)


@needs_native
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_any_non_finite_score_is_seen_competing_or_not(bad: float) -> None:
    scores = torch.rand(5000)
    alive = torch.ones(5000, dtype=torch.bool)
    alive[4321] = False
    scores[4321] = bad
    out = torch.empty(5000, dtype=torch.bool)
    assert run(scores, alive, out, 1, 0, 0.2, 0.3)[4] is False
    assert run(scores, None, out, 1, 0, 0.2, 0.3)[4] is False
    scores[4321] = 1.0
    assert run(scores, alive, out, 1, 0, 0.2, 0.3)[4] is True


@needs_native
def test_parts_on_threads_give_what_one_part_gives() -> None:
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(100_001, generator=g)
    alive = torch.rand(100_001, generator=g) < 0.5
    out = torch.empty(100_001, dtype=torch.float32)
    whole = run(scores, alive, out, 0, 0x3F800000, 0.3, 0.35)
    whole_out = out.clone()
    with tuning.overridden(part=1000, threads=lambda: 4):
        parted = run(scores, alive, out, 0, 0x3F800000, 0.3, 0.35)
    assert torch.equal(out, whole_out)
    assert parted[:2] == whole[:2] and parted[4] == whole[4]
    assert torch.equal(parted[2], whole[2]) and torch.equal(parted[3], whole[3])


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("distinct", [1, 3, 1000, 10**9])
@pytest.mark.parametrize("spread", [1.0, 1e30])
def test_kth_is_kthvalue(dtype: torch.dtype, distinct: int, spread: float) -> None:
    # Magnitudes (>= 0): few or many distinct values, in a narrow or a huge range, inf too.
    assert native is not None
    g = torch.Generator().manual_seed(distinct)
    values = torch.randint(0, distinct, (70_001,), generator=g).to(dtype) * spread
    values[::1000] = math.inf
    before = values.clone()
    for k in (1, 2, 35_000, 69_999, 70_001):
        got = native.kth(values.data_ptr(), values.element_size(), values.numel(), k - 1)
        assert got == float(values.kthvalue(k)[0])
    assert torch.equal(values, before)


@needs_native
def test_refuses_unknown_widths() -> None:
    assert native is not None
    with pytest.raises(ValueError, match="expected 4 or 8"):
        native.split(0, 2, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0.0, 0.5, 1.0, 0, 0, 0)
    with pytest.raises(ValueError, match="1, 2, 4 or 8"):
        native.split(0, 4, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0.0, 0.5, 1.0, 0, 0, 0)
    with pytest.raises(ValueError, match="1, 2, 4 or 8"):
        native.settle(0, 3, 0, 1, 0, 0, 0, 0, 4, 0, 0.5, 0.5, 0)
    with pytest.raises(ValueError, match="0 <= k < n"):
        native.kth(0, 4, 10, 10)


def _prune_in_child(queue: multiprocessing.Queue) -> None:
    torch.set_num_threads(1)  # torch's own threads do not survive a fork either
    scores = torch.randn(300_000, generator=torch.Generator().manual_seed(0))
    queue.put(select.smallest_k(scores, 1000, magnitude=True).nonzero().reshape(-1).tolist())


@needs_native
def test_a_forked_child_gets_threads_of_its_own() -> None:
    scores = torch.randn(300_000, generator=torch.Generator().manual_seed(0))
    with tuning.overridden(part=1000, threads=lambda: 2):
        want = select.smallest_k(scores, 1000, magnitude=True).nonzero().reshape(-1).tolist()
        assert binding.POOL  # the parent made its pool, whose thread the child will not have
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_prune_in_child, args=(queue,))
        child.start()
        child.join(30)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung on the parent's thread pool")
    assert queue.get(timeout=5) == want


def test_shared_jobs_never_wait_for_a_thread_that_has_not_begun(monkeypatch: Any) -> None:
    # The pool's one thread is held (as on a machine whose other core is busy): the caller
    # runs every job itself and returns without waiting for it.
    pool = ThreadPoolExecutor(1)
    monkeypatch.setattr(binding, "POOL", [(1, pool)])
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(10)

    blocker = binding._pool(1).submit(hold)
    assert held.wait(10)
    try:
        callers = []

        def job(value: int) -> int:
            callers.append(threading.get_ident())
            return value * value

        assert binding.share(job, [(v,) for v in range(6)], 2) == [0, 1, 4, 9, 16, 25]
        assert set(callers) == {threading.get_ident()}
    finally:
        release.set()
        blocker.result()
        pool.shutdown()


def test_shared_jobs_run_on_the_pool_and_raise_their_error() -> None:
    def job(value: int) -> int:
        if value == 3:
            raise ZeroDivisionError("job 3")
        return value

    assert binding.share(job, [(v,) for v in range(3)], 2) == [0, 1, 2]
    with pytest.raises(ZeroDivisionError, match="job 3"):
        binding.share(job, [(v,) for v in range(5)], 2)
