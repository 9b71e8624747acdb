"""Gradient-free forwards reuse mask * orig, and never serve a stale product."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit as prune


def pruned_layer() -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(16, 8)
    prune.l1_unstructured(layer, "weight", amount=0.5)
    return layer


def assert_fresh(layer: nn.Module, x: torch.Tensor) -> None:
    """The forward used mask * orig as they are now."""
    want = x @ (layer.weight_orig * layer.weight_mask).t() + layer.bias
    with torch.no_grad():
        got = layer(x)
    assert torch.equal(layer.weight, layer.weight_orig * layer.weight_mask)
    assert torch.allclose(got, want)


X = torch.randn(4, 16)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_gradient_free_forwards_reuse_the_product(mode: type) -> None:
    layer = pruned_layer()
    with mode():
        layer(X)
        first = layer.weight
        layer(X)
        assert layer.weight is first
    with torch.no_grad():
        layer(X)
        assert layer.weight is first
    assert_fresh(layer, X)


def test_forward_with_grad_recomputes_and_trains_like_torch() -> None:
    ours = pruned_layer()
    theirs = nn.Linear(16, 8)
    with torch.no_grad():
        theirs.weight.copy_(ours.weight_orig)
        theirs.bias.copy_(ours.bias)
    torch_prune.custom_from_mask(theirs, "weight", ours.weight_mask)
    with torch.no_grad():
        ours(X)
    cached = ours.weight
    ours(X).square().sum().backward()
    theirs(X).square().sum().backward()
    assert ours.weight is not cached
    assert ours.weight.requires_grad
    assert ours.weight_orig.grad is not None and theirs.weight_orig.grad is not None
    assert torch.allclose(ours.weight_orig.grad, theirs.weight_orig.grad)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, foreach=False),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
        lambda p: torch.optim.Adam(p, lr=0.1),
    ],
)
def test_fresh_after_optimizer_step(make) -> None:  # type: ignore[no-untyped-def]
    layer = pruned_layer()
    optimizer = make(layer.parameters())
    for _ in range(2):
        with torch.no_grad():
            layer(X)
        optimizer.zero_grad()
        layer(X).sum().backward()
        optimizer.step()
        assert_fresh(layer, X)


def test_fresh_after_load_state_dict() -> None:
    layer = pruned_layer()
    with torch.no_grad():
        layer(X)
    state = copy.deepcopy(layer.state_dict())
    state["weight_orig"] += 1.0
    state["weight_mask"] = 1.0 - state["weight_mask"]
    layer.load_state_dict(state)
    assert_fresh(layer, X)
    layer.load_state_dict(state, assign=True)
    assert_fresh(layer, X)


def test_fresh_after_a_new_pruning_and_after_remove() -> None:
    layer = pruned_layer()
    with torch.no_grad():
        layer(X)
    prune.l1_unstructured(layer, "weight", amount=0.5)
    assert_fresh(layer, X)
    with torch.no_grad():
        layer(X)
    prune.random_unstructured(layer, "weight", amount=0.5)
    assert_fresh(layer, X)
    with torch.no_grad():
        layer(X)
    values = layer.weight_orig * layer.weight_mask
    prune.remove(layer, "weight")
    assert isinstance(layer.weight, nn.Parameter)
    assert torch.equal(layer.weight, values)
    with torch.no_grad():
        assert torch.allclose(layer(X), X @ values.t() + layer.bias)


def test_fresh_after_in_place_writes_to_any_of_the_three_tensors() -> None:
    layer = pruned_layer()
    with torch.no_grad():
        layer(X)
        layer.weight_orig.mul_(2.0)
    assert_fresh(layer, X)
    with torch.no_grad():
        layer.weight_mask.fill_(1.0)
    assert_fresh(layer, X)
    with torch.no_grad():
        layer.weight.zero_()  # the product itself, edited by hand: recomputed next forward
    assert_fresh(layer, X)


def test_fresh_after_dtype_move_and_parameter_swap() -> None:
    layer = pruned_layer()
    with torch.no_grad():
        layer(X)
    layer.double()
    assert_fresh(layer, X.double())
    layer.weight_orig = nn.Parameter(torch.ones_like(layer.weight_orig))
    assert_fresh(layer, X.double())


def test_frozen_weights_reuse_even_with_grad_enabled() -> None:
    layer = pruned_layer()
    layer.weight_orig.requires_grad_(False)
    layer(X)
    first = layer.weight
    layer(X).sum().backward()
    assert layer.weight is first
    layer.weight_orig.requires_grad_(True)
    layer(X).sum().backward()
    assert layer.weight is not first and layer.weight_orig.grad is not None


def test_writes_through_data_need_refresh_or_reuse_off() -> None:
    layer = pruned_layer()
    with torch.no_grad():
        layer(X)
    layer.weight_orig.data.add_(1.0)  # invisible to version counters: the documented blind spot
    with torch.no_grad():
        layer(X)
    assert not torch.equal(layer.weight, layer.weight_orig * layer.weight_mask)
    prune.refresh_pruned(layer)
    assert_fresh(layer, X)

    prune.forward_reuse(layer, False)
    with torch.no_grad():
        layer(X)
        first = layer.weight
        layer.weight_orig.data.add_(1.0)
        layer(X)
    assert layer.weight is not first
    assert torch.equal(layer.weight, layer.weight_orig * layer.weight_mask)
    prune.forward_reuse(layer, True)
    with torch.no_grad():
        layer(X)
        second = layer.weight
        layer(X)
    assert layer.weight is second


def test_copies_and_pickles_do_not_share_the_reused_product() -> None:
    layer = nn.Sequential(pruned_layer())
    with torch.no_grad():
        layer(X)
    twin = copy.deepcopy(layer)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (twin, loaded):
        with torch.no_grad():
            other[0].weight_orig.mul_(3.0)
        assert_fresh(other[0], X)
    assert_fresh(layer[0], X)
