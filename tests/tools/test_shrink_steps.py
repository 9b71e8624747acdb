"""shrink's stages on their own: the distillation refuses a loss or weights that are not
finite (a learning rate too large) rather than hand NaN weights on to the export."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from helpers import tiny_llm
from prunekit.tools.shrink import ShrinkConfig
from prunekit.tools.shrink_steps import distill

pytest.importorskip("transformers")


def _run(tmp_path: Path, lr: float, seconds: float = 0.3) -> tuple[torch.nn.Module, int]:
    teacher = tiny_llm.llama()
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        student.model.layers[0].mlp.up_proj.weight[:8] = 0
    config = ShrinkConfig(tmp_path / "m", tmp_path / "o", params=0.25, distill=seconds, lr=lr)
    parts = [torch.randint(0, 300, (16,)) for _ in range(2)]
    steps, _ = distill(student, teacher, parts, config, lambda *_: None)
    return student, steps


def test_a_learning_rate_that_overflows_the_weights_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^shrink: the distillation .*(nan|inf).*; expected "
                       r".*smaller --lr"):  # fmt: skip
        # the second step meets the overflow: 0.3 s held one step on a loaded machine (its
        # first took 0.8 s), which left the weights near 4e28 and finite; refused at the
        # second step, the run ends there, long before the 30 s
        _run(tmp_path, 1e30, seconds=30.0)


def test_a_usual_learning_rate_distils(tmp_path: Path) -> None:
    student, steps = _run(tmp_path, 1e-4)
    assert steps >= 1 and not student.training
    assert all(bool(torch.isfinite(p).all()) for p in student.parameters())
