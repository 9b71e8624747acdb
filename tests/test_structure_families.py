"""Attention adapters of more decoder families (small configs, random init): heads, MLP and
hidden widths pruned, compacted equal to the masked model, generate() unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

import prunekit

T = pytest.importorskip("transformers")

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))
INPUTS = {"input_ids": IDS}
SMALL: dict[str, Any] = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=8, num_key_value_heads=2, head_dim=4,
                             intermediate_size=40, max_position_embeddings=32, pad_token_id=0,
                             bos_token_id=1, eos_token_id=2)  # fmt: skip
FAMILIES: dict[str, dict[str, Any]] = {
    "Qwen3": {},  # q_norm/k_norm over each head's head_dim
    "Olmo2": {},  # q_norm/k_norm over the whole projected width
    "Phi3": {},  # one qkv_proj, one gate_up_proj
    "Gemma2": {"hidden": 0.0},  # its embeddings are scaled by sqrt(config.hidden_size)
    "Cohere": {"use_qk_norm": True},  # a norm weight per head
    "Granite": {},
}


def _out(model: Any) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(**INPUTS).logits
    return out


def _generate(model: Any) -> Tensor:
    out: Tensor = model.generate(IDS, max_new_tokens=5, do_sample=False, pad_token_id=0)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_mlp_and_hidden_of_more_families(family: str) -> None:
    extra = dict(FAMILIES[family])
    hidden = extra.pop("hidden", 0.25)
    torch.manual_seed(0)
    config = getattr(T, f"{family}Config")(**{**SMALL, **extra})
    model = getattr(T, f"{family}ForCausalLM")(config).eval()
    groups = prunekit.channel_groups(model, INPUTS)
    heads = [g for g in groups if g.kind == "heads"]
    assert len(heads) == 2 and all(g.prunable and g.size == 8 for g in heads)
    prunekit.prune_channels(model, INPUTS, 0.3, heads=0.25, hidden=hidden)
    masked, masked_ids = _out(model), _generate(model)
    report = prunekit.compact(model, INPUTS, latency_runs=0)
    assert report.relative_error <= 1e-4
    out = _out(model)
    assert float((out - masked).abs().max()) <= 1e-4 * float(masked.abs().max())
    assert torch.equal(_generate(model), masked_ids)
    assert report.config["num_attention_heads"] == 6
    assert report.config["intermediate_size"] == 28
    attention = model.model.layers[0].self_attn
    if family == "Olmo2":  # the norm over the query width lost the removed heads' rows
        assert attention.q_norm.weight.shape == (6 * 4,)
    if family == "Cohere":
        assert attention.q_norm.weight.shape == (6, 4)
