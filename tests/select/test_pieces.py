"""prunekit.select.pieces: the selection in pieces, against smallest_k_many on whole tensors.

Ranks are threads here (a Group whose collectives meet at a barrier), so every path of the
selection runs in milliseconds; tests/distributed/test_processes.py runs the same over real
processes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from helpers.thread_group import on_threads
from prunekit.distributed import all_reduce_statistics
from prunekit.distributed.collectives import Group
from prunekit.distributed.tensors import _runs
from prunekit.dropin.across_ranks import global_unstructured as across
from prunekit.select import passes, sample, smallest_k_many, tuning
from prunekit.select.pieces import Piece, Unrankable, select


def whole(tensors: list[torch.Tensor], masks: list[torch.Tensor | None], k: int) -> list[Any]:
    sources = [lambda t=t, m=m: (t, m) for t, m in zip(tensors, masks, strict=True)]
    return [c.reshape(-1) for c in smallest_k_many(sources, k, magnitude=True)]


def pieces_of(tensors: list[torch.Tensor], masks: list[torch.Tensor | None]) -> list[Piece]:
    return [
        Piece(lambda t=t, m=m: (t, m), t.numel(), t.dtype, key=i)
        for i, (t, m) in enumerate(zip(tensors, masks, strict=True))
    ]


def tensors_of(kind: str, dtype: torch.dtype, rows: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(hash((kind, str(dtype), rows)) % 1000)
    shapes = [(rows, 700), (3000,), (rows // 2, 500), (17, 3)]
    if kind == "ties":
        return [torch.randint(-5, 6, s, generator=generator).to(dtype) for s in shapes]
    return [torch.randn(s, generator=generator).to(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("kind", ["normal", "ties"])
@pytest.mark.parametrize("rows", [40, 1000])  # below and above what is held without a sample
@pytest.mark.parametrize("flagged", [False, True])
def test_one_process_equals_smallest_k_many(
    dtype: torch.dtype, kind: str, rows: int, flagged: bool
) -> None:
    tensors = tensors_of(kind, dtype, rows)
    generator = torch.Generator().manual_seed(1)
    masks: list[torch.Tensor | None] = [
        (torch.rand(t.shape, generator=generator) > 0.3).to(dtype) if flagged and i % 2 else None
        for i, t in enumerate(tensors)
    ]
    total = sum(
        t.numel() if m is None else int((m == 1).sum()) for t, m in zip(tensors, masks, strict=True)
    )
    for k in (0, 1, total // 3, total // 2, total - 1, total):
        selection = select(pieces_of(tensors, masks), lambda n, k=k: k, Group())
        want = whole(tensors, masks, k)
        for i, w in enumerate(want):
            assert torch.equal(selection.chosen(i), w), (k, i)


def test_mixed_dtypes_and_a_missed_guess(monkeypatch: pytest.MonkeyPatch) -> None:
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
    tensors = [
        t.to(d) for t, d in zip(tensors_of("normal", torch.float32, 1000), dtypes, strict=True)
    ]
    total = sum(t.numel() for t in tensors)
    monkeypatch.setattr(sample, "guess", lambda *args: (5.0, 5.0, 6.0))  # they miss: histograms
    for k in (5, total // 2):
        selection = select(pieces_of(tensors, [None] * 4), lambda n, k=k: k, Group())
        for i, w in enumerate(whole(tensors, [None] * 4, k)):
            assert torch.equal(selection.chosen(i), w)


def test_too_many_between_falls_back_to_histograms() -> None:
    tensors = [torch.zeros(600, 600), torch.randn(300, 300)]  # the k-th is among 360,000 zeros
    k = 200_000
    with tuning.overridden(guess=1000):  # the bounds from a sample, the gathering capped
        selection = select(pieces_of(tensors, [None, None]), lambda n: k, Group())
        for i, w in enumerate(whole(tensors, [None, None], k)):
            assert torch.equal(selection.chosen(i), w)


def test_the_selection_in_pieces_follows_select_tuning() -> None:
    tensors = tensors_of("normal", torch.float32, 1000)
    total = sum(t.numel() for t in tensors)
    seen: list[int] = []
    real = passes.between

    def between(*args: Any) -> Any:
        found = real(*args)
        seen.append(sum(v.numel() for v in found.held.values()))
        return found

    for chunk in (1 << 18, 1000):  # small chunks: many per tensor, the same selection
        with pytest.MonkeyPatch.context() as patch, tuning.overridden(chunk=chunk, guess=10**9):
            patch.setattr(passes, "between", between)
            selection = select(pieces_of(tensors, [None] * 4), lambda n: total // 3, Group())
            for i, w in enumerate(whole(tensors, [None] * 4, total // 3)):
                assert torch.equal(selection.chosen(i), w)
    assert seen == [total, total]  # below `guess` entries, no sample: every entry is held


def test_non_finite_scores_are_refused_after_the_amount() -> None:
    tensors = [torch.randn(50, 50), torch.randn(20)]
    tensors[1][3] = float("nan")
    with pytest.raises(Unrankable) as found:
        select(pieces_of(tensors, [None, None]), lambda n: 10, Group())
    assert found.value.pieces == [1]
    with pytest.raises(ValueError, match="too many"):
        select(pieces_of(tensors, [None, None]), _refuse, Group())


def _refuse(total: int) -> int:
    raise ValueError("too many")


def block_pieces(t: torch.Tensor, splits: list[int], dim: int, key: int) -> list[Piece]:
    """`t` cut along `dim` at `splits`, each block a piece with its runs in `t`."""
    pieces = []
    for lo, hi in zip([0, *splits], [*splits, t.shape[dim]], strict=True):
        block = t.narrow(dim, lo, hi - lo).contiguous()
        offsets = tuple(lo if d == dim else 0 for d in range(t.dim()))
        runs = _runs(tuple(t.shape), tuple(block.shape), offsets)
        pieces.append(Piece(lambda b=block: (b, None), block.numel(), t.dtype, key, runs))
    return pieces


def test_runs_of_a_block_follow_the_global_order() -> None:
    shape = (4, 6, 5)
    index = torch.arange(4 * 6 * 5).view(shape)
    blocks = [((4, 6, 5), (0, 0, 0)), ((2, 6, 5), (2, 0, 0)), ((4, 3, 5), (0, 3, 0))]
    blocks += [((3, 2, 2), (1, 4, 3)), ((4, 0, 5), (0, 6, 0))]
    for sizes, offsets in blocks:
        block = index[tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))]
        got = [g for r in _runs(shape, sizes, offsets) for g in range(r.start, r.start + r.length)]
        assert got == block.reshape(-1).tolist()[: len(got)] and len(got) == block.numel()


@pytest.mark.parametrize("dim", [0, 1])
def test_shards_and_replicas_tie_by_global_position(dim: int) -> None:
    torch.manual_seed(3)
    a, b = torch.randint(-3, 4, (90, 80)).float(), torch.randint(-3, 4, (30, 40)).float()
    pieces = [*block_pieces(a, [20, 50], dim, 0), *block_pieces(b, [7], dim, 1)]
    replica = block_pieces(a, [20, 50], dim, 0)[1]
    replica.counts = False
    pieces.append(replica)
    for k in (1000, 4321, 5000):
        selection = select(pieces, lambda n, k=k: k, Group())
        want = whole([a, b], [None, None], k)
        got_a = torch.zeros(a.shape, dtype=torch.bool)
        for i, (lo, hi) in enumerate([(0, 20), (20, 50), (50, a.shape[dim])]):
            part = got_a.narrow(dim, lo, hi - lo)
            part.copy_(selection.chosen(i).view(part.shape))
        assert torch.equal(got_a.reshape(-1), want[0])
        assert torch.equal(selection.chosen(5), selection.chosen(1))  # the replica, alike


@pytest.mark.parametrize("native", [True, False], ids=["C loop", "tensor operations"])
def test_a_rank_holding_only_replicas_marks_them(native: bool) -> None:
    """Rank 1 holds a replica of rank 0's tensor and counts nothing (HSDP's replicas at
    coordinate 1): its mask is rank 0's, on either path of the one pass."""
    torch.manual_seed(5)
    a = torch.randint(-3, 4, (96, 192)).float()

    def rank(group: Group) -> torch.Tensor:
        piece = Piece(lambda: (a, None), a.numel(), a.dtype, 0, counts=group.rank == 0)
        with tuning.overridden(native=native):
            return select([piece], lambda n: n // 2, group).chosen(0)

    want = whole([a], [None], a.numel() // 2)[0]
    for got in on_threads(2, rank):
        assert torch.equal(got, want)


def layers(scale: int, ties: bool) -> nn.ModuleList:
    generator = torch.Generator().manual_seed(4)
    out = nn.ModuleList()
    for rows, cols in [(60 * scale, 40), (33, 17), (120 * scale, 90), (8, 8), (70, 31)]:
        layer = nn.Linear(cols, rows, bias=False)
        with torch.no_grad():
            values = torch.randint(-3, 4, (rows, cols), generator=generator).float()
            layer.weight.copy_(values if ties else torch.randn(rows, cols, generator=generator))
        out.append(layer)
    return out


SPLITS = [  # scale, ties, pruned before, importance scores, amount
    (1, False, False, False, 0.6),
    (30, False, False, False, 0.3),
    (30, True, False, False, 0.5),
    (1, True, True, False, 0.5),
    (1, False, False, True, 777),
    (30, False, True, True, 0.4),
]


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize(("scale", "ties", "pruned", "scores", "amount"), SPLITS)
def test_layers_split_over_ranks(
    size: int, scale: int, ties: bool, pruned: bool, scores: bool, amount: float
) -> None:
    def model() -> nn.ModuleList:
        made = layers(scale, ties)
        if pruned:
            for i, layer in enumerate(made):
                mask = torch.rand(layer.weight.shape, generator=torch.Generator().manual_seed(i))
                prunekit.custom_from_mask(layer, "weight", (mask > 0.4).float())
        return made

    def given(made: nn.ModuleList, i: int) -> torch.Tensor:
        return torch.randn(made[i].weight.shape, generator=torch.Generator().manual_seed(9 + i))

    one = model()
    pairs = [(layer, "weight") for layer in one]
    importance = {p: given(one, i) for i, p in enumerate(pairs)} if scores else None
    prunekit.global_unstructured(pairs, prunekit.L1Unstructured, importance, amount=amount)
    cuts = [0, 1, 5] if size == 2 else [0, 2, 2, 5]  # with 3 ranks, rank 1 holds none

    def rank(group: Group) -> list[torch.Tensor]:
        made = model()
        mine = range(cuts[group.rank], cuts[group.rank + 1])
        importance = {(made[i], "weight"): given(made, i) for i in mine} if scores else None
        pairs = [(made[i], "weight") for i in mine]
        across(pairs, prunekit.L1Unstructured, importance, process_group=group, amount=amount)
        return [made[i].weight_mask for i in mine]

    got = [m for masks in on_threads(size, rank) for m in masks]
    for g, layer in zip(got, one, strict=True):
        assert torch.equal(g, layer.weight_mask)


def test_a_bad_entry_on_one_rank_raises_on_all() -> None:
    def rank(group: Group) -> str:
        made = layers(1, False)
        name = "bias" if group.rank == 1 else "weight"
        try:
            pairs = [(made[group.rank], name)]
            across(pairs, prunekit.L1Unstructured, process_group=group, amount=0.5)
        except (ValueError, TypeError) as error:
            return f"{error} {prunekit.is_pruned(made)}"
        return "pruned"

    found = on_threads(3, rank)
    assert "parameter 'bias' of Linear" in found[1] and found[1].endswith("False")
    assert all("rank(s) [1] of the 3 failed" in f and f.endswith("False") for f in found)
    assert found[0] == found[1] == found[2]  # the same error on every rank


def test_methods_that_cannot_rank_across_ranks() -> None:
    layer = nn.Linear(3, 3)
    for method in (prunekit.LnStructured, prunekit.RandomStructured, prunekit.Identity):
        with pytest.raises(TypeError, match="global_unstructured"):
            across([(layer, "weight")], method, process_group=Group(), amount=0.5)
    with pytest.raises(TypeError, match="global_unstructured"):
        across([(layer, "weight")], prunekit.LnStructured, process_group=Group(), amount=0.5, n=2)
    assert not prunekit.is_pruned(layer)
    with pytest.raises(ValueError, match=r"needs torch\.distributed initialized"):
        prunekit.global_unstructured(
            [(layer, "weight")], prunekit.L1Unstructured, amount=0.5, process_group=object()
        )


def test_statistics_over_thread_ranks() -> None:
    def stats(rank: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(rank)
        return {"h": torch.randn(4, 4, generator=g), "n": torch.rand(4, generator=g).half()}

    summed = on_threads(3, lambda group: all_reduce_statistics(stats(group.rank), group))
    weighted = on_threads(
        3, lambda group: all_reduce_statistics(stats(group.rank), group, weight=group.rank + 1)
    )
    for name in ("h", "n"):
        parts = [stats(r)[name].double() for r in range(3)]
        torch.testing.assert_close(summed[2][name].double(), sum(parts), atol=1e-2, rtol=1e-3)
        mean = sum(p * (r + 1) for r, p in enumerate(parts)) / 6
        torch.testing.assert_close(weighted[1][name].double(), mean, atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="called with different arguments"):
        on_threads(2, lambda group: all_reduce_statistics({f"x{group.rank}": torch.ones(2)}, group))


def test_prune_model_global_scope_over_ranks() -> None:
    whole = layers(10, True)
    prunekit.prune_model(whole, 0.55, scope="global")

    def rank(group: Group) -> list[torch.Tensor]:
        made = layers(10, True)
        mine = nn.ModuleList(made[i] for i in ([0, 1], [2, 3, 4])[group.rank])
        prunekit.prune_model(mine, 0.55, scope="global", process_group=group)
        return [layer.weight_mask for layer in mine]

    got = [m for masks in on_threads(2, rank) for m in masks]
    assert all(torch.equal(g, layer.weight_mask) for g, layer in zip(got, whole, strict=True))
    with pytest.raises(ValueError, match="scope='global'"):
        prunekit.prune_model(layers(1, False), 0.5, process_group=Group())


def test_calibration_statistics_of_ranks_equal_those_of_all_batches() -> None:
    """Each rank's Hessian is the mean of X^T X over its rows, the squared norms a sum:
    reduced with the rows as the Hessian's weight, they are those of all rows at once."""
    data = [torch.randn(rows, 5, generator=torch.Generator().manual_seed(rows)) for rows in (7, 20)]

    def rank(group: Group) -> dict[str, torch.Tensor]:
        x = data[group.rank]
        mine = {"fc.hessian": x.T @ x / x.shape[0], "fc.squares": x.pow(2).sum(0).double()}
        return all_reduce_statistics(mine, group, weight={"fc.hessian": x.shape[0]})

    everything = torch.cat(data)
    for found in on_threads(2, rank):
        torch.testing.assert_close(found["fc.hessian"], everything.T @ everything / 27)
        torch.testing.assert_close(found["fc.squares"], everything.pow(2).sum(0).double())
    with pytest.raises(ValueError, match="not a statistic"):
        all_reduce_statistics({"a": torch.ones(1)}, Group(), weight={"b": 1.0})
    with pytest.raises(ValueError, match="invalid weight"):
        all_reduce_statistics({"a": torch.ones(1)}, Group(), weight=-1)
    with pytest.raises(TypeError, match="floating-point"):
        all_reduce_statistics({"a": torch.ones(1, dtype=torch.int64)}, Group())
