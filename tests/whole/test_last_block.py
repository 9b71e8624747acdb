"""Block by block (sequential=True or 'layers'), no block after the last pruned one is run:
its inputs would serve nothing."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from helpers import tiny_llm


def batches(count: int = 3) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        {"input_ids": torch.randint(0, 300, (1, 12), generator=generator)} for _ in range(count)
    ]


def block_weights(layer: int) -> list[str]:
    return [
        f"model.layers.{layer}.{part}.weight"
        for part in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
        )
    ]  # fmt: skip


def pruned(model: nn.Module, method: str, include: list[str], **options: Any) -> dict[str, Any]:
    prunekit.prune_model(
        model, 0.5, method=method, calibration=batches(), include=include, progress=False,
        keep_masks=False, **options,
    )  # fmt: skip
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("sequential", [True, "layers"])
@pytest.mark.parametrize("method", ["sparsegpt", "wanda"])
def test_no_block_after_the_last_pruned_one_runs(method: str, sequential: bool | str) -> None:
    model = tiny_llm.llama(layers=4)
    runs = [0] * 4
    for i, block in enumerate(model.model.layers):
        block.register_forward_pre_hook(lambda *_, i=i: runs.__setitem__(i, runs[i] + 1))
    after = pruned(model, method, block_weights(1), sequential=sequential)
    assert runs[0] > 0 and runs[1] > 0  # the one before, run for the pruned one's inputs
    assert runs[2:] == [0, 0]
    # block 1 pruned as when a later block is pruned too (and so every block before it runs)
    whole = tiny_llm.llama(layers=4)
    later = block_weights(1) + block_weights(3)
    reference = pruned(whole, method, later, sequential=sequential)
    for name in block_weights(1):
        assert torch.equal(after[name], reference[name]), name
