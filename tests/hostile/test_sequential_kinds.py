"""Sequential calibration (prune_model's default for Wanda and SparseGPT, and what
prune_streamed does block by block) on models whose blocks are called with different
arguments by kind: a sliding-window layer gets another attention mask than a full one, and
Gemma 3's global layers another rotary embedding than its local ones."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import prunekit

T = pytest.importorskip("transformers")

VOCAB = 50
SMALL = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, intermediate_size=24, max_position_embeddings=64)  # fmt: skip


def _llama() -> Any:
    return T.LlamaForCausalLM(T.LlamaConfig(**SMALL))


def _qwen2() -> Any:  # layer 0 attends over everything, layer 1 over a window of 4
    config = T.Qwen2Config(**SMALL, sliding_window=4, use_sliding_window=True, max_window_layers=1)
    return T.Qwen2ForCausalLM(config)


def _gemma3() -> Any:  # layer 0 local (window 4, local rope), layer 1 global
    config = T.Gemma3TextConfig(**SMALL, head_dim=8, sliding_window=4,
                                layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    return T.Gemma3ForCausalLM(config)


def _block_by_block(model: Any, calibration: list[torch.Tensor]) -> None:
    """What sequential pruning promises, by hand: each block pruned on the inputs the
    model's own forward gives it, the blocks before it pruned already."""
    for i in range(len(model.model.layers)):
        prunekit.prune_model(model, 0.5, method="wanda", calibration=calibration,
                             sequential=False, include=[f"model.layers.{i}.*"])  # fmt: skip


def _differing_masks(builder: Callable[[], Any]) -> list[str]:
    torch.manual_seed(1)
    model = builder().eval()
    want = copy.deepcopy(model)
    calibration = [torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(k))
                   for k in range(2)]  # fmt: skip  # 16 tokens: longer than the window
    prunekit.prune_model(model, 0.5, method="wanda", calibration=calibration, sequential=True)
    _block_by_block(want, calibration)
    theirs = dict(want.named_buffers())
    return [k for k, b in model.named_buffers()
            if k.endswith("_mask") and not torch.equal(b, theirs[k])]  # fmt: skip


def test_sequential_equals_block_by_block_where_every_block_is_called_alike() -> None:
    assert _differing_masks(_llama) == []


@pytest.mark.xfail(
    strict=True,
    reason="calibrate.next_inputs gives every block the arguments block 0 was called with "
    "(its attention mask, and Gemma 3's rotary embedding), not the block's own: a "
    "full-attention block after a sliding one is calibrated with the sliding mask",
)
@pytest.mark.parametrize("builder", [_qwen2, _gemma3], ids=["qwen2-sliding", "gemma3"])
def test_sequential_equals_block_by_block_where_blocks_are_called_by_kind(
    builder: Callable[[], Any],
) -> None:
    assert _differing_masks(builder) == []
