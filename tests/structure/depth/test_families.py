"""A handful of causal-LM families with a block removed: the config follows the kept
layers, and save_pretrained / from_pretrained gives back the model (what
benchmarks/families_depth.py does for every family)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

import prunekit

T = pytest.importorskip("transformers")

IDS = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
COMMON = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48}  # fmt: skip

FAMILIES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("LlamaConfig", "LlamaForCausalLM", {}, {}),
    (
        "Qwen2Config", "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2},
        {"max_window_layers": 1,
         "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]},
    ),
    (
        "Gemma3TextConfig", "Gemma3ForCausalLM",
        {"head_dim": 8, "sliding_window": 4, "sliding_window_pattern": 2},
        {"layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
    ),
    (
        "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
        {"moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
         "decoder_sparse_step": 2, "mlp_only_layers": [3]},
        {"decoder_sparse_step": 1, "mlp_only_layers": [0, 1, 2]},
    ),
    (
        "SmolLM3Config", "SmolLM3ForCausalLM",
        {"no_rope_layer_interval": 2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
        {"no_rope_layers": [1, 1, 0], "layer_types": ["full_attention"] * 3},
    ),
    (
        "RecurrentGemmaConfig", "RecurrentGemmaForCausalLM",
        {"attention_window_size": 4, "lru_width": 32, "head_dim": 8},
        {"block_types": ["recurrent", "attention", "recurrent"]},
    ),
]  # fmt: skip


def logits(model: Any) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(IDS).logits
    return out


@pytest.mark.parametrize(("config", "cls", "fields", "rewritten"), FAMILIES,
                         ids=[f[1].removesuffix("ForCausalLM") for f in FAMILIES])  # fmt: skip
def test_a_block_removed_reloads_with_save_pretrained(
    tmp_path: Any, config: str, cls: str, fields: dict[str, Any], rewritten: dict[str, Any]
) -> None:
    torch.manual_seed(0)
    settings = {k: v for k, v in COMMON.items() if k != "num_key_value_heads" or
                config != "RecurrentGemmaConfig"}  # fmt: skip
    model = getattr(T, cls)(getattr(T, config)(**settings, **fields)).eval()
    prunekit.skip_blocks(model, [1])
    skipped = logits(model)
    report = prunekit.remove_blocks(model, example_inputs={"input_ids": IDS})
    assert report.config == {**rewritten, "num_hidden_layers": 3}
    assert report.max_abs_diff is not None and report.max_abs_diff <= 1e-5
    model.save_pretrained(tmp_path)
    loaded = getattr(T, cls).from_pretrained(tmp_path).eval()
    assert loaded.config.num_hidden_layers == 3
    assert torch.allclose(logits(loaded), skipped, rtol=0, atol=1e-5 * float(skipped.abs().max()))


ONE_KIND_LEFT: list[tuple[str, str, dict[str, Any], list[int], dict[str, Any]]] = [
    (
        "Gemma3TextConfig", "Gemma3ForCausalLM",
        {"head_dim": 8, "sliding_window": 4, "sliding_window_pattern": 2},
        [0, 1, 2], {"layer_types": ["full_attention"]},
    ),
    (
        "Gemma3TextConfig", "Gemma3ForCausalLM",
        {"head_dim": 8, "sliding_window": 4, "sliding_window_pattern": 2},
        [1, 2, 3], {"layer_types": ["sliding_attention"]},
    ),
    (
        "Qwen2Config", "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
        [1, 2, 3], {"max_window_layers": 1, "layer_types": ["full_attention"]},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("config", "cls", "fields", "skip", "rewritten"), ONE_KIND_LEFT,
                         ids=["Gemma3-full", "Gemma3-sliding", "Qwen2-full"])  # fmt: skip
def test_blocks_of_one_attention_kind_left_reload_and_compute_the_same(
    tmp_path: Any, config: str, cls: str, fields: dict[str, Any], skip: list[int],
    rewritten: dict[str, Any],
) -> None:  # fmt: skip
    """A single Gemma 3 block, or a Qwen2's full-attention layer alone: a model built from
    the updated config lacks what no kept layer uses (the other kind's rotary tables, a
    sliding-window mask), which from_pretrained reads all the same and which computes what
    the kept blocks compute: accepted."""
    torch.manual_seed(0)
    model = getattr(T, cls)(getattr(T, config)(**COMMON, **fields)).eval()
    prunekit.skip_blocks(model, skip)
    skipped = logits(model)
    report = prunekit.remove_blocks(model, example_inputs={"input_ids": IDS})
    assert report.config == {**rewritten, "num_hidden_layers": 1}
    assert report.max_abs_diff is not None and report.max_abs_diff <= 1e-5
    model.save_pretrained(tmp_path)
    loaded = getattr(T, cls).from_pretrained(tmp_path).eval()
    assert loaded.config.num_hidden_layers == 1
    assert torch.allclose(logits(loaded), skipped, rtol=0, atol=1e-5 * float(skipped.abs().max()))


def test_a_rebuilt_model_that_computes_otherwise_is_still_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The model built from the updated config is run: where it does not compute what the
    kept blocks compute, the removal is refused and the model and config left as they were."""
    from prunekit.structure.depth import removal_checks

    torch.manual_seed(0)
    fields = {"head_dim": 8, "sliding_window": 4, "sliding_window_pattern": 2}
    model = T.Gemma3ForCausalLM(T.Gemma3TextConfig(**COMMON, **fields)).eval()
    prunekit.skip_blocks(model, [0, 1, 2])
    before = logits(model)
    original = removal_checks.reloaded

    def otherwise(*args: Any) -> Any:
        fresh = original(*args)
        with torch.no_grad():
            fresh.model.norm.weight.add_(1.0)
        return fresh

    monkeypatch.setattr(removal_checks, "reloaded", otherwise)
    with pytest.raises(ValueError, match=r"^remove_blocks: a model built from the updated "
                       r"config .*model\.rotary_emb\.sliding_attention_inv_freq would be None.*"
                       r"loaded with this model's weights, it differs from it by"):  # fmt: skip
        prunekit.remove_blocks(model, example_inputs={"input_ids": IDS})
    assert model.config.num_hidden_layers == 4 and len(model.model.layers) == 4
    assert model.config.layer_types[:2] == ["sliding_attention", "full_attention"]
    assert torch.equal(logits(model), before)
