"""Every way into the k-smallest engine against one exact reference: a stable sort.

The reference ranks every competing entry as float64 (all four float formats widen to it
exactly) in one stable sort over the tensors concatenated in their order, so it states the
contract itself: exactly k chosen, ties to the earlier tensor, then the lower flat index,
NaN after every number. The engine's ways in (smallest_k_many on each of its paths, the
selection in pieces in one process and on ranks that are threads, a sharded folder pruned
in one process) must give its selections bit for bit. Real processes (2 and 4 gloo ranks)
are tests/distributed/test_processes_quick.py's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.thread_group import on_threads
from prunekit.select import smallest_k_many, tuning

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SHAPES = [(40, 300), (2000,), (20, 250), (17, 3), (0,), (1,)]

# Tuning that sends small inputs down each path of smallest_k_many.
PATHS: dict[str, dict[str, Any]] = {
    "default": {},
    "one pass, C loop": {"small": 0, "sample": 2048, "guess": 4096, "step": 4096, "part": 1024},
    "one pass, tensor operations": {"small": 0, "sample": 2048, "guess": 4096, "native": False},
    "chunks": {"small": 0, "sample": 2048, "guess": 4096, "chunk": 3000, "step": 3000},
    "radix": {"small": 0, "guess": 1 << 40},
    "radix, chunks": {"small": 0, "guess": 1 << 40, "chunk": 2000},
    "missed guess": {"small": 0, "sample": 2048, "guess": 4096, "gather_share": 1 << 40},
    "portable": {"small": 1 << 40},
    "portable, rounds": {"small": 1 << 40, "portable_chunk": 3000, "sample": 512},
    "portable, tiny": {"small": 1 << 40, "tiny": 1 << 20},
}


def reference(
    tensors: list[torch.Tensor], flags: list[torch.Tensor | None], k: int, magnitude: bool
) -> list[torch.Tensor]:
    """Each tensor's flat share of the k smallest, from one stable sort of them all."""
    values = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    if magnitude:
        values = values.abs()
    live = torch.cat(
        [
            torch.ones(t.numel(), dtype=torch.bool) if f is None else f.reshape(-1) == 1
            for t, f in zip(tensors, flags, strict=True)
        ]
    )
    where = live.nonzero().reshape(-1)
    order = torch.sort(values[where], stable=True).indices[:k]
    chosen = torch.zeros(values.numel(), dtype=torch.bool)
    chosen[where[order]] = True
    return list(chosen.split([t.numel() for t in tensors]))


def scores(kind: str, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """Tensors of one kind: normal, small integers (ties everywhere), mostly zeros of both
    signs, or normal with a few NaN."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for shape in SHAPES:
        t = torch.randn(shape, generator=generator)
        if kind == "ties":
            t = torch.randint(-4, 5, shape, generator=generator).float()
        elif kind == "zeros":
            t = torch.where(torch.rand(shape, generator=generator) < 0.8, 0.0, t)
            t = torch.where(torch.rand(shape, generator=generator) < 0.5, -t, t)
        elif kind == "nan":
            t = torch.where(torch.rand(shape, generator=generator) < 0.01, torch.nan, t)
        out.append(t.to(dtype))
    return out


def flags_of(tensors: list[torch.Tensor], flagged: str, seed: int) -> list[torch.Tensor | None]:
    """No flags, bool flags on every other tensor, or masks of the scores' dtype."""
    generator = torch.Generator().manual_seed(seed + 1)
    out: list[torch.Tensor | None] = []
    for i, t in enumerate(tensors):
        if flagged == "none" or i % 2:
            out.append(None)
            continue
        alive = torch.rand(t.shape, generator=generator) > 0.3
        out.append(alive if flagged == "bool" else alive.to(t.dtype))
    return out


def counts(total: int) -> list[int]:
    return sorted({0, 1, total // 3, total - 1, total} & set(range(total + 1)))


def competing(tensors: list[torch.Tensor], flags: list[torch.Tensor | None]) -> int:
    return sum(
        t.numel() if f is None else int((f == 1).sum()) for t, f in zip(tensors, flags, strict=True)
    )


def many(
    tensors: list[torch.Tensor],
    flags: list[torch.Tensor | None],
    k: int,
    magnitude: bool,
    keep: torch.dtype | None,
) -> list[torch.Tensor]:
    sources = [lambda t=t, f=f: (t, f) for t, f in zip(tensors, flags, strict=True)]
    got = smallest_k_many(sources, k, magnitude=magnitude, keep_dtype=keep)
    return [g.reshape(-1) if keep is None else g.reshape(-1) == 0 for g in got]


def assert_equal(got: list[torch.Tensor], want: list[torch.Tensor], what: object) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == torch.bool and torch.equal(g, w), (what, i)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["normal", "ties", "zeros"])
def test_smallest_k_many_on_every_path(path: str, dtype: torch.dtype, kind: str) -> None:
    tensors = scores(kind, dtype, seed=len(path) + DTYPES.index(dtype))
    with tuning.overridden(**PATHS[path]):
        for flagged in ("none", "bool", "mask"):
            flags = flags_of(tensors, flagged, seed=3)
            total = competing(tensors, flags)
            third = total // 3
            for k in counts(total):
                # Masks of the scores' dtype are asked for once per case (k = a third): the
                # selection is the same, only its form differs.
                for keep in (None, dtype) if flagged != "bool" and k == third else (None,):
                    want = reference(tensors, flags, k, magnitude=True)
                    got = many(tensors, flags, k, True, keep)
                    assert_equal(got, want, (flagged, k, keep))


@pytest.mark.parametrize("path", ["default", "radix", "portable", "portable, rounds"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ranked_by_value(path: str, dtype: torch.dtype) -> None:
    signed = scores("ties", dtype, seed=5)
    positive = [t.abs() for t in scores("normal", dtype, seed=6)]
    with tuning.overridden(**PATHS[path]):
        for tensors in (signed, positive):
            flags = flags_of(tensors, "mask", seed=4)
            for k in counts(competing(tensors, flags)):
                want = reference(tensors, flags, k, magnitude=False)
                assert_equal(many(tensors, flags, k, False, None), want, k)


@pytest.mark.parametrize("path", ["portable", "portable, rounds", "portable, tiny"])
def test_nan_ranks_last_where_scores_are_not_checked(path: str) -> None:
    tensors = scores("nan", torch.float32, seed=7)
    with tuning.overridden(**PATHS[path]):
        for k in counts(competing(tensors, [None] * len(tensors))):
            want = reference(tensors, [None] * len(tensors), k, magnitude=False)
            assert_equal(many(tensors, [None] * len(tensors), k, False, None), want, k)


def test_many_tensors_of_mixed_dtypes() -> None:
    generator = torch.Generator().manual_seed(11)
    tensors = [
        torch.randint(-3, 4, (int(n),), generator=generator).to(DTYPES[i % 4])
        for i, n in enumerate(torch.randint(0, 400, (300,), generator=generator))
    ]
    flags = flags_of(tensors, "mask", seed=12)
    for path in ("default", "one pass, C loop", "radix", "portable, rounds"):
        with tuning.overridden(**PATHS[path]):
            total = competing(tensors, flags)
            for k in (1, total // 3, total - 1):
                want = reference(tensors, flags, k, magnitude=True)
                assert_equal(many(tensors, flags, k, True, None), want, (path, k))


# The selection in pieces: every rank holds some tensors; together they rank as the tensors
# in key order.

PIECE_PATHS: dict[str, dict[str, Any]] = {
    "default": {},
    "sample": {"sample": 2048, "guess": 4096},
    "missed bounds": {"sample": 2048, "guess": 4096, "gather_share": 1 << 40},
    "chunks": {"sample": 2048, "guess": 4096, "chunk": 3000},
    "C loop in steps": {"sample": 2048, "guess": 4096, "step": 3000, "part": 1024},
    "tensor operations": {"sample": 2048, "guess": 4096, "native": False},
}


def pieces_select(
    tensors: list[torch.Tensor],
    flags: list[torch.Tensor | None],
    keys: list[int],
    k: int,
    group: Any,
) -> list[torch.Tensor]:
    from prunekit.select.pieces import Piece, select

    pieces = [
        Piece(lambda t=t, f=f: (t, f), t.numel(), t.dtype, key=key)
        for t, f, key in zip(tensors, flags, keys, strict=True)
    ]
    selection = select(pieces, lambda total: k, group)
    return [selection.chosen(i) for i in range(len(pieces))]


def in_key_order(
    tensors: list[torch.Tensor], flags: list[torch.Tensor | None], keys: list[int], k: int
) -> list[torch.Tensor]:
    """The reference for tensors ranked in key order, given back in their own order."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    ranked = reference([tensors[i] for i in order], [flags[i] for i in order], k, True)
    back: list[torch.Tensor] = [torch.empty(0)] * len(keys)
    for place, i in enumerate(order):
        back[i] = ranked[place]
    return back


@pytest.mark.parametrize("path", list(PIECE_PATHS))
@pytest.mark.parametrize("mixed", [False, True], ids=["one dtype", "mixed dtypes"])
@pytest.mark.parametrize("kind", ["normal", "ties", "zeros"])
def test_pieces_in_one_process(path: str, mixed: bool, kind: str) -> None:
    from prunekit.select.process_group import Alone

    groups = [DTYPES] if mixed else [[d] for d in DTYPES]
    for dtypes in groups:
        tensors = [
            t.to(dtypes[i % len(dtypes)]) for i, t in enumerate(scores(kind, torch.float32, 8))
        ]
        keys = [5, 2, 9, 0, 7, 3]  # not the list's order
        with tuning.overridden(**PIECE_PATHS[path]):
            for flagged in ("none", "mask"):
                flags = flags_of(tensors, flagged, seed=9)
                for k in counts(competing(tensors, flags)):
                    got = pieces_select(tensors, flags, keys, k, Alone())
                    assert_equal(got, in_key_order(tensors, flags, keys, k), (dtypes, k))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pieces_on_ranks(world: int, dtype: torch.dtype) -> None:
    tensors = scores("ties", dtype, seed=10) + scores("normal", dtype, seed=11)
    flags = flags_of(tensors, "mask", seed=10)
    keys = list(range(len(tensors)))
    mine = [[i for i in keys if i % world == rank] for rank in range(world)]
    with tuning.overridden(sample=2048, guess=4096):
        for k in counts(competing(tensors, flags)):

            def run(group: Any, k: int = k) -> list[torch.Tensor]:
                held = mine[group.rank]
                return pieces_select(
                    [tensors[i] for i in held], [flags[i] for i in held], held, k, group
                )

            results = on_threads(world, _in_tuning(run, sample=2048, guess=4096))
            want = reference(tensors, flags, k, True)
            for rank, got in enumerate(results):
                assert_equal(got, [want[i] for i in mine[rank]], (rank, k))


def _in_tuning(run: Callable[[Any], Any], **changes: Any) -> Callable[[Any], Any]:
    """`run` under the tuning `changes`: threads do not inherit the caller's."""

    def tuned(group: Any) -> Any:
        with tuning.overridden(**changes):
            return run(group)

    return tuned


def test_a_sharded_folder_in_one_process(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.torch")
    from prunekit.io.sharded import INDEX, prune_sharded

    generator = torch.Generator().manual_seed(13)
    state = {
        f"w{i}": torch.randint(-3, 4, (200 + 37 * i, 300), generator=generator).to(d)
        for i, d in enumerate(DTYPES * 2)
    }
    folder = tmp_path / "in"
    folder.mkdir()
    names = list(state)
    weight_map = {}
    for number in range(4):
        file = f"model-{number + 1:05d}-of-00004.safetensors"
        part = names[2 * number : 2 * number + 2]
        st.save_file({n: state[n] for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    tensors = [state[n] for n in names]
    total = sum(t.numel() for t in tensors)
    for k in (1, total // 3, total - 1):
        out = tmp_path / f"out{k}"
        prune_sharded(folder, out, k, method="l1", scope="global", keep_masks=True)
        written: dict[str, torch.Tensor] = {}
        for file in sorted(out.glob("*.safetensors")):
            written.update(st.load_file(str(file)))
        want = reference(tensors, [None] * len(tensors), k, True)
        got = [written[n + "_mask"].reshape(-1) == 0 for n in names]
        assert_equal(got, want, k)


# The one driver (engine.run): the portable steps' first count pass about the sampled
# pivots, wherever they fall against the k-th value, against the stable sort.

MORE_DTYPES = [*DTYPES, torch.int32, torch.int64]


def odd_scores(dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """Signed small integers (ties everywhere) with, for floats, zeros of both signs,
    infinities of both signs and a few NaN; tensors of many sizes, an empty one too."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for n in (700, 0, 1, 2300, 45):
        t = torch.randint(-6, 7, (n,), generator=generator).to(torch.float64)
        if dtype.is_floating_point and n > 2:
            t[:: max(1, n // 9)] = -0.0
            t[n // 2] = math.inf
            t[n // 3] = -math.inf
            t[n // 5 :: 97] = math.nan
        out.append(t.to(dtype))
    return out


def forced_pivots(values: torch.Tensor, k: int, where: str) -> tuple[float, float]:
    """Pivots placed `where` against the k-th smallest of the sorted competing `values`
    (against the greatest real value when the k-th is NaN: pivots are never NaN)."""
    real = values[values == values]
    kth = float(values[k - 1]) if k <= real.numel() else float(real[-1])
    below = real[real < kth]
    above = real[real > kth]
    low = float(below[0]) if below.numel() else kth
    high = float(above[-1]) if above.numel() else kth
    return {
        "below": (low, low),  # the k-th lies above both
        "at lower": (kth, high),
        "at upper": (low, kth),
        "around": (low, high),  # gathered, or sampled past the chunk
        "above": (high, high),
    }[where]


@pytest.mark.parametrize("dtype", MORE_DTYPES, ids=str)
@pytest.mark.parametrize("where", ["below", "at lower", "at upper", "around", "above"])
@pytest.mark.parametrize("magnitude", [False, True])
def test_portable_steps_from_any_first_count(
    dtype: torch.dtype, where: str, magnitude: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prunekit.select import sample
    from prunekit.select.sample import Bounds

    tensors = odd_scores(dtype, seed=MORE_DTYPES.index(dtype))
    flags = flags_of(tensors, "mask", seed=14)
    parts = zip(tensors, flags, strict=True)
    live = torch.cat([t.reshape(-1) if f is None else t[f == 1] for t, f in parts])
    compared = (live.abs() if magnitude else live).double().sort().values
    guessed: list[int] = []
    for k in counts(competing(tensors, flags))[1:-1]:
        a, b = forced_pivots(compared, k, where)

        def pivots(*args: Any, a: float = a, b: float = b, k: int = k, **kwargs: Any) -> Bounds:
            guessed.append(k)
            return Bounds(a, a, b, 100.0)

        monkeypatch.setattr(sample, "guess", pivots)
        want = reference(tensors, flags, k, magnitude)
        for chunk in (1 << 20, 500):  # one count that gathers them all, or samples
            with tuning.overridden(small=1 << 40, portable_chunk=chunk, sample=64):
                assert_equal(many(tensors, flags, k, magnitude, None), want, (k, chunk))
    assert guessed  # the driver's guess step made the portable path's first pivots


def test_small_inputs_and_signed_scores_take_the_one_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prunekit.select import engine

    steps: list[str] = []
    run = engine.run

    def recorded(chosen: Any, count: Any) -> Any:
        steps.append(type(chosen).__name__)
        return run(chosen, count)

    monkeypatch.setattr(engine, "run", recorded)
    signed = torch.randn(1 << 21, generator=torch.Generator().manual_seed(15))
    for scores, magnitude in ((signed[:5000], True), (signed, False), (signed.abs(), True)):
        k = scores.numel() // 3
        want = reference([scores], [None], k, magnitude)
        assert_equal(many([scores], [None], k, magnitude, None), want, magnitude)
    assert steps == ["Portable", "Bits", "Bits"]  # small: plain calls; else bits, signed too


ENGINE_PATHS = [name for name, tuned in PATHS.items() if tuned.get("small") == 0]


@pytest.mark.parametrize("path", ENGINE_PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_signed_scores_on_every_engine_path(path: str, dtype: torch.dtype) -> None:
    # Ranked by value, negative scores, zeros of both signs, infinities of both signs and
    # NaN (ranked last, the scores not checked) take the engine's steps: the k-th value
    # among the negatives (their magnitudes ranked the other way) or the others.
    tensors = odd_scores(dtype, seed=20 + DTYPES.index(dtype))
    with tuning.overridden(**PATHS[path]):
        for flagged in ("none", "mask"):
            flags = flags_of(tensors, flagged, seed=21)
            total = competing(tensors, flags)
            real = total - sum(
                int((t.isnan() if f is None else t.isnan() & (f == 1)).sum())
                for t, f in zip(tensors, flags, strict=True)
            )
            for k in sorted({*counts(real), 40, 200, real // 2}):  # a NaN k-th: see below
                want = reference(tensors, flags, k, magnitude=False)
                for keep in (None, dtype):
                    got = many(tensors, flags, k, False, keep)
                    assert_equal(got, want, (flagged, k, keep))


@pytest.mark.parametrize("path", ENGINE_PATHS)
def test_signed_products_are_the_scores_times_the_masks(path: str) -> None:
    generator = torch.Generator().manual_seed(22)
    tensors = [torch.randn(n, generator=generator) for n in (3000, 5000, 1)]
    products = [torch.empty_like(t) for t in tensors]
    sources = [lambda t=t: (t, None) for t in tensors]
    with tuning.overridden(**PATHS[path]):
        for k in (1, 2000, 7999):
            masks = smallest_k_many(
                sources, k, keep_dtype=torch.float32, products=products, finite=True
            )
            want = reference(tensors, [None] * 3, k, magnitude=False)
            for t, mask, product, w in zip(tensors, masks, products, want, strict=True):
                assert torch.equal(mask, (~w).float())
                assert torch.equal(product, t * mask)


@pytest.mark.parametrize("path", ENGINE_PATHS)
@pytest.mark.parametrize("magnitude", [False, True])
def test_a_nan_k_th_value_on_the_engine_still_gives_exactly_k(path: str, magnitude: bool) -> None:
    # Scores not checked rank NaN last: past the real values, the first NaN in order go.
    tensors = odd_scores(torch.float32, seed=30)
    with tuning.overridden(**PATHS[path]):
        for flagged in ("none", "mask", "bool"):
            flags = flags_of(tensors, flagged, seed=31)
            total = competing(tensors, flags)
            nan = sum(
                int((t.isnan() if f is None else t.isnan() & (f == 1)).sum())
                for t, f in zip(tensors, flags, strict=True)
            )
            for k in (total - nan + 1, total - nan // 2, total - 1):
                want = reference(tensors, flags, k, magnitude)
                assert_equal(many(tensors, flags, k, magnitude, None), want, (flagged, k))
