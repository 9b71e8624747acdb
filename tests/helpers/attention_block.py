"""Attention then a feed-forward layer, pruned as torch's tutorial loop over modules() does,
and the check that it trains as its unpruned twin would: shared by the tests of out_proj's
refresh (tests/core/test_attention.py), prune_model and torch's transforms."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

import prunekit as prune


class Block(nn.Module):
    """Attention then a feed-forward layer: the shape of a transformer block."""

    def __init__(self, nn_: Any = nn) -> None:
        super().__init__()
        self.attn = nn_.MultiheadAttention(8, 2)
        self.ff = nn_.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        return self.ff(self.attn(x, x, x)[0])


def prune_like_the_tutorial(model: nn.Module, lib: Any = prune) -> None:
    """torch's tutorial: every Linear's weight, found by a loop over modules()."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            lib.l1_unstructured(module, "weight", amount=0.3)
    for module in model.modules():
        if isinstance(module, nn.MultiheadAttention):
            lib.l1_unstructured(module, "in_proj_weight", amount=0.3)


def unpruned_twin(model: nn.Module) -> nn.Module:
    """A copy with every pruning made permanent: the model as its masks say it is now."""
    twin = copy.deepcopy(model)
    for module in twin.modules():
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                prune.remove(module, hook._tensor_name)
    assert not prune.is_pruned(twin)
    return twin


def train_and_compare(model: nn.Module, steps: int = 3) -> None:
    """Each step's output and loss are those of the unpruned twin; the steps all run."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(5, 2, 8)
    for _ in range(steps):
        expected = unpruned_twin(model)(x)
        opt.zero_grad()
        out = model(x)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
        out.square().mean().backward()
        opt.step()
    out_proj = model.attn.out_proj
    assert out_proj.weight_orig.grad is not None
    assert not out_proj.weight_orig.grad[out_proj.weight_mask == 0].any()
    with torch.no_grad():  # and after the last step, without gradients
        torch.testing.assert_close(model(x), unpruned_twin(model)(x), rtol=0, atol=1e-6)
