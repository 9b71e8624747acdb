"""The portable path, chunk by chunk, against the concatenating selection it replaced, and its
memory: it never holds the scores of the model at once."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunekit.select import smallest_k, smallest_k_many, trace, tuning

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64]
PORTABLE = {"small": 1 << 62}  # every input takes the portable path


def concatenating(
    scores: list[torch.Tensor], alive: list[torch.Tensor | None], k: int, magnitude: bool
) -> list[torch.Tensor]:
    """The portable path as it was: all sources concatenated, kthvalue (a stable sort up to
    1024 entries), then compares."""
    parts = [s.reshape(-1).abs() if magnitude else s.reshape(-1) for s in scores]
    flat = torch.cat(parts)
    lives = [
        torch.ones(p.numel(), dtype=torch.bool) if a is None else a
        for p, a in zip(parts, alive, strict=True)
    ]
    live = torch.cat(lives)
    index = live.nonzero().reshape(-1)
    values = flat[index]
    if k in (0, values.numel()):  # never asked of it: no selection to make
        picked = torch.full(values.shape, k > 0)
    elif values.numel() <= 1 << 10:
        picked = torch.zeros(values.shape, dtype=torch.bool)
        picked[torch.argsort(values, stable=True)[:k]] = True
    else:
        threshold = values.kthvalue(k)[0]
        below = values < threshold
        missing = k - int(below.sum())
        at = values == threshold
        if int(at.sum()) > missing:
            at = at & (at.cumsum(0) <= missing)
        picked = below | at
    chosen = torch.zeros(flat.shape, dtype=torch.bool)
    chosen[index] = picked
    return list(chosen.split([p.numel() for p in parts]))


def stable_sort(
    scores: list[torch.Tensor], alive: list[torch.Tensor | None], k: int, magnitude: bool
) -> list[torch.Tensor]:
    """The k smallest competing entries by a stable sort (NaN last), ties to the earlier."""
    flat = torch.cat([s.reshape(-1).to(torch.float64) for s in scores])
    if magnitude:
        flat = flat.abs()
    live = torch.cat(
        [
            torch.ones(s.numel(), dtype=torch.bool) if a is None else a
            for s, a in zip(scores, alive, strict=True)
        ]
    )
    index = live.nonzero().reshape(-1)
    chosen = torch.zeros(flat.numel(), dtype=torch.bool)
    chosen[index[torch.sort(flat[index], stable=True).indices[:k]]] = True
    return list(chosen.split([s.numel() for s in scores]))


@st.composite
def problems(draw: st.DrawFn) -> tuple[list[torch.Tensor], list[torch.Tensor | None], int, bool]:
    dtype = draw(st.sampled_from(DTYPES))
    magnitude = draw(st.booleans())
    tied = draw(st.booleans())  # few distinct values: ties everywhere, at the cut too
    seed = draw(st.integers(0, 2**31 - 1))
    sizes = draw(st.lists(st.integers(0, 900), min_size=1, max_size=4))
    g = torch.Generator().manual_seed(seed)
    scores, alive = [], []
    for n in sizes:
        if tied:
            values = torch.randint(-3, 4, (n,), generator=g).to(torch.float64)
        else:
            values = torch.randn(n, generator=g, dtype=torch.float64) * 1000
        values = values.to(dtype)
        if n and dtype.is_floating_point:
            if draw(st.booleans()):
                values[: n // 4] = -0.0  # ties with 0.0
            if draw(st.booleans()):
                values[n // 2] = -math.inf if draw(st.booleans()) else math.inf
            if draw(st.booleans()):
                values[n // 3 :: 7] = math.nan  # ranks last, as in a sort
        scores.append(values)
        alive.append(torch.rand(n, generator=g) < 0.6 if draw(st.booleans()) else None)
    competing = sum(
        s.numel() if a is None else int(a.sum()) for s, a in zip(scores, alive, strict=True)
    )
    k = draw(st.integers(0, competing))
    return scores, alive, k, magnitude


@settings(max_examples=250, deadline=None)
@given(
    problems(),
    st.sampled_from([3, 50, 1 << 20]),  # entries per chunk, and the most gathered
    st.sampled_from([1, 16, 1 << 17]),  # sample sizes: pivots far from the k-th, or close
    st.sampled_from([0, 1 << 10]),
    st.booleans(),
)
def test_chunk_by_chunk_gives_what_the_concatenation_gave(
    problem: tuple, chunk: int, sample: int, tiny: int, as_mask: bool
) -> None:
    scores, alive, k, magnitude = problem
    flags = [
        a if a is None or not as_mask else a.to(s.dtype) for s, a in zip(scores, alive, strict=True)
    ]
    sources = [(lambda s=s, a=a: (s, a)) for s, a in zip(scores, flags, strict=True)]
    with (
        tuning.overridden(**PORTABLE, portable_chunk=chunk, sample=sample, tiny=tiny),
        trace.recorded() as events,
    ):
        got = list(smallest_k_many(sources, k, magnitude=magnitude))
    assert "portable" in events or "all or none" in events
    want = concatenating(scores, alive, k, magnitude)
    if sum(int(w.sum()) for w in want) != k:  # the k-th was NaN: the concatenation lost some
        want = stable_sort(scores, alive, k, magnitude)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_nan_at_the_k_th_place_still_gives_exactly_k() -> None:
    # More than 1024 competing and the k-th smallest a NaN: kthvalue's NaN compared with
    # nothing, so the concatenating path chose none at all.
    scores = torch.rand(5000)
    scores[::10] = math.nan
    for chunk in (1 << 20, 300):
        with tuning.overridden(**PORTABLE, portable_chunk=chunk):
            for k in (4500, 4501, 4600, 4999):
                chosen = smallest_k(scores, k)
                assert int(chosen.sum()) == k
                assert bool(chosen[scores == scores].all())  # every real value first
                assert torch.equal(chosen[::10][: k - 4500], torch.ones(k - 4500, dtype=torch.bool))


def test_a_tensor_spread_over_chunks_and_small_ones_sharing_one() -> None:
    g = torch.Generator().manual_seed(7)
    scores = [torch.randn(n, generator=g) for n in (5, 3000, 0, 7, 7, 1200, 1)]
    alive = [None, torch.rand(3000, generator=g) < 0.5, None, None, None, None, None]
    sources = [(lambda s=s, a=a: (s, a)) for s, a in zip(scores, alive, strict=True)]
    want = stable_sort(scores, alive, 1500, magnitude=True)
    with tuning.overridden(**PORTABLE, portable_chunk=500, sample=64):
        got = list(smallest_k_many(sources, 1500, magnitude=True, keep_dtype=torch.float16))
    for mask, w in zip(got, want, strict=True):
        assert mask.dtype == torch.float16
        assert torch.equal(mask, (~w).to(torch.float16))


def test_each_source_is_called_once_per_pass() -> None:
    calls: list[int] = []
    g = torch.Generator().manual_seed(8)
    scores = [torch.randn(n, generator=g) for n in (4000, 2500, 3000)]

    def source(i: int):  # type: ignore[no-untyped-def]
        def read() -> tuple[torch.Tensor, None]:
            calls.append(i)
            return scores[i], None

        return read

    with tuning.overridden(**PORTABLE, portable_chunk=1000):
        got = list(smallest_k_many([source(i) for i in range(3)], 4000, magnitude=True))
    assert calls == [0, 1, 2] * (len(calls) // 3)
    for c, w in zip(got, stable_sort(scores, [None] * 3, 4000, True), strict=True):
        assert torch.equal(c, w)


def test_selections_are_yielded_source_by_source() -> None:
    # Past one chunk, each selection is made as it is asked for: the later sources are
    # not read before the earlier ones' selections are out.
    read: list[int] = []
    g = torch.Generator().manual_seed(9)
    scores = [torch.randn(3000, generator=g) for _ in range(3)]

    def source(i: int):  # type: ignore[no-untyped-def]
        def call() -> tuple[torch.Tensor, None]:
            read.append(i)
            return scores[i], None

        return call

    with tuning.overridden(**PORTABLE, portable_chunk=1000):
        chosen = smallest_k_many([source(i) for i in range(3)], 2000)
        before = len(read)
        next(chosen)
        assert read[before:] == [0]


# The memory a selection over 8M float32 scores (32 MiB in four tensors) adds at its peak
# to a fresh process, read as the growth of its resident size: torch's CPU allocator keeps
# no statistics, and the resident size is the process's own, whatever else the machine
# runs. The peak is reset (clear_refs) just before the call. glibc would otherwise keep
# freed blocks, in amounts that vary with its threads from run to run; with a fixed
# mmap threshold every block over 16 KiB is mapped for itself and returned when freed,
# so the resident size follows what is alive. A warm-up selection first loads the kernels.
_MEASURE = textwrap.dedent(
    """
    import json, sys
    import torch
    sys.path.insert(0, {tests!r})
    from prunekit.select import smallest_k_many, tuning
    from test_portable import concatenating

    def status(key):
        with open("/proc/self/status") as lines:
            line = next(line for line in lines if line.startswith(key + ":"))
        return int(line.split()[1]) * 1024

    g = torch.Generator().manual_seed(0)
    scores = [torch.randn(1 << 21, generator=g) for _ in range(4)]
    with tuning.overridden(small=1 << 62, portable_chunk=1 << 15, sample=1 << 14):
        warm = [torch.randn(100_000, generator=g) for _ in range(2)]
        list(smallest_k_many([lambda s=s: (s, None) for s in warm], 70_000, magnitude=True))
        concatenating(warm, [None, None], 70_000, True)
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # the peak resident size starts again from the current one
        start = status("VmRSS")
        if {old!r}:
            masks = concatenating(scores, [None] * 4, 1 << 22, True)
        else:
            masks = list(
                smallest_k_many([lambda s=s: (s, None) for s in scores], 1 << 22, magnitude=True)
            )
        growth = status("VmHWM") - start
    print(json.dumps({{"growth": growth, "chosen": sum(int(m.sum()) for m in masks)}}))
    """
)


def _peak_growth(old: bool) -> int:
    code = _MEASURE.format(tests=str(Path(__file__).parent), old=old)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(16 << 10)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env=env,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["chosen"] == 1 << 22
    growth: int = found["growth"]
    return growth


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc")
def test_global_selection_does_not_hold_the_model_twice() -> None:
    model = 4 * (1 << 21) * 4  # bytes of scores
    masks = 4 * (1 << 21)  # the bool selections returned
    ours = _peak_growth(old=False)
    theirs = _peak_growth(old=True)  # the measurement sees a concatenation
    assert theirs - masks >= model
    assert ours - masks < model / 8, f"{ours / 2**20:.1f} MiB at the peak"


def test_tensorplay_tensors_chunk_by_chunk() -> None:
    tensorplay = pytest.importorskip("tensorplay")
    g = torch.Generator().manual_seed(10)
    values = [torch.randn(n, generator=g) for n in (2000, 30, 1500)]
    flags = [None, torch.rand(30, generator=g) < 0.5, torch.rand(1500, generator=g) < 0.7]
    ours = [tensorplay.tensor(v.tolist()) for v in values]
    theirs_flags = [None if f is None else tensorplay.tensor(f.tolist()) for f in flags]
    sources = [(lambda s=s, a=a: (s, a)) for s, a in zip(ours, theirs_flags, strict=True)]
    want = stable_sort(values, flags, 1700, magnitude=True)
    for chunk in (1 << 20, 400):
        with tuning.overridden(portable_chunk=chunk, sample=64):
            got = list(smallest_k_many(sources, 1700, magnitude=True))
        for c, w in zip(got, want, strict=True):
            assert c.tolist() == w.tolist()
