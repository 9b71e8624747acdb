"""The PyTorch Lightning callback, in tiny runs: the schedule follows global_step, and a
run resumed from a checkpoint ends with the same masks and weights."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import prunekit as prune

pl = pytest.importorskip("pytorch_lightning")
from prunekit.schedule.lightning import GradualPruningCallback  # noqa: E402

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)


class Tiny(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc2(F.relu(self.fc1(x)))
        return out

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def loader() -> Any:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    data = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(data, batch_size=8)


def make() -> tuple[Any, prune.GradualPruner]:
    torch.manual_seed(0)
    model = Tiny()
    return model, prune.GradualPruner(model, 0.8, start_step=2, end_step=10, every=2)


def trainer(root: Path, pruner: prune.GradualPruner, steps: int, *extra: Any, **kw: Any) -> Any:
    return pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=[GradualPruningCallback(pruner), *extra],
        **kw,
    )


def test_lightning_steps_the_pruner_and_a_resumed_run_ends_the_same(tmp_path: Path) -> None:
    model, pruner = make()
    every8 = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path,
        every_n_train_steps=8,
        save_top_k=-1,
        filename="at{step}",
        auto_insert_metric_name=False,
    )
    trainer(tmp_path, pruner, 12, every8).fit(model, loader())  # 8 batches an epoch
    assert pruner.steps == 12 and pruner.amount == 0.8
    assert prune.report(model)["fc1.weight"].method == "Gradual(L1, 0.8)"
    assert prune.report(model)["fc1.weight"].zeros == round(0.8 * 256)
    saved = torch.load(tmp_path / "at8.ckpt", weights_only=False)
    assert "fc1.weight_mask" in saved["state_dict"]

    again, again_pruner = make()  # a fresh process: new model, new pruner
    again_every8 = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "b", every_n_train_steps=8, save_top_k=-1
    )
    resumed = trainer(tmp_path / "b", again_pruner, 12, again_every8)
    resumed.fit(again, loader(), ckpt_path=tmp_path / "at8.ckpt")
    assert again_pruner.steps == 12
    for key, value in model.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key


def test_gradient_accumulation_counts_optimizer_steps(tmp_path: Path) -> None:
    model, pruner = make()
    trainer(tmp_path, pruner, 6, accumulate_grad_batches=2, enable_checkpointing=False).fit(
        model, loader()
    )
    assert pruner.steps == 6
    with pytest.raises(TypeError, match=r"expected a prunekit\.GradualPruner"):
        GradualPruningCallback(model)  # type: ignore[arg-type]
