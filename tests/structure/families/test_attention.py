"""Attention adapters of more decoder families (small configs, random init): heads, MLP and
hidden widths pruned, compacted equal to the masked model, generate() unchanged."""

from __future__ import annotations

import tempfile
import warnings
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
    "Gemma": {},  # embeddings scaled by sqrt(hidden_size), norms scale by (1 + weight)
    "Gemma2": {},
    "Gemma3Text": {},
    "Cohere": {"use_qk_norm": True},  # a norm weight per head
    "Granite": {},
}


def _make(family: str, **extra: Any) -> Any:
    torch.manual_seed(0)
    config = getattr(T, f"{family}Config")(**{**SMALL, **extra})
    return getattr(T, f"{family.removesuffix('Text')}ForCausalLM")(config).eval()


def _out(model: Any) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(**INPUTS).logits
    return out


def _generate(model: Any) -> Tensor:
    out: Tensor = model.generate(IDS, max_new_tokens=5, do_sample=False, pad_token_id=0)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_mlp_and_hidden_of_more_families(family: str) -> None:
    model = _make(family, **FAMILIES[family])
    groups = prunekit.channel_groups(model, INPUTS)
    heads = [g for g in groups if g.kind == "heads"]
    assert len(heads) == 2 and all(g.prunable and g.size == 8 for g in heads)
    prunekit.prune_channels(model, INPUTS, 0.3, heads=0.25, hidden=0.25)
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


@pytest.mark.parametrize("tied", [False, True])
def test_gemma_with_the_hidden_width_pruned_reloads_or_says_why(tied: bool) -> None:
    model = _make("Gemma", tie_word_embeddings=tied)
    prunekit.prune_channels(model, INPUTS, heads=0.25, hidden=0.25)
    masked = _out(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = prunekit.compact(model, INPUTS, latency_runs=0)
    assert report.config["hidden_size"] == 24
    assert [str(w.message) for w in caught if "save_pretrained" in str(w.message)] == (
        [f"compact: GemmaForCausalLM: {str(report).splitlines()[-1]}"] if tied else []
    )
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        again = T.AutoModelForCausalLM.from_pretrained(folder).eval()
    error = float((_out(again) - masked).abs().max()) / float(masked.abs().max())
    if tied:  # the embedding's sqrt(32) cannot move into a weight the logits also read
        assert error > 1e-3
        assert report.stale == ("a model built from the config differs (model.embed_tokens."
                                "scalar_embed_scale would be 4.89898, not 5.65685)",)  # fmt: skip
        assert report.not_rebuilt == ("model.embed_tokens.scalar_embed_scale would be "
                                      "4.89898, not 5.65685",)  # fmt: skip
        assert "save with save_compacted" in str(report)
        assert str(report).endswith("reload it with prunekit.load_compacted(folder)")
    else:  # the scale moved into the embedding weight: a rebuilt model takes sqrt(24)
        assert error <= 1e-5 and not report.stale and not report.not_rebuilt
        assert model.model.embed_tokens.scalar_embed_scale == 24**0.5


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("family", ["Gemma", "Gemma3Text"])
def test_gemma_with_the_hidden_width_pruned_reloads_its_embedding_scale(
    family: str, tied: bool
) -> None:
    """The embedding keeps the scale it computed with (sqrt(32) where the weight is tied, so
    nothing can fold it; sqrt(24) with the ratio folded into the weight where not), which a
    module rebuilt from either config lacks: save_compacted carries it to both loads."""
    model = _make(family, tie_word_embeddings=tied)
    prunekit.prune_channels(model, INPUTS, hidden=0.25)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prunekit.compact(model, INPUTS, latency_runs=0)
    advice = [str(w.message) for w in caught if "prunekit.load_compacted(folder)" in str(w.message)]
    assert len(advice) == (1 if tied else 0)  # from_pretrained would build sqrt(24)
    compacted = _out(model)
    kept = model.model.embed_tokens.scalar_embed_scale
    assert kept == (32**0.5 if tied else 24**0.5)
    with tempfile.TemporaryDirectory() as folder:
        prunekit.save_compacted(model, folder)
        alone = prunekit.load_compacted(folder)
        into = prunekit.load_compacted(_make(family, tie_word_embeddings=tied), folder)
    for loaded in (alone, into):
        embedding = loaded.model.embed_tokens
        assert embedding.scalar_embed_scale == kept
        assert torch.equal(embedding.embed_scale, torch.tensor(kept))
        assert torch.equal(_out(loaded), compacted)  # a NaN would differ too
        assert torch.equal(_generate(loaded), _generate(model))


def test_bart_style_attention_and_a_config_of_its_own_names_reload() -> None:
    """OPT: q/k/v/out_proj heads; its MLP width is config.ffn_dim, found by rebuilding."""
    torch.manual_seed(0)
    config = T.OPTConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=8, ffn_dim=40, max_position_embeddings=32,
                         word_embed_proj_dim=32, pad_token_id=0)  # fmt: skip
    model = T.OPTForCausalLM(config).eval()
    heads = [g for g in prunekit.channel_groups(model, INPUTS) if g.kind == "heads"]
    assert len(heads) == 2 and all(g.prunable and g.size == 8 for g in heads)
    prunekit.prune_channels(model, INPUTS, 0.3, heads=0.25, hidden=0.25)  # head size kept: 4
    masked = _out(model)
    report = prunekit.compact(model, INPUTS, latency_runs=0)
    assert report.config["ffn_dim"] == 28 and report.config["hidden_size"] == 24
    assert not report.stale
    assert model.model.decoder.layers[0].self_attn.num_heads == 6
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        again = T.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert float((_out(again) - masked).abs().max()) <= 1e-5 * float(masked.abs().max())


def test_gpt_oss_sinks_follow_their_heads() -> None:
    torch.manual_seed(0)
    config = T.GptOssConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=8, num_key_value_heads=2, head_dim=4,
                            intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                            max_position_embeddings=32, pad_token_id=0)  # fmt: skip
    model = T.GptOssForCausalLM(config).eval()
    prunekit.prune_channels(model, INPUTS, heads=0.25)
    attention = model.model.layers[0].self_attn
    kept = attention.sinks_mask.bool()
    masked = _out(model)
    report = prunekit.compact(model, INPUTS, latency_runs=0)
    assert report.relative_error <= 1e-4 and int(kept.sum()) == 6
    assert tuple(attention.sinks.shape) == (6,)
    assert float((_out(model) - masked).abs().max()) <= 1e-4 * float(masked.abs().max())
