"""SparseGPT's refit with fewer buffers gives the same bits: the row dot products a few
rows at a time, the difference to the dense weights made in one buffer that becomes the
first direction, the preconditioner made in place (against the step as first written,
with fresh tensors for each product), and the stacked call against the refit of its
sweep's result."""

from __future__ import annotations

import pytest
import torch

from prunekit.core.amount import Amount
from prunekit.criteria.hessian import damped
from prunekit.criteria.sparsegpt import (
    SparseGPT,
    _rows_dot,
    refit,
    sparsegpt_prune_shared,
)
from prunekit.patterns import NM, Unstructured


def plain_refit(
    w: torch.Tensor, dense: torch.Tensor, keep: torch.Tensor, h: torch.Tensor, steps: int
) -> None:
    """The refit's steps with a fresh tensor for every product: the reference."""
    scaled = h.diagonal().reciprocal() * keep.to(dtype=w.dtype)
    residual = torch.mm(dense - w, h)
    direction = residual * scaled
    along = (residual * direction).sum(dim=1, keepdim=True)
    for _ in range(steps):
        moved = torch.mm(direction, h)
        curve = (direction * moved).sum(dim=1, keepdim=True)
        size = torch.where(curve > 0, along / curve, torch.zeros_like(curve))
        w.addcmul_(size, direction)
        residual.addcmul_(size, moved, value=-1)
        preconditioned = residual * scaled
        after = (residual * preconditioned).sum(dim=1, keepdim=True)
        ratio = torch.where(along > 0, after / along, torch.zeros_like(along))
        direction = preconditioned + direction * ratio
        along = after


def problem(
    rows: int, cols: int, seed: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pruned weights, dense weights, kept flags, damped Hessian)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(3 * cols, cols, generator=generator, dtype=dtype)
    x[:, 1] *= 1e3  # uneven scales, as a real layer's inputs
    dense = torch.randn(rows, cols, generator=generator, dtype=dtype)
    keep = torch.rand(rows, cols, generator=generator) > 0.5
    return dense.masked_fill(~keep, 0), dense, keep, damped(x.T @ x, 0.1)


@pytest.mark.parametrize("rows,work", [(10, 3), (10, 10), (600, 256), (7, 16)])
def test_row_dots_in_slices_are_the_dots_of_all_rows_at_once(rows: int, work: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    a = torch.randn(rows, 333, generator=generator)
    b = torch.randn(rows, 333, generator=generator) * 1e-3
    found = _rows_dot(a, b, torch.empty(min(work, rows), 333))
    assert torch.equal(found, (a * b).sum(dim=1, keepdim=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows,cols", [(600, 40), (5, 17)])
def test_refit_is_the_plain_refit_bit_for_bit(dtype: torch.dtype, rows: int, cols: int) -> None:
    w, dense, keep, h = problem(rows, cols, rows + cols, dtype)
    expected = w.clone()
    plain_refit(expected, dense, keep, h, 10)
    refit(w, dense, keep, h, 10)
    assert torch.equal(w, expected)


@pytest.mark.parametrize("pattern", [NM(2, 4), Unstructured()])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stacked_call_refits_its_sweep_as_the_plain_refit(
    pattern: NM | Unstructured, dtype: torch.dtype
) -> None:
    """Two weights sharing a Hessian, some entries already pruned: the call's refit (its
    difference made without a stacked copy of the weights) is the plain refit of the
    sweep's own result toward the stacked weights, 0 where not alive."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(96, 32, generator=generator)
    h = x.T @ x
    weights = [torch.randn(r, 32, generator=generator).to(dtype) for r in (300, 40)]
    alives = [torch.rand(r, 32, generator=generator) > 0.1 for r in (300, 40)]
    if isinstance(pattern, NM):
        alives = [torch.ones(r, 32, dtype=torch.bool) for r in (300, 40)]
    swept = sparsegpt_prune_shared(
        weights, h, Amount(0.5, "t"), pattern, alives, SparseGPT(refit=0)
    )
    settings = SparseGPT()  # the defaults' steps, whatever their number
    found = sparsegpt_prune_shared(weights, h, Amount(0.5, "t"), pattern, alives, settings)
    live = torch.cat(alives)
    keep = torch.cat([k for k, _ in swept])
    w = torch.cat([u.float() for _, u in sweep_float(weights, h, pattern, alives)])
    dense = torch.cat([weight.float() for weight in weights]).masked_fill(~live, 0)
    plain_refit(w, dense, keep, damped(h, settings.damp), settings.refit)
    assert torch.equal(torch.cat([k for k, _ in found]), keep)
    assert torch.equal(torch.cat([u for _, u in found]), w.to(dtype))


def sweep_float(
    weights: list[torch.Tensor],
    h: torch.Tensor,
    pattern: NM | Unstructured,
    alives: list[torch.Tensor],
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The sweep alone, its weights in the Hessian's dtype (float32), not rounded to the
    weights' own dtype as the call returns them."""
    return sparsegpt_prune_shared(
        [weight.float() for weight in weights],
        h,
        Amount(0.5, "t"),
        pattern,
        alives,
        SparseGPT(refit=0),
    )


@pytest.mark.parametrize("pattern", [NM(2, 4), Unstructured()])
def test_a_spent_hessian_gives_the_same_bits_and_is_left_damped(
    pattern: NM | Unstructured,
) -> None:
    """`spend_hessian`: the Hessian damped in place and read by the refit, not copied;
    the same masks and weights as a call that leaves it as it was."""
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(64, 24, generator=generator)
    x[:, 3] = 0  # an input that never fired: 1 on its diagonal once damped
    h = x.T @ x
    weights = [torch.randn(r, 24, generator=generator) for r in (30, 9)]
    kept = h.clone()
    expected = sparsegpt_prune_shared(weights, h, Amount(0.5, "t"), pattern)
    assert torch.equal(h, kept)  # not spent: unchanged
    found = sparsegpt_prune_shared(weights, h, Amount(0.5, "t"), pattern, spend_hessian=True)
    for (k, u), (k0, u0) in zip(found, expected, strict=True):
        assert torch.equal(k, k0)
        assert torch.equal(u, u0)
    assert torch.equal(h, damped(kept, 0.1))
