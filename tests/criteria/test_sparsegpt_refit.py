"""SparseGPT's refit of the weights kept: against a brute-force least-squares solve per
row, never worse than the sweep alone, and its setting checked."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
import torch

import prunekit as prune
from prunekit.core.amount import Amount
from prunekit.criteria.hessian import damped
from prunekit.criteria.sparsegpt import SparseGPT, refit, sparsegpt_prune, sparsegpt_prune_shared


def hessian(cols: int, samples: int = 30, seed: int = 0) -> torch.Tensor:
    """X^T X of correlated inputs (fewer samples than a well-spread H would need)."""
    generator = torch.Generator().manual_seed(seed)
    mix = torch.randn(cols, cols, generator=generator, dtype=torch.float64)
    x = torch.randn(samples, cols, generator=generator, dtype=torch.float64) @ mix
    return x.T @ x


def least_squares(
    start: torch.Tensor, dense: torch.Tensor, keep: torch.Tensor, h: torch.Tensor
) -> torch.Tensor:
    """Row by row, the entries `keep` marks that minimise (w - dense) H (w - dense)^T with
    the others fixed at their values in `start`: an explicit solve of the kept block."""
    best = start.clone()
    for r in range(start.shape[0]):
        free, fixed = keep[r], ~keep[r]
        if not bool(free.any()):
            continue
        shift = start[r, fixed] - dense[r, fixed]
        move = torch.linalg.solve(h[free][:, free], -(h[free][:, fixed] @ shift))
        best[r, free] = dense[r, free] + move
    return best


def loss(w: torch.Tensor, dense: torch.Tensor, h: torch.Tensor) -> float:
    d = (w - dense).double()
    return float(((d @ h.double()) * d).sum())


def test_as_many_steps_as_entries_reach_the_least_squares_solution() -> None:
    generator = torch.Generator().manual_seed(3)
    dense = torch.randn(7, 12, generator=generator, dtype=torch.float64)
    keep = torch.rand(7, 12, generator=generator) > 0.5
    keep[2] = False  # a row with nothing left to move
    keep[4] = True  # and one with everything
    h = damped(hessian(12), 0.01)
    w = dense.masked_fill(~keep, 0)
    start = w.clone()
    refit(w, dense, keep, h, 12)
    expected = least_squares(start, dense, keep, h)
    assert torch.allclose(w, expected, atol=1e-9, rtol=1e-9)
    assert torch.equal(w[~keep], start[~keep])  # the others do not move
    assert torch.equal(w[4], dense[4])  # nothing pruned: already the least error


def test_entries_held_at_other_values_stay_and_shape_the_solution() -> None:
    """Fixed entries that are not 0 keep their values, and the kept ones solve for them
    (the preconditioner, not the residual, holds the fixed entries out)."""
    generator = torch.Generator().manual_seed(5)
    dense = torch.randn(6, 10, generator=generator, dtype=torch.float64)
    keep = torch.rand(6, 10, generator=generator) > 0.4
    h = damped(hessian(10, seed=2), 0.01)
    start = torch.where(keep, dense, torch.randn(6, 10, generator=generator, dtype=torch.float64))
    w = start.clone()
    refit(w, dense, keep, h, 10)
    assert torch.equal(w[~keep], start[~keep])
    assert torch.allclose(w, least_squares(start, dense, keep, h), atol=1e-9, rtol=1e-9)


def test_each_step_lowers_the_error_or_keeps_it() -> None:
    generator = torch.Generator().manual_seed(4)
    dense = torch.randn(5, 16, generator=generator, dtype=torch.float64)
    keep = torch.rand(5, 16, generator=generator) > 0.5
    h = damped(hessian(16), 0.01)
    losses = []
    for steps in range(6):
        w = dense.masked_fill(~keep, 0)
        refit(w, dense, keep, h, steps)
        losses.append(loss(w, dense, h))
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(losses))
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.parametrize("pattern", [prune.Unstructured(), prune.PerRow(), prune.NM(2, 4)])
def test_prune_refits_the_sweep_with_its_mask(pattern: Any) -> None:
    """The same mask as the sweep alone; the weights kept, the sweep's refit; a lower error
    on the calibration Hessian (damped, the error both minimise)."""
    generator = torch.Generator().manual_seed(5)
    dense = torch.randn(6, 16, generator=generator, dtype=torch.float64)
    h = hessian(16)
    h[5, :] = h[:, 5] = 0  # an input that never fires
    swept = SparseGPT(damp=0.05, blocksize=8, refit=0)
    keep, plain = sparsegpt_prune(dense, h, Amount(0.5, "t"), pattern, settings=swept)
    fitted = SparseGPT(damp=0.05, blocksize=8, refit=16)
    keep2, better = sparsegpt_prune(dense, h, Amount(0.5, "t"), pattern, settings=fitted)
    assert torch.equal(keep, keep2)
    target = damped(h, 0.05)
    expected = plain.clone()
    refit(expected, dense, keep, target, 16)
    assert torch.allclose(better, expected, atol=1e-12, rtol=1e-12)
    assert bool((better[~keep] == 0).all())
    assert torch.allclose(better, least_squares(plain, dense, keep, target), atol=1e-8)
    assert loss(better, dense, target) < loss(plain, dense, target)


def test_an_earlier_mask_stays_pruned_through_the_refit() -> None:
    generator = torch.Generator().manual_seed(6)
    dense = torch.randn(4, 8, generator=generator, dtype=torch.float64)
    alive = torch.rand(4, 8, generator=generator) > 0.25
    settings = SparseGPT(refit=8)
    keep, w = sparsegpt_prune(
        dense, hessian(8), Amount(0.5, "t"), prune.Unstructured(), alive, settings
    )
    assert not bool((keep & ~alive).any())
    assert bool((w[~keep] == 0).all())


def test_weights_sharing_a_hessian_are_refit_as_each_alone() -> None:
    generator = torch.Generator().manual_seed(7)
    weights = [torch.randn(rows, 16, generator=generator, dtype=torch.float64) for rows in (5, 3)]
    h = hessian(16, seed=8)
    settings = SparseGPT(blocksize=8, refit=5)
    together = sparsegpt_prune_shared(weights, h, Amount(0.5, "t"), prune.NM(2, 4), None, settings)
    for weight, (keep, updated) in zip(weights, together, strict=True):
        alone_keep, alone = sparsegpt_prune(
            weight, h, Amount(0.5, "t"), prune.NM(2, 4), None, settings
        )
        assert torch.equal(keep, alone_keep)
        assert torch.allclose(updated, alone, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (-1, ValueError, "SparseGPT: invalid refit=-1; expected an int >= 0"),
        (1.5, TypeError, "SparseGPT: invalid refit=1.5 of type float"),
        (True, TypeError, "SparseGPT: invalid refit=True of type bool"),
        ("3", TypeError, "SparseGPT: invalid refit='3' of type str"),
    ],
)
def test_bad_refit_is_refused(value: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=re.escape(words)):
        SparseGPT(refit=value)


def test_damped_leaves_its_argument_and_sets_dead_inputs_apart() -> None:
    h = hessian(6)
    h[2, :] = h[:, 2] = 0
    before = h.clone()
    out = damped(h, 0.1)
    assert torch.equal(h, before)
    mean = float((before.diagonal().sum() + 1) / 6)  # the dead input's 1 counts
    assert float(out[2, 2]) == pytest.approx(1 + 0.1 * mean)
    assert float(out[0, 0]) == pytest.approx(float(before[0, 0]) + 0.1 * mean)
    assert torch.equal(out - torch.diag(out.diagonal()), before - torch.diag(before.diagonal()))
