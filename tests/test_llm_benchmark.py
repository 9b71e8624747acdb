"""benchmarks/llm_structure.py's helpers on a tiny LLaMA: the uniform shares with a chosen
head share, and the distillation loop bringing a pruned student's logits toward the dense
teacher's."""

from __future__ import annotations

import argparse
import copy
import importlib.util
from pathlib import Path

import pytest
import torch

import prunekit

transformers = pytest.importorskip("transformers")
_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "llm_structure.py"
_SPEC = importlib.util.spec_from_file_location("llm_structure", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=0.5,  # logits far from uniform: a gap worth closing
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize(("heads", "whole"), [(1 / 3, 1), (2 / 3, 2)])
def test_shares_remove_whole_heads_per_group_and_the_mlp_makes_up_the_target(
    heads: float, whole: int
) -> None:
    model = tiny()
    mlp, share_of_heads, share = bench.shares(model, 0.3, heads)
    assert share_of_heads == pytest.approx(whole / 3)
    c = model.config
    per_head, per_channel = 2 * c.hidden_size * (c.hidden_size // 6), 3 * c.hidden_size
    removed = c.num_hidden_layers * (2 * whole * per_head + round(mlp * 64) * per_channel)
    assert share == pytest.approx(removed / bench.non_embedding(model))
    assert abs(share - 0.3) <= c.num_hidden_layers * per_channel / bench.non_embedding(model)


def test_distillation_brings_the_student_toward_the_teacher() -> None:
    teacher = tiny()
    student = copy.deepcopy(teacher)
    example = {"input_ids": torch.randint(0, 64, (1, 8))}
    prunekit.prune_channels(student, example, 0.5, heads=0.5)
    prunekit.compact(student, example, latency_runs=0)
    ids = torch.randint(0, 64, (400,), generator=torch.Generator().manual_seed(2))
    probe = ids[None, :32]

    def gap() -> float:
        with torch.no_grad():
            return float(prunekit.distillation_loss(student(probe).logits, teacher(probe).logits))

    before = gap()
    args = argparse.Namespace(
        distill=600.0, distill_steps=60, temperature=1.0, lr=3e-3, batch=2, length=32
    )
    steps, _ = bench.distill(student, teacher, ids, args)
    assert steps == 60
    assert not student.training
    assert gap() < 0.8 * before
