"""recover under torch.autocast: its steps see the weights they change."""

from __future__ import annotations

import copy
from typing import Any

import torch
from tests.helpers.gguf_models import tiny_llama
from torch import nn

import prunekit as prune


def _compacted_pair() -> tuple[nn.Module, nn.Module, list[dict[str, torch.Tensor]]]:
    """A tiny Llama and a copy pruned by half and compacted (plain parameters), batches."""
    teacher = tiny_llama(64, seed=3)
    generator = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 64, (2, 16), generator=generator)}
               for _ in range(4)]  # fmt: skip
    student = copy.deepcopy(teacher)
    prune.prune_channels(student, batches[0], 0.5, heads=0.5, criterion="l2")
    prune.compact(student, batches[0])
    return student, teacher, batches


def _kl(student: nn.Module, teacher: nn.Module, batches: list[Any]) -> float:
    distiller = prune.Distiller(teacher, temperature=1.0)
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        return sum(float(distiller.loss(student(**b), b)) for b in batches) / len(batches)


def test_under_autocast_the_steps_close_the_gap_as_in_float32() -> None:
    # autocast keeps a bfloat16 copy of each parameter it casts until its outermost
    # context ends: steps taken inside it that forward through stale copies train blind
    student, teacher, batches = _compacted_pair()
    plain = copy.deepcopy(student)
    before = _kl(student, teacher, batches)
    prune.recover(plain, prune.Distiller(teacher, temperature=1.0), batches, steps=20, lr=3e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        done = prune.recover(student, prune.Distiller(teacher, temperature=1.0), batches,
                             steps=20, lr=3e-3)  # fmt: skip
    after = _kl(student, teacher, batches)
    assert after < 0.5 * before
    assert after < 2 * _kl(plain, teacher, batches)
    assert done.losses[-1] < 0.5 * done.losses[0]  # the losses seen are the weights' own
    assert torch.is_autocast_cache_enabled()  # the caller's setting is back
