"""Distillation in a Lightning training_step, while a GradualPruningCallback prunes."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit as prune

pl = pytest.importorskip("pytorch_lightning")
from prunekit.schedule.lightning import GradualPruningCallback  # noqa: E402

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)


class Student(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, net: nn.Module, distiller: prune.Distiller) -> None:
        super().__init__()
        self.net = net
        self.distiller = distiller  # no nn.Module: the teacher is not registered here

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(x)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        (x,) = batch
        return self.distiller.loss(self(x), x)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_lightning_distils_while_pruning_and_saves_no_teacher(tmp_path: Path) -> None:
    teacher = nn.Sequential(nn.Linear(8, 48), nn.GELU(), nn.Linear(48, 5))
    net = copy.deepcopy(teacher)
    data = torch.randn(128, 8, generator=torch.Generator().manual_seed(0))
    model = Student(net, prune.Distiller(teacher))
    pruner = prune.GradualPruner(net, 0.5, start_step=0, end_step=8, every=4,
                                 method="ln", include=["0.weight"])  # fmt: skip
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=16)
    trainer = pl.Trainer(
        max_steps=24, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(tmp_path),
        callbacks=[GradualPruningCallback(pruner)],
    )  # fmt: skip
    with torch.no_grad():
        dense = teacher(data)
    trainer.fit(model, loader)
    assert pruner.amount == 0.5 and int(net[0].weight_mask.flatten(1).any(1).sum()) == 24
    untrained = copy.deepcopy(teacher)  # the same channels masked, no training
    prune.custom_from_mask(untrained[0], "weight", net[0].weight_mask)
    with torch.no_grad():
        gap = float(prune.distillation_loss(net(data), dense))
        before = float(prune.distillation_loss(untrained(data), dense))
    assert gap < 0.5 * before, (gap, before)
    assert not any(k.startswith("distiller") for k in model.state_dict())
    assert all(p.grad is None for p in teacher.parameters())
    assert torch.equal(teacher(data), dense)  # the teacher did not train
