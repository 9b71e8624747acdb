"""Pruned models under torch's transforms and modes: compile, functional_call, export,
inference_mode, autocast, dtype and device moves. Each works; the checks compare with the
unpruned twin (the same model with every pruning made permanent)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import prunekit as prune
from helpers.attention_block import Block, unpruned_twin

X = torch.randn(3, 8)


def mlp() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    prune.prune_model(model, 0.5)
    return model


def tutorial_block() -> Block:
    """A block pruned by torch's tutorial loop: out_proj on its own (core/test_attention.py)."""
    model = Block()
    for module in model.modules():
        if isinstance(module, nn.Linear):
            prune.l1_unstructured(module, "weight", 0.3)
    return model


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, atol=atol)


def train(model: nn.Module, call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """Three SGD steps through `call`; each output is the unpruned twin's."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        out = call(x)
        assert close(out, unpruned_twin(model)(x))
        out.square().mean().backward()
        opt.step()


# -- torch.compile -------------------------------------------------------------------------


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compile_trains(fullgraph: bool) -> None:
    model = mlp()
    train(model, torch.compile(model, fullgraph=fullgraph), X)


def test_compile_sees_a_later_pruning_and_a_remove() -> None:
    model = mlp()
    compiled = torch.compile(model)
    compiled(X)
    prune.l1_unstructured(model[0], "weight", 0.5)
    assert close(compiled(X), unpruned_twin(model)(X))
    prune.remove(model[0], "weight")
    with torch.no_grad():
        model[0].weight.add_(1.0)  # a plain Parameter again, trained as such
    assert close(compiled(X), unpruned_twin(model)(X))


def test_compile_without_grad_after_a_step() -> None:
    model = mlp()
    compiled = torch.compile(model)
    with torch.no_grad():
        compiled(X)
    model(X).sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    with torch.no_grad():
        assert close(compiled(X), unpruned_twin(model)(X))


def test_compile_with_attention_out_proj_pruned_on_its_own() -> None:
    model = tutorial_block()
    with warnings.catch_warnings():  # torch notes that process-wide module hooks exist
        warnings.filterwarnings("ignore", message=".*global hooks on modules")
        train(model, torch.compile(model), torch.randn(5, 2, 8))


# -- torch.func.functional_call --------------------------------------------------------------


def test_functional_call_uses_the_given_orig_and_mask() -> None:
    model = mlp()
    given = dict(model.state_dict())
    given["0.weight_orig"] = given["0.weight_orig"] * 3
    given["2.weight_mask"] = torch.ones_like(given["2.weight_mask"])
    out = torch.func.functional_call(model, given, (X,))
    twin = unpruned_twin(model)
    with torch.no_grad():
        twin[0].weight.mul_(3)
        twin[2].weight.copy_(model[2].weight_orig)  # mask of ones: all of orig
    assert close(out, twin(X))
    assert close(model(X), unpruned_twin(model)(X))  # the model itself is unchanged


def test_func_grad_masks_the_gradient() -> None:
    model = mlp()
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(model, {**p, **buffers}, (X,)).sum()

    grads = torch.func.grad(loss)(params)
    for i in (0, 2):
        grad, mask = grads[f"{i}.weight_orig"], model[i].weight_mask
        assert grad.any() and not grad[mask == 0].any()


def test_functional_call_reaches_an_out_proj_pruned_on_its_own() -> None:
    model = tutorial_block()
    x = torch.randn(5, 2, 8)
    given = dict(model.state_dict())
    given["attn.out_proj.weight_orig"] = torch.zeros(8, 8)
    out = torch.func.functional_call(model, given, (x,))
    assert close(out, model.ff(model.attn.out_proj.bias.expand(5, 2, 8)))  # attention -> bias


# -- torch.export ------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [mlp, tutorial_block], ids=["mlp", "attention"])
def test_export_computes_mask_times_orig(make: Callable[[], nn.Module]) -> None:
    model = make()
    x = X if isinstance(model, nn.Sequential) else torch.randn(5, 2, 8)
    with warnings.catch_warnings():  # torch notes the hook assigns module.<name>
        warnings.filterwarnings("ignore", message=".*were assigned during export")
        program = torch.export.export(model, (x,))
    assert {k for k in program.state_dict if k.endswith(("_orig", "_mask"))} == {
        k for k in model.state_dict() if k.endswith(("_orig", "_mask"))
    }
    assert close(program.module()(x), unpruned_twin(model)(x), atol=1e-6)


# -- inference_mode, autocast ------------------------------------------------------------------


def test_inference_mode_forward_then_training() -> None:
    model = mlp()
    with torch.inference_mode():
        first, second = model(X), model(X)
    assert torch.equal(first, second) and close(first, unpruned_twin(model)(X))
    train(model, model, X)


def test_pruning_inside_inference_mode_then_training() -> None:
    """The masks made there are plain tensors: autograd can save them later."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.inference_mode():
        prune.prune_model(model, 0.5)
        prune.l1_unstructured(model[0], "weight", 0.5)  # again, through the container
        model(X)
    assert not model[0].weight_mask.is_inference()
    train(model, model, X)


def test_pruning_inside_inference_mode_globally_then_training() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.inference_mode():
        prune.prune_model(model, 0.5, scope="global")
    train(model, model, X)


def test_autocast_forward_and_training() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(X)
            expected = unpruned_twin(model)(X)
        assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
        opt.zero_grad()
        out.float().square().mean().backward()
        grad = model[0].weight_orig.grad
        assert grad.dtype == torch.float32 and not grad[model[0].weight_mask == 0].any()
        opt.step()


# -- dtype and device moves ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtype_moves(dtype: torch.dtype) -> None:
    model = mlp()
    with torch.no_grad():
        model(X)  # a product to reuse, of the old dtype
    model = model.half() if dtype == torch.float16 else model.to(dtype)
    assert model[0].weight_mask.dtype == model[0].weight_orig.dtype == dtype
    x = X.to(dtype)
    with torch.no_grad():
        assert close(model(x), unpruned_twin(model)(x), atol=1e-2)
    # module.<name> itself follows at the next forward, or at once with refresh_pruned
    assert model[0].weight.dtype == dtype
    if dtype != torch.float16:  # no float16 matmul backward on every CPU build
        train(model, model, x)


def test_the_attribute_follows_a_move_at_refresh_pruned() -> None:
    model = mlp().double()
    prune.refresh_pruned(model)
    assert model[0].weight.dtype == torch.float64


def test_device_moves() -> None:
    """No second device here: the meta device stands for one."""
    model = mlp().to("meta")
    assert model[0].weight_orig.device.type == model[0].weight_mask.device.type == "meta"
    out = model(torch.empty(3, 8, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 4)
    assert model[0].weight.device.type == "meta"
