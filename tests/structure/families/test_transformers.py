"""Heads, MLP and hidden widths of Hugging Face transformers (small configs, random init):
prune, compact, compare with the masked model, count the parameters from the config."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint

T = pytest.importorskip("transformers")

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))
SHARES = {"amount": 0.3, "heads": 0.25, "hidden": 0.25}


def _out(model: nn.Module, inputs: Any) -> Any:
    with torch.no_grad():
        return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def _close(a: Tensor, b: Tensor) -> None:
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max())


def prune_and_compact(model: nn.Module, inputs: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
    """Dense, masked and compacted outputs (and the report); the masks change the output."""
    model.eval()
    dense = _out(model, inputs)
    prunekit.prune_channels(model, inputs, **{**SHARES, **kwargs})
    masked = _out(model, inputs)
    first = next(v for v in masked.values() if isinstance(v, Tensor))
    assert not torch.allclose(first, next(v for v in dense.values() if isinstance(v, Tensor)))
    report = prunekit.compact(model, inputs, latency_runs=0)
    return masked, _out(model, inputs), report


def _generate(model: Any) -> Tensor:
    out: Tensor = model.generate(IDS, max_new_tokens=6, do_sample=False, pad_token_id=0)
    return out


def test_bert_heads_mlp_and_hidden() -> None:
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=40,
                          max_position_embeddings=16)  # fmt: skip
    model = T.BertModel(config)
    groups = prunekit.channel_groups(model, {"input_ids": IDS})
    kinds = sorted(g.kind for g in groups if g.prunable)
    assert kinds == ["channels", "channels", "heads", "heads", "hidden"]
    hidden = next(g for g in groups if g.kind == "hidden")
    assert hidden.outputs and hidden.outputs[0][1] == 2  # last_hidden_state, along dim 2
    inputs = {"input_ids": IDS}
    model.eval()
    prunekit.prune_channels(model, inputs, **SHARES)
    kept = model.encoder.layer[-1].output.LayerNorm.weight_mask.nonzero().flatten()
    masked = _out(model, inputs)
    report = prunekit.compact(model, inputs, latency_runs=0)
    out = _out(model, inputs)
    _close(out.last_hidden_state, masked.last_hidden_state[..., kept])  # 24 of 32 channels
    _close(out.pooler_output, masked.pooler_output)
    attention = model.encoder.layer[0].attention.self
    assert (attention.num_attention_heads, attention.all_head_size) == (3, 24)
    assert model.embeddings.LayerNorm.normalized_shape == (24,)
    assert report.config == {"num_attention_heads": 3, "hidden_size": 24, "intermediate_size": 28}
    d, a, i = 24, 24, 28  # hidden, heads x head size, MLP
    layer = 3 * (d * a + a) + a * d + d + 2 * d + d * i + i + i * d + d + 2 * d
    embeddings = (100 + 16 + 2) * d + 2 * d
    pooler = 32 * d + 32  # its output reaches the model's output: it keeps 32 channels
    assert report.params_after == embeddings + 2 * layer + pooler


def test_bert_masked_lm_head_tied_to_the_embeddings_shares_the_hidden_width() -> None:
    # the head's own width (transform.dense -> LayerNorm -> decoder) reaches the decoder,
    # whose weight is the word embeddings': one hidden group, compacted as one
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=40,
                          max_position_embeddings=16)  # fmt: skip
    model = T.BertForMaskedLM(config)
    inputs = {"input_ids": IDS}
    hidden = [g for g in prunekit.channel_groups(model, inputs) if g.kind == "hidden"]
    assert len(hidden) == 1 and hidden[0].prunable
    assert "cls.predictions.transform.dense" in {s.module_name for s in hidden[0].slices}
    masked, out, report = prune_and_compact(model, inputs)
    _close(out.logits, masked.logits)
    head = model.cls.predictions
    assert head.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert head.transform.dense.out_features == head.decoder.in_features == 24
    assert report.config["hidden_size"] == 24


def test_gpt2_fused_conv1d_attention_and_tied_head() -> None:
    config = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                          bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = T.GPT2LMHeadModel(config)
    inputs = {"input_ids": IDS}
    masked, out, report = prune_and_compact(model, inputs)
    _close(out.logits, masked.logits)
    attention = model.transformer.h[0].attn
    assert (attention.num_heads, attention.split_size, attention.embed_dim) == (3, 24, 24)
    assert model.lm_head.weight is model.transformer.wte.weight  # still one Parameter
    assert report.config == {"num_attention_heads": 3, "hidden_size": 24, "n_inner": 90}
    assert (model.config.n_head, model.config.n_embd) == (3, 24)
    d, a, i = 24, 24, 90  # round(0.3 x 128) = 38 of the 128 MLP channels go
    layer = 2 * d + d * 3 * a + 3 * a + a * d + d + 2 * d + d * i + i + i * d + d
    assert report.params_after == 100 * d + 16 * d + 2 * layer + 2 * d


def test_gpt2_generates_what_the_masked_model_generates() -> None:
    config = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                          bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = T.GPT2LMHeadModel(config).eval()
    prunekit.prune_channels(model, {"input_ids": IDS}, **SHARES)
    masked = _generate(model)
    prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    assert torch.equal(_generate(model), masked)


def _llama(**overrides: Any) -> Any:
    settings: dict[str, Any] = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                                    intermediate_size=40, tie_word_embeddings=True,
                                    max_position_embeddings=32)  # fmt: skip
    return T.LlamaForCausalLM(T.LlamaConfig(**{**settings, **overrides}))


def _llama_params(d: int, heads: int, kv: int, inner: int, hd: int = 8) -> int:
    layer = d * heads * hd + 2 * d * kv * hd + heads * hd * d + 3 * d * inner + 2 * d
    return 100 * d + 2 * layer + d  # tied head: the embedding counts once


def test_llama_gqa_query_heads_per_group_tied_embeddings_and_generate() -> None:
    model = _llama()
    groups = prunekit.channel_groups(model, {"input_ids": IDS})
    heads = [g for g in groups if g.kind == "heads"]
    assert [g.blocks for g in heads] == [((0, 1, 2, 3), (4, 5, 6, 7))] * 2
    masked, out, report = prune_and_compact(model, {"input_ids": IDS})
    _close(out.logits, masked.logits)
    attention = model.model.layers[1].self_attn
    assert (attention.q_proj.out_features, attention.k_proj.out_features) == (48, 16)
    assert attention.num_key_value_groups == 3  # one query head of 4 from each group
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.model.layers[0].mlp.intermediate_size == 28
    assert model.model.norm.weight.shape == (24,)
    assert report.config == {"num_attention_heads": 6, "hidden_size": 24, "intermediate_size": 28}
    assert (model.config.num_key_value_heads, model.config.head_dim) == (2, 8)
    assert report.params_after == _llama_params(24, 6, 2, 28)


def test_llama_generate_with_the_kv_cache_equals_the_masked_model() -> None:
    model = _llama().eval()
    prunekit.prune_channels(model, {"input_ids": IDS}, **SHARES)
    masked = _generate(model)
    prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    assert torch.equal(_generate(model), masked)


def test_llama_whole_key_value_groups() -> None:
    model = _llama(num_key_value_heads=4)
    groups = prunekit.channel_groups(model, {"input_ids": IDS}, gqa="group")
    assert {g.size for g in groups if g.kind == "heads"} == {4} and not any(
        g.blocks for g in groups
    )  # fmt: skip
    masked, out, report = prune_and_compact(model, {"input_ids": IDS}, gqa="group")
    _close(out.logits, masked.logits)
    assert report.config["num_attention_heads"] == 6 and report.config["num_key_value_heads"] == 3
    assert model.model.layers[0].self_attn.num_key_value_groups == 2
    assert report.params_after == _llama_params(24, 6, 3, 28)


def test_per_layer_widths_leave_the_config_stale_and_the_modules_right() -> None:
    model = _llama().eval()
    before = model.config.num_attention_heads
    ignore = ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.*"]
    prunekit.prune_channels(model, {"input_ids": IDS}, 0.3, heads=0.25, ignore=ignore)
    masked = _generate(model)
    report = prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    assert set(report.stale) == {"num_attention_heads", "intermediate_size"}
    assert model.config.num_attention_heads == before
    layers = model.model.layers
    assert [m.self_attn.num_key_value_groups for m in layers] == [4, 3]
    assert [m.mlp.intermediate_size for m in layers] == [28, 40]
    assert torch.equal(_generate(model), masked)


def test_hf_vit_heads_mlp_and_hidden() -> None:
    config = T.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=40, num_labels=3)  # fmt: skip
    model = T.ViTForImageClassification(config)
    x = torch.randn(2, 3, 16, 16)
    masked, out, report = prune_and_compact(model, {"pixel_values": x})
    _close(out.logits, masked.logits)
    assert model.vit.embeddings.cls_token.shape == (1, 1, 24)
    assert report.config == {
        "num_attention_heads": 3,
        "hidden_size": 24,
        "intermediate_size": 28,
        "head_dim": 8,
    }  # fmt: skip  (ViT reads config.head_dim where set)
    d, a, i = 24, 24, 28
    layer = 4 * d + 3 * (d * a + a) + a * d + d + d * i + i + i * d + d
    embeddings = 3 * 16 * d + d + d + 17 * d  # patch conv, cls token, 16 + 1 positions
    assert report.params_after == embeddings + 2 * layer + 2 * d + d * 3 + 3


def test_cross_attention_is_left_alone_with_a_reason() -> None:
    config = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=4, n_positions=16,
                          add_cross_attention=True, bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = T.GPT2LMHeadModel(config)
    memory = torch.randn(2, 5, 32)
    groups = prunekit.channel_groups(model, {"input_ids": IDS, "encoder_hidden_states": memory})
    reasons = " ".join(g.reason or "" for g in groups)
    assert "GPT2Attention" in reasons and "cross attention is not handled" in reasons
    assert any(g.kind == "heads" and g.prunable for g in groups)  # the self-attention's


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [({"heads": 1.0}, "invalid heads=1.0"), ({"hidden": -0.5}, "invalid hidden=-0.5"),
     ({"heads": "half"}, "invalid heads='half'"), ({"gqa": "kv"}, "invalid gqa='kv'")],
)  # fmt: skip
def test_bad_arguments_are_refused_and_change_nothing(kwargs: dict[str, Any], words: str) -> None:
    model = _llama()
    before = fingerprint(model)
    with pytest.raises(ValueError, match="prune_channels: " + words.replace("(", r"\(")) as error:
        prunekit.prune_channels(model, {"input_ids": IDS}, **kwargs)
    assert "expected" in str(error.value)
    assert fingerprint(model) == before


def test_heads_on_a_model_without_attention_is_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"heads=0.5, but Sequential has no attention module"):
        prunekit.prune_channels(model, torch.randn(3, 4), 0.5, heads=0.5)
    assert fingerprint(model) == before


def test_a_failing_criterion_leaves_the_model_as_it_was() -> None:
    model = _llama()
    before = fingerprint(model)

    def wrong(group: prunekit.ChannelGroup) -> Tensor:
        return torch.ones(group.size + (group.kind == "heads"))

    with pytest.raises(ValueError, match="one score per unit"):
        prunekit.prune_channels(model, {"input_ids": IDS}, 0.3, heads=0.25, criterion=wrong)
    assert fingerprint(model) == before


def test_import_prunekit_does_not_import_transformers(
    imported_by: dict[str, frozenset[str]],
) -> None:
    assert sorted(imported_by["prunekit"] & {"transformers", "torchvision"}) == []


def _sensitive(module: nn.Module, args: Any, output: Tensor) -> Tensor:
    """A final norm whose output turns float32 rounding into visible differences, as the
    30 blocks of SmolLM2-135M pruned by l2 did (relative 1.9e-4 in float32, 0 in float64)."""
    return torch.sin(3e3 * output)


def _width_rounding(module: nn.Module, args: Any, output: Tensor) -> Tensor:
    """Adds 100 x (0.1 summed n times one by one, over n, minus 0.1), n the input's width:
    0 in exact arithmetic, the rounding of a sum of that length otherwise (about 1e-8 in
    float32, 1e-17 in float64). Matrix products can round the masked and the compacted
    widths alike on some CPUs; this rounding differs between them on every one."""
    n = args[0].shape[-1]
    tenth, total = torch.tensor(0.1, dtype=output.dtype), torch.zeros((), dtype=output.dtype)
    for _ in range(n):
        total = total + tenth
    return output + 100 * (total / n - tenth)


def test_compact_tells_float32_rounding_from_a_difference() -> None:
    """Query heads 2 of 3 per key/value group and MLP widths of 64: the compacted model is
    exact, but its float32 rounding differs from the masked model's by more than the
    tolerance of the largest output (``_width_rounding`` makes sure of it); compared in
    float64 they agree, so compact keeps it (it refused it before), and the model is left
    in float32."""
    config = T.LlamaConfig(vocab_size=100, hidden_size=96, num_hidden_layers=2,
                           num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                           intermediate_size=256, tie_word_embeddings=True,
                           max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(config).eval()
    model.model.norm.register_forward_hook(_sensitive)
    model.model.layers[0].mlp.down_proj.register_forward_hook(_width_rounding)
    ids = {"input_ids": torch.randint(0, 100, (1, 32), generator=torch.Generator().manual_seed(1))}
    prunekit.prune_channels(model, ids, 0.25, heads=0.67, round_to=64)
    masked = _out(model, ids).logits
    report = prunekit.compact(model, ids, latency_runs=0)
    compacted = _out(model, ids).logits
    assert float((masked - compacted).abs().max()) > 1e-4 * float(masked.abs().max())
    assert report.relative_error <= 1e-4  # measured in float64
    assert model.model.layers[0].mlp.down_proj.weight.shape == (96, 192)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (32, 96)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_compact_still_refuses_a_difference_that_float64_keeps() -> None:
    """A compacted model that truly computes something else is refused in float64 too, and
    the model is put back as it was, in float32."""
    model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=100, hidden_size=32,
                                             num_hidden_layers=1, num_attention_heads=4,
                                             num_key_value_heads=2, head_dim=8,
                                             intermediate_size=40,
                                             max_position_embeddings=32)).eval()  # fmt: skip
    prunekit.prune_channels(model, {"input_ids": IDS}, 0.5)
    mlp = model.model.layers[0].mlp
    width = mlp.up_proj.weight.shape[0]
    mlp.register_forward_hook(lambda m, a, out: out + 1e-2 * m.up_proj.weight.shape[0] / width)
    before = fingerprint(model)
    with pytest.raises(RuntimeError, match="differs from the masked one"):
        prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    assert fingerprint(model) == before


def test_compact_says_so_when_float64_cannot_tell_rounding_from_a_difference() -> None:
    """Mixtral's experts (grouped_mm) do not run in float64: a float32 difference beyond the
    tolerance is then refused as that difference, naming why float64 could not check it,
    not as a failed forward of the compacted model; the model is put back as it was."""
    config = T.MixtralConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                             num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                             intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
                             max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(0)
    model = T.MixtralForCausalLM(config).eval()
    model.model.norm.register_forward_hook(_sensitive)
    model.model.layers[0].self_attn.o_proj.register_forward_hook(_width_rounding)
    inputs = {"input_ids": IDS}
    prunekit.prune_channels(model, inputs, heads=0.5)
    before = fingerprint(model)
    with pytest.raises(RuntimeError, match=r"differs from the masked one.*float64") as error:
        prunekit.compact(model, inputs, latency_runs=0)
    assert "compacted model's forward failed" not in str(error.value)
    assert fingerprint(model) == before


def test_trocr_attention_keeps_its_heads_and_input_width_and_its_mlps_compact() -> None:
    """TrOCR reshapes its heads' output to its input's width: its heads and the hidden width
    are refused up front (with the reason), its MLP widths still compact exactly."""
    config = T.TrOCRConfig(vocab_size=100, d_model=32, decoder_layers=2,
                           decoder_attention_heads=4, decoder_ffn_dim=40,
                           max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(0)
    model = T.TrOCRForCausalLM(config).eval()
    inputs = {"input_ids": IDS}
    groups = prunekit.channel_groups(model, inputs)
    assert sorted(g.kind for g in groups if g.prunable) == ["channels", "channels"]
    assert any("reshapes its heads' output to the width of its input" in (g.reason or "")
               for g in groups if g.kind == "hidden")  # fmt: skip
    prunekit.prune_channels(model, inputs, 0.3)
    masked = _out(model, inputs).logits
    prunekit.compact(model, inputs, latency_runs=0)
    _close(_out(model, inputs).logits, masked)
    assert model.model.decoder.layers[0].fc1.out_features == 28


def _phi4_multimodal() -> Any:
    """Phi-4-multimodal with small text, vision and audio parts: the vision and audio
    encoders have widths (hidden 32, 4 heads) and configs of their own."""
    vision = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
              "num_attention_heads": 4, "image_size": 28, "crop_size": 28}  # fmt: skip
    audio = {"hidden_size": 32, "intermediate_size": 48, "num_blocks": 1,
             "num_attention_heads": 4, "ext_pw_out_channel": 32,
             "depthwise_separable_out_channel": 32, "nemo_conv_channels": 32}  # fmt: skip
    config = T.Phi4MultimodalConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=2,
                                    intermediate_size=96, max_position_embeddings=32,
                                    pad_token_id=0, vision_config=vision,
                                    audio_config=audio)  # fmt: skip
    torch.manual_seed(0)
    return T.Phi4MultimodalForCausalLM(config).eval()


def test_compact_takes_the_config_widths_from_the_text_model_only() -> None:
    """The vision and audio encoders' widths belong to their own configs: compacting the
    text MLPs leaves the text config's head counts and hidden size as they are."""
    model = _phi4_multimodal()
    inputs = {"input_ids": IDS}
    prunekit.prune_channels(model, inputs, 0.3)
    masked = _out(model, inputs).logits
    report = prunekit.compact(model, inputs, latency_runs=0)
    _close(_out(model, inputs).logits, masked)
    config = model.config
    assert (config.num_attention_heads, config.num_key_value_heads, config.hidden_size) == (
        8, 2, 64
    )  # fmt: skip
    assert config.intermediate_size == 67 and report.config["intermediate_size"] == 67
    assert config.vision_config.hidden_size == 32 and config.audio_config.hidden_size == 32
