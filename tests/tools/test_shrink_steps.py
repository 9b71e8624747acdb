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


def test_under_autocast_forwards_after_the_distillation_read_its_weights(tmp_path: Path) -> None:
    # autocast keeps a bfloat16 copy of each parameter until its outermost context ends:
    # without emptying it, forwards after the call in the same context would read the
    # weights as they were before it (and its own steps would forward through stale copies)
    teacher = tiny_llm.llama()
    student = copy.deepcopy(teacher)
    with torch.no_grad():  # a student apart from its teacher: the steps move it
        for layer in student.model.layers:
            layer.mlp.down_proj.weight.mul_(0.5)
    config = ShrinkConfig(tmp_path / "m", tmp_path / "o", params=0.25, distill=1.0, lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    parts = [torch.randint(0, 300, (16,), generator=generator) for _ in range(4)]
    weights = copy.deepcopy(student.state_dict())
    x = parts[0][None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        student(input_ids=x)  # the caller's forward: autocast now holds copies of the weights
        steps, _ = distill(student, teacher, parts, config, lambda *_: None)
        with torch.no_grad():
            inside = student(input_ids=x).logits
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fresh = student(input_ids=x).logits
    assert steps >= 1
    torch.testing.assert_close(inside, fresh, rtol=0, atol=0)
    assert any(not torch.equal(v, weights[k]) for k, v in student.state_dict().items())
    assert torch.is_autocast_cache_enabled()
