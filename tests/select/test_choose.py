"""The selection kernels against a plain reference: a stable sort of the competing scores."""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunekit import select
from prunekit.select import sample, smallest_k, smallest_k_many, strategy, trace, tuning

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# The one pass as tensor operations, as the C loop, or the C loop with each chunk in
# parts of a few entries on three threads.
ONE_PASS: dict[str, dict[str, Any]] = {
    "tensors": {"native": False},
    "C": {},
    "C in parts": {"part": 2, "threads": lambda: 3},
}
# The one pass taken even around a loose guess (from a small sample of small inputs).
LOOSE = {"gather_share": 2, "gather_capped": False}


@pytest.fixture(autouse=True)
def radix_even_for_small_inputs() -> Iterator[None]:
    """Small inputs normally take the plain path; here they take the radix one, or the one
    pass around a guess from a sample."""
    with tuning.overridden(small=0, guess=0):
        yield


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
    scores: list[torch.Tensor],
    alive: list[torch.Tensor | None],
    k: int,
    magnitude: bool,
    as_count: bool = False,
) -> list[torch.Tensor]:
    """The selection through smallest_k_many; with `as_count`, k is given as a function of
    how many compete, which the kernel then counts itself."""
    sources = [(lambda s=s, a=a: (s, a)) for s, a in zip(scores, alive, strict=True)]
    count = (lambda total: k) if as_count else k
    return list(smallest_k_many(sources, count, magnitude=magnitude))


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
        if n and draw(st.booleans()):
            values[n // 2] = -math.inf if negative else math.inf  # ranks last, as in a sort
        scores.append(values)
        alive.append(torch.rand(n, generator=g) < 0.6 if draw(st.booleans()) else None)
    competing = sum(
        s.numel() if a is None else int(a.sum()) for s, a in zip(scores, alive, strict=True)
    )
    k = draw(st.integers(0, competing))
    return scores, alive, k, magnitude


@settings(max_examples=300, deadline=None)
@given(
    problems(),
    st.sampled_from([0, 1 << 14]),
    st.sampled_from([31, 64, 1 << 20]),
    st.sampled_from([64, 1024, 1 << 16]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["tensors", "C", "C in parts"]),
)
def test_matches_stable_sort(
    problem: tuple,
    small: int,
    chunk: int,
    sample: int,
    as_mask: bool,
    as_count: bool,
    loose: bool,
    one_pass: str,
) -> None:
    scores, alive, k, magnitude = problem
    # Alive flags as bool, or as a 0/1 mask of the scores' dtype (1 competes).
    flags = [
        a if a is None or not as_mask else a.to(s.dtype) for s, a in zip(scores, alive, strict=True)
    ]
    with tuning.overridden(
        small=small,  # both the radix path and the plain one
        # passes that cross chunk borders (31: a tensor of up to 300 entries spans up to ten
        # chunks, not aligned to any power of two), and one chunk per tensor
        chunk=chunk,
        step=chunk,
        sample=sample,  # a guess from a sample (right or wrong), or no guess at all
        **ONE_PASS[one_pass],
        **(LOOSE if loose else {}),
    ):
        got = run(scores, flags, k, magnitude, as_count)
    want = reference(scores, alive, k, magnitude)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor (so -0.0 differs from 0.0)."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@settings(max_examples=200, deadline=None)
@given(
    problems(),
    st.sampled_from([31, 64, 1 << 20]),
    st.sampled_from([64, 1024, 1 << 16]),
    st.booleans(),
    st.sampled_from(["tensors", "C", "C in parts"]),
)
def test_products_are_the_scores_times_the_masks(
    problem: tuple, chunk: int, sample: int, loose: bool, one_pass: str
) -> None:
    scores, alive, k, magnitude = problem
    dtype = scores[0].dtype
    # A product for each tensor without flags whose scores are finite (as callers ensure).
    products = [
        torch.full((s.numel(),), 7, dtype=dtype) if a is None and bool(s.isfinite().all()) else None
        for s, a in zip(scores, alive, strict=True)
    ]
    sources = [(lambda s=s, a=a: (s, a)) for s, a in zip(scores, alive, strict=True)]
    tuned = {"chunk": chunk, "step": chunk, "sample": sample, **ONE_PASS[one_pass]}
    with tuning.overridden(**tuned, **(LOOSE if loose else {})):
        got = list(
            smallest_k_many(sources, k, magnitude=magnitude, keep_dtype=dtype, products=products)
        )
    want = reference(scores, alive, k, magnitude)
    for mask, chosen, s, product in zip(got, want, scores, products, strict=True):
        assert torch.equal(mask, (~chosen).to(dtype))
        if product is not None:  # bit for bit: 0 x a negative score is -0.0
            assert torch.equal(bits(product), bits(s.reshape(-1) * mask))


def test_products_need_a_mask_dtype() -> None:
    with pytest.raises(ValueError, match="products need keep_dtype"):
        smallest_k_many([lambda: (torch.ones(3), None)], 1, products=[torch.empty(3)])


@pytest.mark.parametrize("product", [torch.empty(10), torch.empty(300_000, dtype=torch.float64)])
def test_products_must_fit_their_scores(product: torch.Tensor) -> None:
    scores = torch.randn(300_000)
    with pytest.raises(ValueError, match=r"expected 300000 contiguous torch\.float32"):
        smallest_k_many([lambda: (scores, None)], 10, keep_dtype=torch.float32, products=[product])


@pytest.mark.parametrize("size", [299_995, 300_005])
def test_flags_must_be_one_per_score(size: int) -> None:
    with pytest.raises(ValueError, match=r"300000 scores and \d+ flags"):
        smallest_k(torch.randn(300_000), 1000, torch.ones(size, dtype=torch.bool))


def test_products_of_scores_that_require_grad() -> None:
    scores = torch.randn(300_000, requires_grad=True)
    for native in (True, False):
        product = torch.empty(300_000, dtype=torch.float64)  # not the scores' dtype
        with tuning.overridden(native=native):
            (mask,) = smallest_k_many(
                [lambda: (scores, None)],
                1000,
                magnitude=True,
                keep_dtype=torch.float64,
                products=[product],
            )
        assert torch.equal(product, scores.detach().double() * mask)


def test_products_must_be_where_their_scores_are() -> None:
    scores = torch.randn(300_000)
    product = torch.empty(300_000, device="meta")
    with pytest.raises(
        ValueError, match=r"on meta; expected \d+ contiguous torch\.float32 entries on cpu"
    ):
        smallest_k_many([lambda: (scores, None)], 10, keep_dtype=torch.float32, products=[product])


@pytest.mark.parametrize("one_pass", ["tensors", "C"])
def test_scores_made_anew_are_not_all_held(one_pass: str) -> None:
    # Sources may make their scores on each call (global random pruning draws its noise
    # so): the one pass must not keep them all alive until the end.
    made: list[weakref.ref[torch.Tensor]] = []

    def source(seed: int) -> tuple[torch.Tensor, None]:
        scores = torch.rand(100_000, generator=torch.Generator().manual_seed(seed))
        made.append(weakref.ref(scores))
        return scores, None

    alive_at_settle = []

    def listen(event: str) -> None:
        if event == "settle":
            alive_at_settle.append(sum(ref() is not None for ref in made))

    sources = [lambda i=i: source(i) for i in range(8)]
    with tuning.overridden(**ONE_PASS[one_pass]), trace.recorded(listen):
        list(smallest_k_many(sources, 80_000, magnitude=True))
    assert alive_at_settle and alive_at_settle[0] <= 1


def test_a_product_cannot_be_its_scores() -> None:
    scores = torch.randn(300_000)
    with pytest.raises(ValueError, match="in memory of its own"):
        smallest_k_many([lambda: (scores, None)], 10, keep_dtype=torch.float32, products=[scores])


@pytest.mark.parametrize("one_pass", ["tensors", "C", "C in parts"])
def test_products_under_inference_mode(one_pass: str) -> None:
    # Products of another dtype than the scores are multiplied after the pass, where the
    # caller's inference mode holds (it is per thread).
    g = torch.Generator().manual_seed(0)
    scores = [torch.randn(300_000, generator=g) for _ in range(3)]
    with tuning.overridden(**ONE_PASS[one_pass]), torch.inference_mode():
        products = [torch.empty(300_000, dtype=torch.float64) for _ in scores]
        masks = list(
            smallest_k_many(
                [lambda s=s: (s, None) for s in scores],
                200_000,
                magnitude=True,
                keep_dtype=torch.float64,
                products=products,
            )
        )
    for s, mask, product in zip(scores, masks, products, strict=True):
        assert torch.equal(product, s.double() * mask)


def test_products_of_strided_and_expanded_scores() -> None:
    n = 300_000
    strided = torch.randn(2 * n)[::2]
    expanded = torch.full((1,), 0.5).expand(n)
    for scores in (strided, expanded):
        product = torch.empty(n)
        (mask,) = smallest_k_many(
            [lambda s=scores: (s, None)],
            n // 3,
            magnitude=True,
            keep_dtype=torch.float32,
            products=[product],
        )
        assert torch.equal(bits(product), bits(scores * mask))


@pytest.mark.parametrize("dtype", DTYPES)
def test_heavy_ties_across_chunks_keep_lowest_indices(dtype: torch.dtype) -> None:
    # 200k entries with 3 values: the cut falls inside a run of ties far past one chunk.
    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 3, (200_000,), generator=g).to(dtype)
    for k in (1, 66_000, 100_001, 199_999):
        with tuning.overridden(chunk=4096):
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alive", [False, True])
def test_one_pass_around_a_guess_and_the_fallback_give_the_same(
    dtype: torch.dtype, alive: bool, one_pass: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(3)
    parts = [torch.randn(n, generator=g).to(dtype) for n in (40_000, 25_000)]
    flags = [torch.rand(p.numel(), generator=g) < 0.7 if alive else None for p in parts]
    k = 20_000
    want = reference(parts, flags, k, magnitude=True)
    sources = [(lambda p=p, a=a: (p, a)) for p, a in zip(parts, flags, strict=True)]
    for got, w in zip(smallest_k_many(sources, k, magnitude=True), want, strict=True):
        assert torch.equal(got, w)
    assert one_pass == [True]  # the sample's guess held: one pass did it
    # Bounds that miss the k-th value (all below it, all above it, too wide to gather):
    # the histogram passes take over and give the same selection.
    kth = torch.cat([p.abs() for p in parts]).to(torch.float64).sort().values[k].item()
    for lower, upper in ((0.0, kth / 4), (kth * 4, kth * 8), (0.0, math.inf)):
        bounds = tuple(torch.tensor(b, dtype=dtype) for b in (lower, lower, upper))
        monkeypatch.setattr(sample, "guess", lambda *args, b=bounds: b)
        one_pass.clear()
        for kept, w in zip(
            smallest_k_many(sources, k, magnitude=True, keep_dtype=dtype), want, strict=True
        ):
            assert torch.equal(kept, (~w).to(dtype))
        assert one_pass == [False]


def test_one_pass_over_an_empty_tensor_among_others(one_pass: list[bool]) -> None:
    g = torch.Generator().manual_seed(5)
    parts = [torch.empty(0), torch.randn(50_000, generator=g), torch.empty(0)]
    sources = [(lambda p=p: (p, None)) for p in parts]
    got = list(smallest_k_many(sources, 20_000, magnitude=True))
    assert one_pass == [True]
    for chosen, want in zip(got, reference(parts, [None] * 3, 20_000, True), strict=True):
        assert torch.equal(chosen, want)


@pytest.mark.parametrize("mask_dtype", [torch.float64, torch.int32, torch.float16])
def test_a_mask_of_another_dtype_lets_only_its_ones_compete(mask_dtype: torch.dtype) -> None:
    # 1 - 1e-12 is not 1, though it rounds to 1.0 in float32: that entry does not compete.
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(40_000, generator=g)
    alive = (torch.rand(40_000, generator=g) < 0.8).to(torch.float64)
    if mask_dtype == torch.float64:
        alive[::7] = 1 - 1e-12
    elif mask_dtype == torch.int32:
        alive[::7] = 2
    mask = alive.to(mask_dtype)
    want = reference([scores], [mask == 1], 10_000, magnitude=True)
    for count in (10_000, lambda total: 10_000):
        (got,) = smallest_k_many([lambda: (scores, mask)], count, magnitude=True)
        assert torch.equal(got, want[0])


@pytest.mark.parametrize("size", [64, 1024, 1 << 17])
def test_scores_holding_nan_still_give_exactly_k(size: int) -> None:
    # NaN is outside the contract (callers check first), but no path may then choose
    # more or fewer than k: a NaN in the sample means no guess.
    scores = torch.rand(50_000)
    scores[::10] = float("nan")  # the top 10 % of a sort: the guess's upper bound falls there
    for k in (1, 20_000, 44_500, 45_000):
        with tuning.overridden(sample=size):
            assert int(smallest_k(scores, k).sum()) == k


@pytest.mark.parametrize("size", [1000, 100_000, 300_000])
def test_finite_check_refuses_nan_and_inf_but_not_huge_sums(size: int) -> None:
    # Scores near the largest float32 sum to infinity, yet every one of them is finite.
    huge = torch.full((size,), 3e38)
    alive = torch.ones(size, dtype=torch.bool)
    for flags in (None, alive):
        chosen = smallest_k_many([lambda f=flags: (huge, f)], 10, magnitude=True, finite=True)
        assert int(next(chosen).sum()) == 10
        for bad in (float("nan"), float("inf")):
            scores = huge.clone()
            scores[size // 2] = bad
            with pytest.raises(select.NotFinite):
                smallest_k_many([lambda s=scores, f=flags: (s, f)], 10, magnitude=True, finite=True)


def test_tensors_off_the_cpu_take_the_plain_path() -> None:
    scores = torch.empty(1 << 20, device="meta")
    assert not strategy.make([lambda: (scores, None)], magnitude=True).fast


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


@pytest.mark.parametrize("as_mask", [False, True])
def test_a_count_is_taken_from_the_exact_number_competing(
    as_mask: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # k as a function of how many compete: the sample only estimates that number, so a
    # function that refuses the estimate must not decide anything; the exact count does.
    g = torch.Generator().manual_seed(4)
    parts = [torch.randn(n, generator=g) for n in (60_000, 40_000)]
    flags = [torch.rand(p.numel(), generator=g) < 0.3 for p in parts]
    exact = sum(int(f.sum()) for f in flags)
    asked: list[int] = []

    def count(total: int) -> int:
        asked.append(total)
        if total != exact:
            raise ValueError(f"refused {total}")
        return total // 3

    alive = [f.to(p.dtype) if as_mask else f for p, f in zip(parts, flags, strict=True)]
    sources = [(lambda p=p, a=a: (p, a)) for p, a in zip(parts, alive, strict=True)]
    want = reference(parts, flags, exact // 3, magnitude=True)
    for got, w in zip(smallest_k_many(sources, count, magnitude=True), want, strict=True):
        assert torch.equal(got, w)
    assert exact in asked and any(total != exact for total in asked)  # estimates were tried

    def never(total: int) -> int:
        raise ValueError(f"amount does not fit {total} entries")

    with pytest.raises(ValueError, match=f"does not fit {exact} entries"):
        list(smallest_k_many(sources, never, magnitude=True))


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


@pytest.mark.parametrize("native", [True, False])
def test_a_kth_value_of_infinity_takes_its_ties_in_order(native: bool) -> None:
    # The sampled bounds miss (the k-th is infinite): the threshold's ties are marked
    # from the scores, as the stable sort takes them.
    g = torch.Generator().manual_seed(7)
    parts = [torch.rand(17, generator=g), torch.rand(300, generator=g), torch.rand(40, generator=g)]
    parts[0][8] = parts[2][5] = math.inf
    sources = [(lambda p=p: (p, None)) for p in parts]
    for k in (355, 356, 357):
        with tuning.overridden(small=0, chunk=7, step=7, sample=64, native=native):
            got = list(smallest_k_many(sources, k, magnitude=True))
        for chosen, want in zip(got, reference(parts, [None] * 3, k, True), strict=True):
            assert torch.equal(chosen, want)
