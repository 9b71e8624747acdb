"""The selection kernels against a plain reference: a stable sort of the competing scores."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunekit import select
from prunekit.select import smallest_k, smallest_k_many

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.fixture(autouse=True)
def radix_even_for_small_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small inputs normally take the plain path; here they take the radix one."""
    monkeypatch.setattr(select, "_SMALL", 0)


def reference(
    scores: list[torch.Tensor], alive: list[torch.Tensor | None], k: int, magnitude: bool
) -> list[torch.Tensor]:
    """The k smallest (by |value| if magnitude) alive entries, ties to the earlier position."""
    flat = torch.cat([s.reshape(-1).to(torch.float64) for s in scores])
    if magnitude:
        flat = flat.abs()
    live = torch.cat(
        [
            torch.ones(s.numel(), dtype=torch.bool) if a is None else a.reshape(-1)
            for s, a in zip(scores, alive, strict=True)
        ]
    )
    index = live.nonzero().reshape(-1)
    order = torch.sort(flat[index], stable=True).indices[:k]
    chosen = torch.zeros(flat.numel(), dtype=torch.bool)
    chosen[index[order]] = True
    return list(chosen.split([s.numel() for s in scores]))


def run(
    scores: list[torch.Tensor], alive: list[torch.Tensor | None], k: int, magnitude: bool
) -> list[torch.Tensor]:
    sources = [(lambda s=s, a=a: (s, a)) for s, a in zip(scores, alive, strict=True)]
    return list(smallest_k_many(sources, k, magnitude=magnitude))


@st.composite
def problems(draw: st.DrawFn) -> tuple[list[torch.Tensor], list[torch.Tensor | None], int, bool]:
    dtype = draw(st.sampled_from(DTYPES))
    magnitude = draw(st.booleans())
    tied = draw(st.booleans())  # few distinct values: ties everywhere, at the cut too
    negative = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    sizes = draw(st.lists(st.integers(0, 300), min_size=1, max_size=4))
    g = torch.Generator().manual_seed(seed)
    scores, alive = [], []
    for n in sizes:
        if tied:
            values = torch.randint(-3, 4, (n,), generator=g).to(torch.float64) / 4
        else:
            values = torch.randn(n, generator=g, dtype=torch.float64) * 10.0 ** float(
                torch.randint(-6, 6, (1,), generator=g)
            )
        if not negative:
            values = values.abs()
        values = values.to(dtype)
        if draw(st.booleans()):
            values[: n // 3] = -0.0 if negative else 0.0
        scores.append(values)
        alive.append(torch.rand(n, generator=g) < 0.6 if draw(st.booleans()) else None)
    competing = sum(
        s.numel() if a is None else int(a.sum()) for s, a in zip(scores, alive, strict=True)
    )
    k = draw(st.integers(0, competing))
    return scores, alive, k, magnitude


@settings(max_examples=300, deadline=None)
@given(problems(), st.sampled_from([0, 1 << 14]))
def test_matches_stable_sort(problem: tuple, small: int) -> None:
    scores, alive, k, magnitude = problem
    select._SMALL = small  # both the radix path and the plain one
    got = run(scores, alive, k, magnitude)
    want = reference(scores, alive, k, magnitude)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_heavy_ties_across_chunks_keep_lowest_indices(dtype: torch.dtype) -> None:
    # 200k entries with 3 values: the cut falls inside a run of ties far past one chunk.
    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 3, (200_000,), generator=g).to(dtype)
    for k in (1, 66_000, 100_001, 199_999):
        got = smallest_k(scores, k)
        (want,) = reference([scores], [None], k, magnitude=False)
        assert torch.equal(got, want)
        assert int(got.sum()) == k


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_tie_free_tensor_matches_topk(dtype: torch.dtype) -> None:
    # Distinct magnitudes: torch.topk is then a valid reference too.
    n = 1 << 14
    g = torch.Generator().manual_seed(2)
    values = (torch.randperm(n, generator=g).to(torch.float64) + 1) / n
    if dtype in (torch.float16, torch.bfloat16):
        bits = torch.randperm(0x7B00 - 0x0400, generator=g)[:n] + 0x0400
        values = bits.to(torch.int16).view(dtype).to(torch.float64)
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    scores = (values * signs).to(dtype)
    k = n // 3
    got = smallest_k(scores, k, magnitude=True)
    want = torch.zeros(n, dtype=torch.bool)
    want[torch.topk(scores.abs().to(torch.float64), k, largest=False).indices] = True
    assert torch.equal(got, want)


def test_negative_and_signed_zero_scores() -> None:
    scores = torch.tensor([0.0, -0.0, -1.0, 2.0, -0.0, 0.5])
    assert smallest_k(scores, 2).tolist() == [True, False, True, False, False, False]
    # -0.0 and 0.0 tie, so the lower index wins.
    assert smallest_k(scores.abs(), 2).tolist() == [True, True, False, False, False, False]


def test_alive_restricts_the_competition() -> None:
    scores = torch.tensor([0.1, 0.2, 0.3, 0.4])
    alive = torch.tensor([False, True, False, True])
    assert smallest_k(scores, 1, alive).tolist() == [False, True, False, False]
    assert smallest_k(scores, 2, alive).tolist() == [False, True, False, True]
    assert smallest_k(scores, 0, alive).tolist() == [False] * 4


def test_k_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="k=5 is outside \\[0, 4\\]"):
        smallest_k(torch.ones(4), 5)
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        smallest_k(torch.ones(4), 2, torch.tensor([True, False, False, False]))


def test_sources_are_read_one_at_a_time_in_order() -> None:
    # Every pass reads each source in turn; none is read twice in a row or out of order.
    calls: list[int] = []

    def source(i: int, values: torch.Tensor):  # type: ignore[no-untyped-def]
        def read() -> tuple[torch.Tensor, None]:
            calls.append(i)
            return values, None

        return read

    parts = [torch.rand(1000) for _ in range(3)]
    chosen = list(smallest_k_many([source(i, p) for i, p in enumerate(parts)], 1500))
    assert len(calls) % 3 == 0 and calls == [0, 1, 2] * (len(calls) // 3)
    want = reference(parts, [None] * 3, 1500, magnitude=False)
    for g, w in zip(chosen, want, strict=True):
        assert torch.equal(g, w)


def test_more_than_two_to_the_31_entries_in_total() -> None:
    # 129 views of one 2**24-entry bfloat16 tensor: 2**31 + 2**24 entries, 32 MiB in memory.
    n, copies = 1 << 24, 129
    values = (torch.arange(n) % 256).to(torch.bfloat16)
    per_value = copies * (n // 256)
    k = 2**31 + 5
    sources = [lambda: (values, None)] * copies
    chosen = smallest_k_many(sources, k)
    # Values 0..253 are all chosen; the rest of k comes from ties at 254, earliest first.
    cut = k // per_value
    ties = k - cut * per_value
    per_tensor_ties = n // 256
    total = 0
    for i, picked in enumerate(chosen):
        count = int(picked.count_nonzero())
        take = min(max(ties - i * per_tensor_ties, 0), per_tensor_ties)
        assert count == cut * (n // 256) + take
        if 0 < take < per_tensor_ties:
            last_tie = int((values == cut).nonzero()[take - 1])
            assert bool(picked[last_tie]) and not bool(picked[last_tie + 256])
        total += count
    assert total == k


def test_ties_prune_lower_index_first() -> None:
    scores = torch.tensor([2.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    assert smallest_k(scores, 3).tolist() == [False, True, True, True, False, False]


def test_shape_and_dtype_of_result() -> None:
    chosen = smallest_k(torch.randn(2, 3, 4), 6)
    assert chosen.shape == (2, 3, 4)
    assert chosen.dtype == torch.bool
    assert int(chosen.sum()) == 6


def test_tensorplay_tensors_take_the_portable_path() -> None:
    tp = pytest.importorskip("tensorplay")
    values = [0.5, -0.1, 0.3, 0.3, 2.0, -0.3]
    scores = tp.tensor(values)
    for magnitude in (False, True):
        for k in range(len(values) + 1):
            got = smallest_k(scores, k, magnitude=magnitude).tolist()
            (want,) = reference([torch.tensor(values)], [None], k, magnitude)
            assert got == want.tolist()
    keep = next(smallest_k_many([lambda: (scores, None)], 2, keep_dtype=tp.float32))
    assert keep.tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
