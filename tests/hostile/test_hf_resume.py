"""Hostile checkpoints for GradualPruningCallback's resume: the masks the Trainer loads into
the model from a checkpoint are the pruner's masks, and one that is no mask (0.5, NaN) is
named, not read as 'kept' (it was turned to booleans before it was checked)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import prunekit

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
from prunekit.schedule.hf_callback import GradualPruningCallback  # noqa: E402


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: Tensor, labels: Tensor | None = None) -> dict[str, Tensor]:
        logits = self.fc2(F.relu(self.fc1(x)))
        return {"logits": logits, "loss": F.cross_entropy(logits, labels)}


def trainer(out: Path, model: nn.Module, pruner: Any) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=8, per_device_train_batch_size=8, learning_rate=1e-2,
        save_steps=4, save_strategy="steps", logging_strategy="no", report_to=[],
        disable_tqdm=True, use_cpu=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = [{"x": x[i], "labels": (x[i, 0] > 0).long()} for i in range(64)]
    callback = GradualPruningCallback(pruner)
    return transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])


def make() -> tuple[nn.Module, prunekit.GradualPruner]:
    torch.manual_seed(0)
    model = Tiny()
    return model, prunekit.GradualPruner(model, 0.75, start_step=1, end_step=6, every=1)


@pytest.mark.parametrize("value", [0.5, math.nan, 2.0], ids=["half", "nan", "two"])
def test_a_checkpoint_whose_mask_is_no_mask_is_refused_on_resume(
    tmp_path: Path, value: float
) -> None:
    trainer(tmp_path / "a", *make()).train()
    weights = tmp_path / "a" / "checkpoint-4" / "model.safetensors"
    state = safetensors_torch.load_file(str(weights))
    mask = state["fc1.weight_mask"]
    assert bool(mask[0].eq(0).any()) and bool(mask[0].eq(1).any())  # pruned at step 4
    kept = int(mask[0].nonzero()[0, 0])
    mask[0, kept] = value
    safetensors_torch.save_file(state, str(weights))
    again, pruner = make()
    with pytest.raises(ValueError, match=rf"'fc1\.weight'.*{value}.*only 0 and 1"):
        trainer(tmp_path / "a", again, pruner).train(resume_from_checkpoint=str(weights.parent))
    assert pruner.steps == 0
