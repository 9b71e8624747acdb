"""Small pruned models of four kinds (an MLP with a container, a convolution, an LSTM,
attention), their inputs, a training step, and what to compare of them: shared by the tests of
copies (tests/core/test_serialization.py) and of checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import prunekit as prune
from helpers.model_state import bits


def hooks(model: nn.Module) -> list[tuple[str, str, list[str]]]:
    """Which pruning hooks sit where, with the methods inside containers."""
    out = []
    for path, m in model.named_modules():
        for hook in m._forward_pre_hooks.values():
            inner = [type(x).__name__ for x in getattr(hook, "_pruning_methods", ())]
            out.append((path, type(hook).__name__, inner))
    return out


def state(model: nn.Module) -> list[tuple[str, Any]]:
    return [(k, bits(v)) for k, v in model.state_dict().items()]


def mlp() -> nn.Module:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    prune.l1_unstructured(model[0], "weight", 0.3)
    prune.ln_structured(model[0], "weight", 2, n=2, dim=0)  # a container
    prune.random_unstructured(model[0], "bias", 0.25)
    prune.global_unstructured(
        [(model[0], "weight"), (model[2], "weight")], prune.L1Unstructured, amount=0.2
    )
    return model


def conv() -> nn.Module:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.Flatten(), nn.LazyLinear(3))
    model(torch.randn(1, 2, 5, 5))
    prune.ln_structured(model[0], "weight", 0.5, n=1, dim=0)
    prune.custom_from_mask(model[2], "weight", (torch.rand(3, 36) > 0.5).float())
    return model


def lstm() -> nn.Module:
    torch.manual_seed(3)
    model = nn.LSTM(4, 5, num_layers=2)
    prune.l1_unstructured(model, "weight_hh_l0", 0.5)
    prune.random_unstructured(model, "weight_ih_l1", 0.5)
    return model


def attention() -> nn.Module:
    torch.manual_seed(4)
    model = nn.MultiheadAttention(8, 2)
    prune.l1_unstructured(model, "in_proj_weight", 0.5)
    prune.l1_unstructured(model, "out_proj.weight", 0.5)
    return model


BUILDERS = {"mlp": mlp, "conv": conv, "lstm": lstm, "attention": attention}
INPUTS: dict[str, Callable[[], Any]] = {
    "mlp": lambda: (torch.randn(5, 6),),
    "conv": lambda: (torch.randn(2, 2, 5, 5),),
    "lstm": lambda: (torch.randn(3, 2, 4),),
    "attention": lambda: (torch.randn(3, 2, 8),) * 3,
}


def run(model: nn.Module, kind: str, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    out = model(*INPUTS[kind]())
    result: torch.Tensor = out[0] if isinstance(out, tuple) else out
    return result


def train_step(model: nn.Module, kind: str) -> None:
    """A forward with grad: leaves each pruned tensor a non-leaf (pytorch#37322)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    run(model, kind).square().sum().backward()
    opt.step()
    run(model, kind, seed=1).sum().backward()
