"""module.<name> made during the selection (first L1 prunings): the tensor torch's
mask * orig gives, bit for bit, and the same gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit as prune
from prunekit import select
from prunekit.dropin import install as installing

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits (so -0.0 differs from 0.0)."""
    return t.detach().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def layers(dtype: torch.dtype, count: int = 2) -> list[nn.Linear]:
    """Layers large enough for the one pass (over 2**18 weights in all)."""
    torch.manual_seed(0)
    return [nn.Linear(400, 400).to(dtype) for _ in range(count)]


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per install: whether module.<name> came made from the selection."""
    seen: list[bool] = []
    real = installing.made

    def spy(product: torch.Tensor, orig: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        seen.append(True)
        return real(product, orig, mask)

    monkeypatch.setattr(installing, "made", spy)
    return seen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("jointly", [False, True])
def test_bit_for_bit_torchs_product(dtype: torch.dtype, jointly: bool, made: list[bool]) -> None:
    ours = layers(dtype)
    theirs = copy.deepcopy(ours)
    for lib, model in ((prune, ours), (torch_prune, theirs)):
        if jointly:
            params = [(m, "weight") for m in model]
            lib.global_unstructured(params, pruning_method=lib.L1Unstructured, amount=0.3)
        else:
            for m in model:
                lib.l1_unstructured(m, "weight", amount=0.3)
    if select._native is not None:
        assert len(made) == 2  # made in the pass, not by apply_mask
    for a, b in zip(ours, theirs, strict=True):
        # -0.0 where a negative weight is pruned, as 0 * orig gives.
        assert torch.equal(bits(a.weight), bits(a.weight_mask * a.weight_orig))
        if dtype.itemsize > 2:  # 16-bit weights tie, which torch breaks arbitrarily
            assert torch.equal(a.weight_mask, b.weight_mask)
            assert torch.equal(bits(a.weight), bits(b.weight))


def test_gradients_are_muls(made: list[bool]) -> None:
    (ours,) = layers(torch.float64, 1)
    theirs = copy.deepcopy(ours)
    prune.l1_unstructured(ours, "weight", amount=0.4)
    torch_prune.l1_unstructured(theirs, "weight", amount=0.4)
    assert made or select._native is None
    assert ours.weight.grad_fn is not None and ours.weight.requires_grad
    for m in (ours, theirs):
        (m.weight**2).sum().backward()
    assert torch.equal(ours.weight_orig.grad, theirs.weight_orig.grad)
    assert torch.equal(ours.weight_orig.grad == 0, ours.weight_mask == 0)
    # Second order too: d/d orig of the gradient's norm.
    (ours2,) = layers(torch.float64, 1)
    prune.l1_unstructured(ours2, "weight", amount=0.4)
    (grad,) = torch.autograd.grad((ours2.weight**3).sum(), ours2.weight_orig, create_graph=True)
    (second,) = torch.autograd.grad(grad.sum(), ours2.weight_orig)
    want = 6 * ours2.weight_orig.detach() * ours2.weight_mask
    assert torch.allclose(second, want)


def test_without_gradients_a_plain_tensor(made: list[bool]) -> None:
    (layer,) = layers(torch.float32, 1)
    with torch.no_grad():
        prune.l1_unstructured(layer, "weight", amount=0.5)
    assert made or select._native is None
    assert layer.weight.grad_fn is None
    assert torch.equal(bits(layer.weight), bits(layer.weight_mask * layer.weight_orig))
    layer(torch.randn(3, 400)).sum().backward()  # the forward makes mask * orig again
    assert layer.weight.grad_fn is not None


def test_importance_scores_and_second_prunings_use_apply_mask(made: list[bool]) -> None:
    (layer,) = layers(torch.float32, 1)
    prune.l1_unstructured(layer, "weight", 0.2, importance_scores=torch.rand(400, 400))
    prune.l1_unstructured(layer, "weight", 0.2)
    assert made == []
    assert torch.equal(layer.weight, layer.weight_mask * layer.weight_orig)
