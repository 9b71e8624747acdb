"""Pruned entries stay exactly zero under every torch optimizer, momentum and weight
decay included, while the optimizer goes on moving their ``_orig`` values."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunekit as prune
from helpers.gradual_models import Small, batch

Make = Callable[[list[nn.Parameter]], torch.optim.Optimizer]

OPTIMIZERS: dict[str, Make] = {
    "SGD momentum + weight decay": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, weight_decay=1e-2
    ),
    "SGD nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "Adam": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-2),
    "Adam amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "Adamax": lambda p: torch.optim.Adamax(p, lr=1e-2, weight_decay=1e-2),
    "NAdam": lambda p: torch.optim.NAdam(p, lr=1e-2, weight_decay=1e-2),
    "RAdam": lambda p: torch.optim.RAdam(p, lr=1e-2, weight_decay=1e-2),
    "RMSprop momentum centered": lambda p: torch.optim.RMSprop(
        p, lr=1e-3, momentum=0.9, centered=True, weight_decay=1e-2
    ),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2, weight_decay=1e-2),
    "Adadelta": lambda p: torch.optim.Adadelta(p, weight_decay=1e-2),
    "Adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-2, weight_decay=1e-2),
    "ASGD": lambda p: torch.optim.ASGD(p, lr=1e-2, weight_decay=1e-2),
    "Rprop": lambda p: torch.optim.Rprop(p, lr=1e-2),
    "LBFGS": lambda p: torch.optim.LBFGS(p, lr=0.1, max_iter=3),
}


def step(model: nn.Module, optimizer: torch.optim.Optimizer, i: int) -> None:
    x, y = batch(i)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    optimizer.step(closure)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_pruned_entries_stay_exactly_zero(name: str) -> None:
    model = Small()
    optimizer = OPTIMIZERS[name](list(model.parameters()))
    pruner = prune.GradualPruner(model, 0.8, start_step=3, end_step=9, every=2, scope="global")
    moved = False
    for i in range(1, 16):
        before = {
            n: model.get_parameter(n + "_orig").detach().clone()
            for n in ("fc1.weight",)
            if prune.is_pruned(model)
        }
        step(model, optimizer, i)
        for layer in (model.conv, model.fc1, model.fc2):
            if not prune.is_pruned(layer):
                continue
            off = layer.weight_mask == 0
            assert layer.weight_orig.grad is not None
            assert bool((layer.weight_orig.grad[off] == 0).all())  # no gradient reaches them
            # What the forward uses: mask x orig, exactly 0 where pruned (never NaN).
            layer(torch.randn(2, *_input(layer)))
            assert bool((layer.weight[off] == 0).all())
            assert bool(torch.isfinite(layer.weight_orig).all())
        if before:
            off = model.fc1.weight_mask == 0
            moved |= not torch.equal(model.fc1.weight_orig[off], before["fc1.weight"][off])
        pruner.step()
    final = prune.permanent_state_dict(model)
    for n in ("conv.weight", "fc1.weight", "fc2.weight"):
        mask = model.get_buffer(n + "_mask")
        assert bool((final[n][mask == 0] == 0).all())
    assert prune.report(model).sparsity > 0.7
    if name in ("SGD momentum + weight decay", "Adam", "AdamW", "RMSprop momentum centered"):
        assert moved, "the README says these move the pruned entries' _orig"


def _input(layer: nn.Module) -> tuple[int, ...]:
    if isinstance(layer, nn.Conv2d):
        return (1, 6, 6)
    assert isinstance(layer, nn.Linear)
    return (layer.in_features,)


def test_muon_on_the_linear_weights() -> None:
    """Muon takes 2-D parameters only: the linear weights, beside AdamW for the rest."""
    model = Small()
    pruner = prune.GradualPruner(model, 0.8, start_step=1, end_step=4, include="fc*.weight")
    matrices = [model.fc1.weight, model.fc2.weight]
    rest = [p for p in model.parameters() if all(p is not m for m in matrices)]
    muon = torch.optim.Muon(matrices, lr=0.02, weight_decay=0.1)
    adamw = torch.optim.AdamW(rest, lr=1e-2)
    for i in range(1, 8):
        x, y = batch(i)
        muon.zero_grad()
        adamw.zero_grad()
        F.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        muon.step()
        adamw.step()
        pruner.step()
        model(x)
        for layer in (model.fc1, model.fc2):
            if prune.is_pruned(layer):
                assert bool((layer.weight[layer.weight_mask == 0] == 0).all())
    assert pruner.amount == 0.8


def test_sparse_adam_on_a_sparse_embedding() -> None:
    """SparseAdam needs sparse gradients: they reach ``weight_orig`` through the mask."""
    embedding = nn.Embedding(20, 6, sparse=True)
    pruner = prune.GradualPruner(embedding, 0.7, start_step=1, end_step=4, every=1)
    optimizer = torch.optim.SparseAdam(list(embedding.parameters()), lr=0.05)
    for i in range(1, 7):
        optimizer.zero_grad()
        embedding(torch.arange(i, i + 10) % 20).pow(2).sum().backward()  # type: ignore[no-untyped-call]
        if prune.is_pruned(embedding):
            assert embedding.weight_orig.grad is not None
            assert embedding.weight_orig.grad.layout == torch.sparse_coo
        optimizer.step()
        pruner.step()
        embedding(torch.arange(20))
        assert bool((embedding.weight[embedding.weight_mask == 0] == 0).all())
    assert int((embedding.weight_mask == 0).sum()) == 84
