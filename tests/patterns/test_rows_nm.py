"""PerRow and NM: exact masks (checked against plain loops), ties by index, composition with
earlier masks (through a container and through compute_mask), importance scores, errors,
and both frameworks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
from helpers.frameworks import Framework


def loop_rows(scores: torch.Tensor, alive: torch.Tensor, amount: float) -> torch.Tensor:
    """Plain reference: each row loses round(amount * alive) entries, smallest first, ties
    to the lower index."""
    keep = alive.clone().bool()
    for r in range(scores.shape[0]):
        live = [j for j in range(scores.shape[1]) if alive[r, j]]
        k = round(amount * len(live)) if isinstance(amount, float) else amount
        for j in sorted(live, key=lambda j: (abs(float(scores[r, j])), j))[:k]:
            keep[r, j] = False
    return keep


def loop_nm(scores: torch.Tensor, alive: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Plain reference: each group of m along the last dim keeps its n largest alive."""
    keep = alive.bool().contiguous().clone()
    flat_s, flat_k = scores.reshape(-1, m), keep.view(-1, m)
    for g in range(flat_s.shape[0]):
        live = [j for j in range(m) if flat_k[g, j]]
        extra = max(0, len(live) - n)
        for j in sorted(live, key=lambda j: (abs(float(flat_s[g, j])), j))[:extra]:
            flat_k[g, j] = False
    return keep


def masked(layer: nn.Module) -> torch.Tensor:
    return layer.weight_mask.bool()


def test_per_row_by_hand() -> None:
    layer = nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.1, -3.0, 2.0, 0.5], [1.0, 1.0, -1.0, 4.0]]))
    prune.Pruning.apply(layer, "weight", 0.5, pattern=prune.PerRow())
    # Row 1 has three entries of magnitude 1: the two of lower index go.
    assert layer.weight_mask.tolist() == [[0, 1, 1, 0], [0, 0, 1, 1]]


def test_nm_by_hand_and_ties() -> None:
    layer = nn.Linear(8, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -4.0, 3.0, 2.0, 5.0, 5.0, 5.0, 5.0]]))
    prune.Pruning.apply(layer, "weight", 0.5, pattern=prune.NM(2, 4))
    assert layer.weight_mask.tolist() == [[0, 1, 1, 0, 0, 0, 1, 1]]


@pytest.mark.parametrize("amount", [0.3, 0.5, 0.9, 3])
def test_per_row_matches_loop_first_and_second_pruning(amount: Any) -> None:
    layer = nn.Linear(12, 9)
    w = layer.weight.detach().clone()
    prune.Pruning.apply(layer, "weight", amount, pattern=prune.PerRow())
    assert torch.equal(masked(layer), loop_rows(w, torch.ones_like(w), amount))
    # Second pruning: rows now differ in what they have left (L1 first, unevenly).
    layer = nn.Linear(12, 9)
    w = layer.weight.detach().clone()
    prune.l1_unstructured(layer, "weight", 0.3)
    first = masked(layer).clone()
    prune.Pruning.apply(layer, "weight", amount, pattern=prune.PerRow())
    assert torch.equal(masked(layer), loop_rows(w, first, amount))
    # compute_mask with a default mask (the path of prune() and 'global' containers) agrees.
    method = prune.Pruning(amount, pattern=prune.PerRow())
    assert torch.equal(method.compute_mask(w, first.float()).bool(), masked(layer))


@pytest.mark.parametrize(("n", "m"), [(2, 4), (4, 8), (1, 4)])
def test_nm_matches_loop_first_and_second_pruning(n: int, m: int) -> None:
    torch.manual_seed(n * 10 + m)
    layer = nn.Linear(16, 6)
    w = layer.weight.detach().clone()
    amount = (m - n) / m
    prune.Pruning.apply(layer, "weight", amount, pattern=prune.NM(n, m))
    assert torch.equal(masked(layer), loop_nm(w, torch.ones_like(w), n, m))
    assert int(masked(layer).reshape(-1, m).sum(1).max()) == n
    # After a random pruning some groups have fewer than n left: they keep them all.
    layer = nn.Linear(16, 6)
    w = layer.weight.detach().clone()
    prune.random_unstructured(layer, "weight", 0.6)
    first = masked(layer).clone()
    prune.Pruning.apply(layer, "weight", amount, pattern=prune.NM(n, m))
    expected = loop_nm(w, first, n, m)
    assert torch.equal(masked(layer), expected)
    assert not bool((masked(layer) & ~first).any())  # nothing revived
    assert int(masked(layer).reshape(-1, m).sum(1).max()) <= n
    method = prune.Pruning(amount, pattern=prune.NM(n, m))
    assert torch.equal(method.compute_mask(w, first.float()).bool(), expected)


@pytest.mark.parametrize(("n", "m"), [(1, 2), (2, 4), (1, 4), (3, 4), (4, 8), (1, 8), (8, 16)])
def test_nm_many_ties_match_loop(n: int, m: int) -> None:
    # Scores of few distinct values (signs too): most groups have ties, which go to the
    # lower index, whether the groups are ranked pairwise (m <= 8) or by rows.
    torch.manual_seed(m)
    layer = nn.Linear(4 * m, 40, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randint(-2, 3, layer.weight.shape).float())
    w = layer.weight.detach().clone()
    prune.Pruning.apply(layer, "weight", (m - n) / m, pattern=prune.NM(n, m))
    assert torch.equal(masked(layer), loop_nm(w, torch.ones_like(w), n, m))


def test_nm_then_per_row_then_l1_compose() -> None:
    layer = nn.Linear(8, 4)
    w = layer.weight.detach().clone()
    prune.Pruning.apply(layer, "weight", 0.5, pattern=prune.NM(2, 4))
    after_nm = masked(layer).clone()
    prune.Pruning.apply(layer, "weight", 0.5, pattern=prune.PerRow())
    assert torch.equal(masked(layer), loop_rows(w, after_nm, 0.5))
    prune.l1_unstructured(layer, "weight", 2)
    assert int(masked(layer).sum()) == 8 - 2
    hook = next(iter(layer._forward_pre_hooks.values()))
    names = [type(m).__name__ for m in hook]
    assert names == ["Pruning", "Pruning", "L1Unstructured"]


def test_nm_on_conv_groups_input_channels() -> None:
    conv = nn.Conv2d(8, 3, 3)
    w = conv.weight.detach().clone()
    prune.Pruning.apply(conv, "weight", 0.5, pattern=prune.NM(2, 4))
    moved = w.movedim(1, -1)
    expected = loop_nm(moved, torch.ones_like(moved), 2, 4).movedim(-1, 1)
    assert torch.equal(conv.weight_mask.bool(), expected)
    assert int(conv.weight_mask.movedim(1, -1).reshape(-1, 4).sum(1).max()) == 2


def test_importance_scores_rank_instead_of_values() -> None:
    layer = nn.Linear(4, 2, bias=False)
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    prune.Pruning.apply(layer, "weight", 0.5, pattern=prune.PerRow(), importance_scores=scores)
    assert layer.weight_mask.tolist() == [[1, 1, 0, 0], [0, 0, 1, 1]]
    other = nn.Linear(4, 2, bias=False)
    prune.Pruning.apply(other, "weight", 0.5, pattern=prune.NM(2, 4), importance_scores=scores)
    assert other.weight_mask.tolist() == [[1, 1, 0, 0], [0, 0, 1, 1]]


def test_per_row_dim_one_prunes_columns_evenly() -> None:
    layer = nn.Linear(5, 8)
    prune.Pruning.apply(layer, "weight", 0.25, pattern=prune.PerRow(dim=1))
    assert layer.weight_mask.sum(0).tolist() == [6.0] * 5


def test_global_with_per_row_prunes_each_row() -> None:
    a, b = nn.Linear(8, 3), nn.Linear(4, 5)
    prune.global_unstructured(
        [(a, "weight"), (b, "weight")], prune.Pruning, amount=0.5, pattern=prune.PerRow()
    )
    assert a.weight_mask.sum(1).tolist() == [4.0] * 3
    assert b.weight_mask.sum(1).tolist() == [2.0] * 5


@pytest.mark.parametrize(
    ("pattern", "amount", "shape", "error", "words"),
    [
        (lambda: prune.NM(2, 4), 0.4, (4, 8), ValueError, "expected amount=0.5"),
        (lambda: prune.NM(2, 4), 2, (4, 8), ValueError, "expected amount=0.5"),
        (lambda: prune.NM(2, 4), 0.5, (4, 6), ValueError, "not a multiple of 4"),
        (lambda: prune.PerRow(), 5, (4, 4), ValueError, "amount=5"),
        (lambda: prune.PerRow(dim=2), 0.5, (4, 4), IndexError, "dim=2"),
    ],
)
def test_bad_input_fails_before_any_change(
    pattern: Any, amount: Any, shape: tuple[int, int], error: type, words: str
) -> None:
    layer = nn.Linear(shape[1], shape[0])
    before = layer.weight
    with pytest.raises(error, match=words) as info:
        prune.Pruning.apply(layer, "weight", amount, pattern=pattern())
    assert "parameter 'weight' of Linear" in str(info.value)
    assert layer.weight is before and not prune.is_pruned(layer)


@pytest.mark.parametrize("args", [(0, 4), (4, 4), (2.0, 4), (True, 4)])
def test_nm_constructor_refuses_bad_n_m(args: tuple[Any, Any]) -> None:
    with pytest.raises((ValueError, TypeError), match="NM: invalid"):
        prune.NM(*args)


def test_per_row_refuses_one_dim_and_nan() -> None:
    with pytest.raises(ValueError, match="needs rows"):
        prune.Pruning(0.5, pattern=prune.PerRow()).prune(torch.ones(4))
    scores = torch.ones(2, 4)
    scores[1, 2] = float("nan")
    for pattern in (prune.NM(2, 4), prune.PerRow()):
        with pytest.raises(ValueError, match=r"cannot be ranked, e\.g\. nan at index \(1, 2\)"):
            prune.Pruning(0.5, pattern=pattern).prune(scores)


@pytest.mark.parametrize(
    ("pattern", "shape"),
    [(prune.PerRow(), (0, 8)), (prune.PerRow(), (0, 4, 3)), (prune.PerRow(dim=1), (8, 0))],
)
def test_per_row_of_a_tensor_without_rows(pattern: Any, shape: tuple[int, ...]) -> None:
    """No rows (a layer of 0 outputs) is nothing to prune, as for every other pattern:
    not torch's error on reshaping 0 entries into (0, -1)."""
    pruned = prune.Pruning(0.5, pattern=pattern).prune(torch.ones(shape))
    assert pruned.shape == shape
    layer = nn.Linear(8, 1)
    layer.weight = nn.Parameter(torch.ones(0, 8))  # Linear(8, 0), without its init warning
    prune.Pruning.apply(layer, "weight", 0.5, pattern=prune.PerRow())
    assert layer.weight_mask.shape == (0, 8)


def test_rows_of_many_blocks_and_uneven_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from prunekit.select import rows as rowwise

    monkeypatch.setattr(rowwise, "_BLOCK", 16)  # rows ranked a few at a time
    w = torch.randint(0, 3, (10, 7)).float()  # many ties
    alive = torch.rand(10, 7) > 0.3
    got = prune.Pruning(0.5, pattern=prune.PerRow()).compute_mask(w, alive.float())
    assert torch.equal(got.bool(), loop_rows(w, alive, 0.5))


def test_both_frameworks_give_the_same_masks(framework: Framework) -> None:
    torch_layer = nn.Linear(8, 6)
    layer = framework.nn.Linear(8, 6)
    framework.copy_parameters(torch_layer, layer)
    prune.Pruning.apply(layer, "weight", 0.25, pattern=prune.PerRow())
    prune.Pruning.apply(layer, "weight", 0.5, pattern=prune.NM(2, 4))
    w = torch_layer.weight.detach()
    rows = loop_rows(w, torch.ones_like(w), 0.25)
    assert layer.weight_mask.tolist() == loop_nm(w, rows, 2, 4).float().tolist()
    assert int((layer.weight == 0).sum()) >= 24
