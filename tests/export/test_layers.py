"""prunekit.export.layer_widths: each decoder layer's widths, read off a compacted Llama."""

from __future__ import annotations

import pytest
import torch

import prunekit
from prunekit.export.layer_widths import DecoderLayer, decoder_layers, uniform

transformers = pytest.importorskip("transformers")

IDS = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))


def llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, vocab_size=100, head_dim=8,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_dense_layers_are_the_config() -> None:
    layers = decoder_layers(llama())
    assert layers == [DecoderLayer(heads=4, kv_heads=2, head_dim=8, ffn=48)] * 3
    assert uniform(layers)


def test_a_budget_gives_each_layer_its_own_widths() -> None:
    model = llama()
    prunekit.prune_channels(model, IDS, budget=prunekit.Budget(params=0.3))
    prunekit.compact(model, IDS, latency_runs=0)
    layers = decoder_layers(model)
    for layer, found in zip(model.model.layers, layers, strict=True):
        assert found.ffn == layer.mlp.up_proj.out_features == layer.mlp.down_proj.in_features
        assert found.heads * found.head_dim == layer.self_attn.o_proj.in_features
        assert found.kv_heads * found.head_dim == layer.self_attn.v_proj.out_features
    assert not uniform(layers)


def test_a_model_of_another_family_is_refused() -> None:
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=100)
    with pytest.raises(TypeError, match=r"model_type 'gpt2'.*Llama family"):
        decoder_layers(transformers.GPT2LMHeadModel(config))
