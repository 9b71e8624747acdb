"""SparseGPT's sweep against a plain reference (explicit inverses, one column at a time, no
blocks, no Cholesky), exact OBS on a single weight, and its errors (the refit after the sweep:
test_sparsegpt_refit.py)."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import numpy as np
import pytest
import torch

import prunekit as prune
from prunekit.core.amount import Amount
from prunekit.criteria.sparsegpt import SparseGPT, sparsegpt_prune, sparsegpt_prune_shared


def plain_sparsegpt(
    w: torch.Tensor, h: torch.Tensor, amount: float, kind: str, blocksize: int, damp: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The algorithm as written in the paper, slowly: at each column j, every row whose
    entry is pruned moves its error onto the columns after j with the inverse of the
    Hessian restricted to columns j, j+1, ... (the OBS update); masks are chosen at each
    block's start from w^2 / [H_{j:,j:}^-1]_00; 2:4 at each group's start, per row, the
    two of the four whose pruning, swept column by column, adds the least loss ('2:4 by
    saliency': the two of least w^2 / [H_{j:,j:}^-1]_00, each alone)."""
    w, h = w.clone().double(), h.clone().double()
    rows, cols = w.shape
    dead = h.diagonal() == 0
    h[dead, dead] = 1
    h += damp * h.diagonal().mean() * torch.eye(cols, dtype=torch.float64)
    inverses = [torch.linalg.inv(h[j:, j:]) for j in range(cols)]
    pruned = torch.zeros(rows, cols, dtype=torch.bool)

    def saliency(r: int, j: int) -> float:
        return 0.0 if dead[j] else float(w[r, j] ** 2 / inverses[j][0, 0])

    total = round(amount * rows * cols)
    row_total = round(amount * cols)
    for b0 in range(0, cols, blocksize):
        b1 = min(cols, b0 + blocksize)
        width = b1 - b0
        if kind == "unstructured":
            n = rows * cols
            k = (2 * total * rows * b1 + n) // (2 * n) - (2 * total * rows * b0 + n) // (2 * n)
            ranked = sorted(
                (saliency(r, j), r * width + j - b0, r, j)
                for r in range(rows)
                for j in range(b0, b1)
            )
            for *_, r, j in ranked[:k]:
                pruned[r, j] = True
        if kind == "row":
            k = (2 * row_total * b1 + cols) // (2 * cols) - (2 * row_total * b0 + cols) // (
                2 * cols
            )
            for r in range(rows):
                for _, j in sorted((saliency(r, j), j) for j in range(b0, b1))[:k]:
                    pruned[r, j] = True
        for j in range(b0, b1):
            if kind == "2:4" and (j - b0) % 4 == 0:
                for r in range(rows):
                    ways = itertools.combinations(range(j, j + 4), 2)
                    best = min(ways, key=lambda way: group_loss(w[r], way, inverses, dead))
                    pruned[r, list(best)] = True
            if kind == "2:4 by saliency" and (j - b0) % 4 == 0:
                for r in range(rows):
                    for _, c in sorted((saliency(r, c), c) for c in range(j, j + 4))[:2]:
                        pruned[r, c] = True
            for r in range(rows):
                if pruned[r, j]:
                    hinv = inverses[j]
                    w[r, j:] -= w[r, j] / hinv[0, 0] * hinv[0, :]
    return ~pruned, w.masked_fill(pruned, 0)


def group_loss(
    row: torch.Tensor, way: tuple[int, ...], inverses: list[torch.Tensor], dead: torch.Tensor
) -> float:
    """The loss of pruning columns `way` (increasing) of `row`, each in turn moving its
    error onto the columns after it; an input that never fired costs nothing."""
    row = row.clone()
    row[dead] = 0
    loss = 0.0
    for j in way:
        hinv = inverses[j]
        loss += float(row[j] ** 2 / hinv[0, 0])
        row[j:] -= row[j] / hinv[0, 0] * hinv[0, :]
    return loss


def hessian(cols: int, samples: int = 64, seed: int = 0) -> torch.Tensor:
    x = torch.randn(
        samples, cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    return x.T @ x


PATTERNS: dict[str, Any] = {
    "unstructured": prune.Unstructured(),
    "row": prune.PerRow(),
    "2:4": prune.NM(2, 4),
}


@pytest.mark.parametrize("kind", ["unstructured", "row", "2:4"])
@pytest.mark.parametrize("blocksize", [4, 8, 128])
@pytest.mark.parametrize("damp", [0.0, 0.01])
def test_matches_the_plain_reference(kind: str, blocksize: int, damp: float) -> None:
    w = torch.randn(6, 16, dtype=torch.float64)
    h = hessian(16)
    h[5, :] = h[:, 5] = 0  # an input that never fires
    keep, updated = sparsegpt_prune(
        w, h, Amount(0.5, "t"), PATTERNS[kind], settings=SparseGPT(damp, blocksize, refit=0)
    )
    ref_keep, ref_w = plain_sparsegpt(w, h, 0.5, kind, blocksize, damp if damp else 0.0)
    assert torch.equal(keep, ref_keep)
    assert torch.allclose(updated, ref_w, atol=1e-10, rtol=1e-10)
    assert int((~keep).sum()) == 48
    assert bool((updated[~keep] == 0).all())


def test_nm_groups_prune_the_way_of_least_loss_not_of_least_saliency() -> None:
    """Correlated inputs: pruning one column of a group moves the next, so the two columns
    of least saliency (each alone) are often not the pair of least loss."""
    generator = torch.Generator().manual_seed(1)
    mix = torch.randn(8, 8, generator=generator, dtype=torch.float64)
    x = torch.randn(200, 8, generator=generator, dtype=torch.float64) @ mix
    w = torch.randn(32, 8, generator=generator, dtype=torch.float64)
    h = x.T @ x
    settings = SparseGPT(damp=0.01, refit=0)  # the sweep alone, as the reference
    keep, updated = sparsegpt_prune(w, h, Amount(0.5, "t"), prune.NM(2, 4), settings=settings)
    ref_keep, ref_w = plain_sparsegpt(w, h, 0.5, "2:4", 8, 0.01)
    assert torch.equal(keep, ref_keep)
    assert torch.allclose(updated, ref_w, atol=1e-10)
    loss = float(((x @ (w - updated).T) ** 2).sum())
    _, by_saliency = plain_sparsegpt(w, h, 0.5, "2:4 by saliency", 8, 0.01)
    assert not torch.equal(by_saliency == 0, ~keep)
    assert loss < float(((x @ (w - by_saliency).T) ** 2).sum())


def test_one_pruned_weight_is_exact_obs() -> None:
    """Pruning only column 0's entry: the OBS optimum, loss w0^2 / [H^-1]_00, equal to the
    least-squares best of the weights left."""
    x = torch.randn(40, 5, dtype=torch.float64)
    w = torch.tensor([[0.01, 1.0, -2.0, 0.5, 3.0]], dtype=torch.float64)
    h = x.T @ x
    keep, updated = sparsegpt_prune(
        w, h, Amount(1, "t"), prune.Unstructured(), settings=SparseGPT(damp=0.0, refit=0)
    )
    assert keep.tolist() == [[False, True, True, True, True]]
    loss = float(((x @ w.T - x @ updated.T) ** 2).sum())
    assert loss == pytest.approx(float(w[0, 0] ** 2 / torch.linalg.inv(h)[0, 0]), rel=1e-9)
    best = torch.linalg.lstsq(x[:, 1:], x @ w.T).solution
    assert torch.allclose(updated[0, 1:], best[:, 0], atol=1e-9)


def test_earlier_mask_stays_and_counts() -> None:
    w = torch.randn(4, 8, dtype=torch.float64)
    alive = torch.rand(4, 8) > 0.25
    keep, _ = sparsegpt_prune(w, hessian(8), Amount(0.5, "t"), prune.Unstructured(), alive=alive)
    assert not bool((keep & ~alive).any())
    assert int(keep.sum()) == int(alive.sum()) - round(0.5 * int(alive.sum()))
    keep, _ = sparsegpt_prune(w, hessian(8), Amount(0.5, "t"), prune.NM(2, 4), alive=alive)
    assert int(keep.reshape(-1, 4).sum(1).max()) <= 2


def test_float32_agrees_with_float64() -> None:
    w = torch.randn(32, 64)
    h = hessian(64, samples=256)
    keep, updated = sparsegpt_prune(w, h.float(), Amount(0.5, "t"), prune.NM(2, 4))
    keep64, updated64 = sparsegpt_prune(w.double(), h, Amount(0.5, "t"), prune.NM(2, 4))
    assert (keep == keep64).float().mean() > 0.99
    assert updated.dtype == torch.float32
    assert torch.allclose(updated.double(), updated64, atol=1e-3)


@pytest.mark.parametrize(
    ("pattern", "amount", "settings", "words"),
    [
        (prune.NM(2, 4), 0.5, SparseGPT(blocksize=6), "not a multiple of m=4"),
        (prune.NM(2, 4), 0.3, SparseGPT(), "expected amount=0.5"),
        (prune.Channels(0), 0.5, SparseGPT(), "SparseGPT prunes with the patterns"),
        (prune.PerRow(dim=2), 0.5, SparseGPT(), "patterns .* got PerRow\\(dim=2\\)"),
        (prune.Unstructured(), 0.5, SparseGPT(damp=0.0), "not positive definite"),
    ],
)
def test_errors(pattern: Any, amount: float, settings: SparseGPT, words: str) -> None:
    h = torch.zeros(8, 8, dtype=torch.float64)
    h[0, 1] = h[1, 0] = 1.0  # indefinite without dampening
    h[0, 0] = h[1, 1] = 0.5
    with pytest.raises(ValueError, match=words):
        sparsegpt_prune(torch.randn(3, 8), h, Amount(amount, "t"), pattern, settings=settings)


@pytest.mark.parametrize("bad", [{"damp": -1.0}, {"blocksize": 0}, {"damp": "x"}])
def test_settings_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError), match="SparseGPT: invalid"):
        SparseGPT(**bad)


def test_inputs_whose_squares_overflow_float32_are_named_so() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    before = model[0].weight.detach().clone()
    batches = [torch.full((2, 4), 1e20)]  # finite, but 1e40 overflows float32
    with pytest.raises(ValueError, match=r"Hessian .* holds inf entries: the squares of its inp"):
        prune.prune_model(model, 0.5, method="sparsegpt", calibration=batches)
    assert torch.equal(model[0].weight, before)
    assert not prune.is_pruned(model)


@pytest.mark.parametrize("kind", ["unstructured", "row", "2:4"])
def test_weights_sharing_a_hessian_are_pruned_as_each_alone(kind: str) -> None:
    """Query, key and value (or gate and up) swept once with one factor: each keeps the
    masks and updates it gets alone, its own counts included."""
    generator = torch.Generator().manual_seed(1)
    weights = [
        torch.randn(rows, 24, generator=generator, dtype=torch.float64) for rows in (6, 3, 5)
    ]
    alives = [None, torch.rand(3, 24, generator=generator) > 0.3, None]
    h = hessian(24, seed=2)
    # damp 0.1 leaves one group of the third weight with two ways of equal loss up to
    # rounding, which the stacked and the single sweep round apart
    settings = SparseGPT(damp=0.01, blocksize=8)
    together = sparsegpt_prune_shared(
        weights, h, Amount(0.5, "t"), PATTERNS[kind], alives, settings
    )
    for weight, alive, (keep, updated) in zip(weights, alives, together, strict=True):
        alone_keep, alone = sparsegpt_prune(
            weight, h, Amount(0.5, "t"), PATTERNS[kind], alive, settings
        )
        assert torch.equal(keep, alone_keep)
        assert torch.allclose(updated, alone, atol=1e-12, rtol=1e-12)


def test_a_shared_sweep_names_the_weight_an_amount_does_not_fit() -> None:
    weights = [torch.randn(4, 8), torch.randn(2, 8)]
    with pytest.raises(ValueError, match=r"layers.1.k_proj.*amount=20"):
        sparsegpt_prune_shared(
            weights,
            hessian(8).float(),
            Amount(20, "t"),  # 20 of q's 32 entries, but k has 16
            prune.Unstructured(),
            names=["layers.1.q_proj", "layers.1.k_proj"],
        )


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"damp": math.inf}, ValueError, "invalid damp=inf; expected a finite float >= 0"),
        ({"damp": math.nan}, ValueError, "SparseGPT: invalid damp=nan"),
        ({"damp": -0.1}, ValueError, "SparseGPT: invalid damp=-0.1"),
        ({"damp": True}, TypeError, "SparseGPT: invalid damp=True of type bool"),
        ({"damp": "0.1"}, TypeError, "SparseGPT: invalid damp='0.1' of type str"),
        ({"blocksize": 0}, ValueError, "SparseGPT: invalid blocksize=0; expected an int >= 1"),
        ({"blocksize": 2.0}, TypeError, "SparseGPT: invalid blocksize=2.0 of type float"),
        ({"blocksize": True}, TypeError, "SparseGPT: invalid blocksize=True of type bool"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused(kwargs: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error, match=re.escape(words)):
        SparseGPT(**kwargs)


def test_numpy_numbers_are_settings_too() -> None:
    settings = SparseGPT(damp=np.float32(0.05), blocksize=np.int64(64))  # type: ignore[arg-type]
    w, h = torch.randn(8, 128), torch.eye(128)
    keep, _ = sparsegpt_prune(w, h, Amount(0.5, "t"), prune.Unstructured(), settings=settings)
    assert int(keep.sum()) == 8 * 64


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_weight_that_is_not_finite_is_refused_naming_the_entry(bad: float) -> None:
    """The sweep would carry the entry's error into every later column of its row."""
    w = torch.randn(4, 8)
    w[2, 3] = bad
    words = r"up: t: the weights hold 1 value\(s\).* at index \(2, 3\)"
    with pytest.raises(ValueError, match=words):
        sparsegpt_prune_shared(
            [w], hessian(8).float(), Amount(0.5, "t"), prune.Unstructured(), names=["up"]
        )
    alive = torch.ones(4, 8, dtype=torch.bool)
    alive[2, 3] = False  # pruned before: it does not compete, and stays 0
    keep, updated = sparsegpt_prune(w, hessian(8).float(), Amount(0.5, "t"), prune.NM(2, 4), alive)
    assert bool(torch.isfinite(updated).all())
    assert not bool(keep[2, 3])


@pytest.mark.parametrize("pattern", ["unstructured", "row", "2:4"])
def test_prune_model_refuses_a_weight_that_is_not_finite_and_changes_nothing(pattern: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    with torch.no_grad():
        model[2].weight[1, 5] = math.nan  # the last layer: nothing after it reads the NaN
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batches = [torch.randn(16, 8) for _ in range(2)]
    with pytest.raises(ValueError, match=r"'2\.weight'.*e\.g\. nan at index \(1, 5\)"):
        prune.prune_model(model, 0.5, method="sparsegpt", pattern=pattern, calibration=batches)
    assert not prune.is_pruned(model)
    after = model.state_dict()
    assert all(torch.equal(after[k].nan_to_num(), v.nan_to_num()) for k, v in before.items())
    assert torch.isnan(model[2].weight).sum() == 1
