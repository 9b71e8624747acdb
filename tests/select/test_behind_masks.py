"""What lies behind a mask never counts in a selection, whatever its value.

An entry whose flag is not 1 (pruned before) does not compete: NaN or infinity there is not
ranked and not refused, on every path of the engine (the count pass as the C loop or as
tensor operations, every entry held, the 16-bit histograms, one process or thread ranks)
and of the portable strategy. A NaN or infinity among the competing entries is refused as
before. Each selection is compared, exactly, with one made apart from the engine: a stable
sort of the competing magnitudes alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.thread_group import on_threads
from prunekit.distributed.collectives import Group
from prunekit.patterns.unstructured import Unstructured
from prunekit.select import NotFinite, Source, smallest_k_many, tuning
from prunekit.select.pieces import Piece, Unrankable, select

BEHIND = [math.nan, math.inf, -math.inf]
BEHIND_IDS = ["nan", "inf", "-inf"]
MAGNITUDES, MAGNITUDES_IDS = BEHIND[:2], BEHIND_IDS[:2]  # -inf ranks by magnitude as inf
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]

# The paths of a selection, by tuning: every entry held (no sample), the count pass as
# tensor operations or as the C loop (a sample, several chunks and threads), and the
# portable strategy (the defaults, as the inputs are small; smallest_k_many only).
ROUTES: dict[str, dict[str, Any]] = {
    "held": {"small": 0, "guess": 10**9},
    "tensors": {"small": 0, "native": False, "chunk": 4096, "guess": 1000, "sample": 512},
    "native": {
        "small": 0,
        "native": True,
        "chunk": 4096,
        "step": 4096,
        "part": 1024,
        "threads": lambda: 2,
        "guess": 1000,
        "sample": 512,
    },
    "portable": {},
}


def route(name: str) -> AbstractContextManager[tuning.Tuning]:
    return tuning.overridden(**ROUTES[name])


def tensors_of(dtype: torch.dtype, seed: int = 0) -> list[Tensor]:
    """Scores with ties (16-bit formats round many normal draws alike), of a few shapes."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(40, 150), (3000,), (20, 250), (17, 3)]
    return [torch.randn(s, generator=generator).to(dtype) for s in shapes]


def masks_of(tensors: list[Tensor], kind: str) -> list[Tensor | None]:
    """Flags: about 60 % of the entries compete; the last tensor has none (all compete)."""
    generator = torch.Generator().manual_seed(7)
    masks: list[Tensor | None] = []
    for i, t in enumerate(tensors):
        if i == len(tensors) - 1:
            masks.append(None)
            continue
        live = torch.rand(t.shape, generator=generator) > 0.4
        masks.append(live if kind == "bool" else live.to(t.dtype))
    return masks


def behind(tensors: list[Tensor], masks: list[Tensor | None], value: float) -> list[Tensor]:
    """Copies of `tensors` holding `value` at every entry that does not compete."""
    out = []
    for t, m in zip(tensors, masks, strict=True):
        t = t.clone()
        if m is not None:
            t[m != 1] = value
        out.append(t)
    return out


def reference(
    tensors: list[Tensor], masks: list[Tensor | None], k: int, signed: bool = False
) -> list[Tensor]:
    """The `k` smallest competing magnitudes (`signed`: values), ties to the earlier tensor,
    then the lower index: a stable sort of the competing entries alone (what lies behind is
    never read)."""
    values, owners, places = [], [], []
    for i, (t, m) in enumerate(zip(tensors, masks, strict=True)):
        flat = t.reshape(-1)
        where = torch.arange(flat.numel()) if m is None else (m.reshape(-1) == 1).nonzero()[:, 0]
        values.append(flat[where].double() if signed else flat[where].double().abs())
        owners.append(torch.full_like(where, i))
        places.append(where)
    order = torch.sort(torch.cat(values), stable=True).indices[:k]
    owner, place = torch.cat(owners)[order], torch.cat(places)[order]
    chosen = [torch.zeros(t.numel(), dtype=torch.bool) for t in tensors]
    for i, c in enumerate(chosen):
        c[place[owner == i]] = True
    return chosen


def sources_of(tensors: list[Tensor], masks: list[Tensor | None]) -> list[Source]:
    return [_source(t, m) for t, m in zip(tensors, masks, strict=True)]


def _source(t: Tensor, m: Tensor | None) -> Source:
    return lambda: (t, m)


def pieces_of(tensors: list[Tensor], masks: list[Tensor | None]) -> list[Piece]:
    pairs = enumerate(zip(sources_of(tensors, masks), tensors, strict=True))
    return [Piece(source, t.numel(), t.dtype, key=i) for i, (source, t) in pairs]


def competing(tensors: list[Tensor], masks: list[Tensor | None]) -> int:
    pairs = zip(tensors, masks, strict=True)
    return sum(t.numel() if m is None else int((m == 1).sum()) for t, m in pairs)


def counts(tensors: list[Tensor], masks: list[Tensor | None]) -> Iterator[int]:
    """Every k that matters: none, one, a third, all but one, all."""
    total = competing(tensors, masks)
    yield from (0, 1, total // 3, total - 1, total)


# --- the engine: select, in one process and over thread ranks ---------------------------------


@pytest.mark.parametrize("kind", ["mask", "bool"])
@pytest.mark.parametrize("name", ["held", "tensors", "native"])
@pytest.mark.parametrize("value", MAGNITUDES, ids=MAGNITUDES_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_select_ranks_the_competing_entries_alone(
    dtype: torch.dtype, value: float, name: str, kind: str
) -> None:
    """16-bit scores take the histograms of their bits; the others the count pass."""
    clean = tensors_of(dtype)
    masks = masks_of(clean, kind)
    dirty = behind(clean, masks, value)
    with route(name):
        for k in counts(clean, masks):
            selection = select(pieces_of(dirty, masks), k, Group())
            for i, want in enumerate(reference(clean, masks, k)):
                assert torch.equal(selection.chosen(i), want), (k, i)


@pytest.mark.parametrize("value", BEHIND, ids=BEHIND_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_select_over_thread_ranks_ranks_the_competing_entries_alone(
    dtype: torch.dtype, value: float
) -> None:
    clean = tensors_of(dtype)
    masks = masks_of(clean, "mask")
    dirty = behind(clean, masks, value)
    every = pieces_of(dirty, masks)
    k = competing(clean, masks) // 3

    def rank(group: Group) -> dict[int, Tensor]:
        mine = [p for p in every if p.key % group.size == group.rank]
        with route("tensors"):
            selection = select(mine, lambda n: k, group)
            return {p.key: selection.chosen(i) for i, p in enumerate(mine)}

    got = {key: c for found in on_threads(2, rank) for key, c in found.items()}
    for i, want in enumerate(reference(clean, masks, k)):
        assert torch.equal(got[i], want), i


@pytest.mark.parametrize("name", ["held", "tensors", "native"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_select_refuses_a_competing_nan_naming_its_piece_alone(
    dtype: torch.dtype, name: str
) -> None:
    """Piece 0 holds NaN behind its mask only, piece 1 one NaN that competes: piece 1 is
    named, and no other; for every k, none and all too."""
    clean = tensors_of(dtype)
    masks = masks_of(clean, "mask")
    dirty = behind(clean, masks, math.nan)
    alive = masks[1]
    assert alive is not None
    dirty[1][(alive == 1).nonzero()[0, 0]] = math.nan
    with route(name):
        for k in counts(clean, masks):
            with pytest.raises(Unrankable, match="NaN or infinity") as found:
                select(pieces_of(dirty, masks), k, Group())
            assert found.value.pieces == [1], k


# --- smallest_k_many: its one pass with marks, and the portable strategy ----------------------


@pytest.mark.parametrize("keep", [False, True], ids=["bools", "masks"])
@pytest.mark.parametrize("name", ["held", "tensors", "native", "portable"])
@pytest.mark.parametrize("value", MAGNITUDES, ids=MAGNITUDES_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_smallest_k_many_asked_for_finite_scores_ranks_the_competing_entries_alone(
    dtype: torch.dtype, value: float, name: str, keep: bool
) -> None:
    """With `finite` (as every pattern asks), NaN or infinity behind a mask is no reason
    to refuse: the selection is the one of the competing entries."""
    clean = tensors_of(dtype)
    masks = masks_of(clean, "mask")
    dirty = behind(clean, masks, value)
    sources = sources_of(dirty, masks)
    with route(name):
        for k in counts(clean, masks):
            made = smallest_k_many(
                sources, k, magnitude=True, keep_dtype=dtype if keep else None, finite=True
            )
            for got, want in zip(made, reference(clean, masks, k), strict=True):
                assert torch.equal(got == 0 if keep else got, want), k


@pytest.mark.parametrize("name", ["held", "tensors", "native", "portable"])
@pytest.mark.parametrize("value", BEHIND, ids=BEHIND_IDS)
def test_smallest_k_many_by_value_ranks_the_competing_entries_alone(
    name: str, value: float
) -> None:
    """Ranked by signed value (-inf behind a mask is no reason either)."""
    clean = tensors_of(torch.float32)
    masks = masks_of(clean, "bool")
    dirty = behind(clean, masks, value)
    sources = sources_of(dirty, masks)
    with route(name):
        for k in counts(clean, masks):
            made = smallest_k_many(sources, k, finite=True)
            for got, want in zip(made, reference(clean, masks, k, signed=True), strict=True):
                assert torch.equal(got, want), k


@pytest.mark.parametrize("name", ["held", "tensors", "native", "portable"])
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_smallest_k_many_still_refuses_what_competes(name: str, bad: float) -> None:
    clean = tensors_of(torch.float32)
    masks = masks_of(clean, "mask")
    dirty = behind(clean, masks, math.nan)
    dirty[2].reshape(-1)[(masks[2] == 1).reshape(-1).nonzero()[-1, 0]] = bad  # type: ignore[union-attr]
    sources = sources_of(dirty, masks)
    with route(name):
        for k in counts(clean, masks):
            with pytest.raises(NotFinite, match="NaN or infinity"):
                list(smallest_k_many(sources, k, magnitude=True, finite=True))


# --- the entry points, which now leave what lies behind to the selection ----------------------


def pruned_layers(value: float, size: int) -> list[nn.Linear]:
    """Layers pruned once (half of each), `value` behind the first two layers' masks."""
    torch.manual_seed(3)
    made = [nn.Linear(size, size) for _ in range(3)]
    for layer in made:
        prunekit.l1_unstructured(layer, "weight", 0.5)
    with torch.no_grad():
        for layer in made[:2]:
            layer.get_parameter("weight_orig")[layer.get_buffer("weight_mask") == 0] = value
    return made


def never_none(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each time Unstructured.select gives None (the scores refused): the drop-in
    then ranks a gathered copy instead."""
    refused: list[str] = []
    real = Unstructured.select

    def select(self: Unstructured, *args: Any, **kwargs: Any) -> Any:
        made = real(self, *args, **kwargs)
        if made is None:
            refused.append("None")
        return made

    monkeypatch.setattr(Unstructured, "select", select)
    return refused


CALLS: dict[str, Callable[[list[nn.Linear]], object]] = {
    "l1_unstructured": lambda made: prunekit.l1_unstructured(made[0], "weight", 0.3),
    "global_unstructured": lambda made: prunekit.global_unstructured(
        [(m, "weight") for m in made], prunekit.L1Unstructured, amount=0.3
    ),
}


@pytest.mark.parametrize("size", [20, 300], ids=["portable", "engine"])
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("value", BEHIND, ids=BEHIND_IDS)
def test_a_dropin_pruning_again_ranks_past_what_lies_behind(
    monkeypatch: pytest.MonkeyPatch, value: float, call: str, size: int
) -> None:
    """The masks are those of the same layers with 0 behind; the selection ranked them
    itself (it refused them before, and the drop-in ranked a gathered copy)."""
    clean = pruned_layers(0.0, size)
    CALLS[call](clean)
    dirty = pruned_layers(value, size)
    refused = never_none(monkeypatch)
    CALLS[call](dirty)
    assert refused == []
    for c, d in zip(clean, dirty, strict=True):
        assert torch.equal(c.get_buffer("weight_mask"), d.get_buffer("weight_mask"))
    nan = torch.isnan(dirty[0].get_parameter("weight_orig"))  # what lies behind stays
    assert bool(nan.any()) == math.isnan(value)
