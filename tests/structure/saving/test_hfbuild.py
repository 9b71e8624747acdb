"""Compacted Hugging Face models saved and reloaded: uniform widths through save_pretrained /
from_pretrained (compact updates the config), per-layer widths through save_compacted /
load_compacted into a model built from the original config. Small configs, random init."""

from __future__ import annotations

import copy
import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import prunekit

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
from huggingface_hub.errors import StrictDataclassError  # noqa: E402

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(0))


def bert(**options: Any) -> Callable[[], nn.Module]:
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        vocab_size=100, max_position_embeddings=32,
    )  # fmt: skip
    return lambda: transformers.BertModel(copy.deepcopy(config), **options)


def gpt2() -> nn.Module:
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32)
    return transformers.GPT2LMHeadModel(config)


def llama(kv_heads: int = 2) -> nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
        intermediate_size=48, vocab_size=100, head_dim=8, tie_word_embeddings=True,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def vit() -> nn.Module:
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        image_size=16, patch_size=8,
    )  # fmt: skip
    return transformers.ViTModel(config)


BERT_INPUTS = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS)}
VIT_INPUTS = {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))}


def compacted(make: Callable[[], nn.Module], x: Any, scope: str, **amounts: float) -> nn.Module:
    torch.manual_seed(0)
    model = make().eval()
    prunekit.prune_channels(model, x, 0.3, scope=scope, **amounts)
    prunekit.compact(model, x, latency_runs=0)
    return model


def assert_same(model: nn.Module, loaded: nn.Module, x: Any) -> None:
    a, b = model.state_dict(), loaded.state_dict()
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    with torch.no_grad():
        assert torch.equal(model(**x)[0], loaded.eval()(**x)[0])


def test_bert_with_uniform_mlp_widths_saves_with_save_pretrained(tmp_path: Path) -> None:
    model = compacted(bert(), BERT_INPUTS, "layer")
    widths = {layer.intermediate.dense.out_features for layer in model.encoder.layer}
    assert widths == {34} and model.config.intermediate_size == 34
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModel.from_pretrained(tmp_path)
    assert_same(model, loaded, BERT_INPUTS)


def test_bert_heads_mlp_and_hidden_per_layer_rebuild_with_load_compacted(tmp_path: Path) -> None:
    make = bert(add_pooling_layer=False)
    model = compacted(make, BERT_INPUTS, "global", heads=0.25, hidden=0.25)
    layers = model.encoder.layer
    assert len({layer.intermediate.dense.out_features for layer in layers}) == 2  # per layer
    assert layers[0].attention.self.num_attention_heads == 3
    prunekit.save_compacted(model, tmp_path)
    fresh = make()
    assert fresh.config.hidden_size == 32
    prunekit.load_compacted(fresh, tmp_path)
    assert_same(model, fresh, BERT_INPUTS)
    assert fresh.config.hidden_size == model.config.hidden_size == 24
    assert fresh.config.num_attention_heads == 3
    self_attention = fresh.encoder.layer[0].attention.self
    assert (self_attention.num_attention_heads, self_attention.all_head_size) == (3, 24)


def test_bert_with_uniform_heads_and_hidden_loads_with_from_pretrained(tmp_path: Path) -> None:
    """25 % of the heads and of the hidden width: head_dim stays 32 / 4 = 24 / 3."""
    model = compacted(bert(add_pooling_layer=False), BERT_INPUTS, "layer", heads=0.25, hidden=0.25)
    model.save_pretrained(tmp_path)
    loaded = transformers.BertModel.from_pretrained(tmp_path, add_pooling_layer=False)
    assert_same(model, loaded, BERT_INPUTS)


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_gpt2_round_trips_and_generates(tmp_path: Path, scope: str) -> None:
    x = {"input_ids": IDS}
    model = compacted(gpt2, x, scope, heads=0.25, hidden=0.25)
    assert model.transformer.h[0].attn.num_heads == 3 and model.config.n_embd == 24
    if scope == "layer":
        model.save_pretrained(tmp_path)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    else:
        prunekit.save_compacted(model, tmp_path)
        loaded = prunekit.load_compacted(gpt2(), tmp_path)
        assert_same(model, prunekit.load_compacted(tmp_path), x)  # the folder alone too
    assert_same(model, loaded, x)
    options = {"max_new_tokens": 4, "do_sample": False}
    assert torch.equal(model.generate(IDS, **options), loaded.generate(IDS, **options))


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_vit_round_trips(tmp_path: Path, scope: str) -> None:
    model = compacted(vit, VIT_INPUTS, scope, heads=0.25, hidden=0.25)
    if scope == "layer":
        model.save_pretrained(tmp_path)
        loaded = transformers.ViTModel.from_pretrained(tmp_path)
    else:
        inner = {layer.mlp.fc1.out_features for layer in model.layers}
        assert len(inner) == 2
        prunekit.save_compacted(model, tmp_path)
        loaded = prunekit.load_compacted(vit(), tmp_path)
        assert_same(model, prunekit.load_compacted(tmp_path), VIT_INPUTS)
    assert_same(model, loaded, VIT_INPUTS)


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_llama_with_grouped_query_heads_round_trips_and_generates(
    tmp_path: Path, scope: str
) -> None:
    x = {"input_ids": IDS}
    model = compacted(llama, x, scope, heads=0.25, hidden=0.25)
    if scope == "layer":
        model.save_pretrained(tmp_path)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    else:
        prunekit.save_compacted(model, tmp_path)
        loaded = prunekit.load_compacted(llama(), tmp_path)
        assert_same(model, prunekit.load_compacted(tmp_path), x)
    assert_same(model, loaded, x)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    options = {"max_new_tokens": 4, "do_sample": False}
    assert torch.equal(model.generate(IDS, **options), loaded.generate(IDS, **options))


def compact_warnings(model: nn.Module, x: Any, **amounts: float) -> list[str]:
    """Prune with `amounts` per layer, compact; the warnings compact gave."""
    prunekit.prune_channels(model, x, scope="layer", **amounts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = prunekit.compact(model, x, latency_runs=0)
    found = [str(w.message) for w in caught if str(w.message).startswith("compact:")]
    assert bool(found) == bool(report.not_rebuilt)
    return found


HEADS_ALONE = [
    ("bert", bert(), BERT_INPUTS, "building it raises ValueError: The hidden size \\(32\\) is "
     "not a multiple of the number of attention heads \\(3\\)"),
    ("gpt2", gpt2, {"input_ids": IDS}, "building it raises ValueError"),
    ("llama", lambda: llama(kv_heads=4), {"input_ids": IDS}, "building it raises .*hidden "
     "size \\(32\\) is not a multiple of the number of attention heads \\(3\\)"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "make", "x", "why"), HEADS_ALONE)
def test_heads_cut_alone_warn_and_reload_with_load_compacted_folder_alone(
    tmp_path: Path, name: str, make: Callable[[], nn.Module], x: Any, why: str
) -> None:
    """A quarter of the heads, the hidden width kept: from_pretrained cannot rebuild it
    (transformers derives the head size from hidden_size / heads, or refuses that config);
    compact says so, and load_compacted(folder) alone rebuilds it, outputs equal."""
    torch.manual_seed(0)
    model = make().eval()
    found = compact_warnings(model, x, heads=0.25)
    assert len(found) == 1 and "prunekit.load_compacted(folder)" in found[0]
    assert re.search(why, found[0]), found[0]
    assert model.config.num_attention_heads == 3
    with pytest.raises((RuntimeError, ValueError, StrictDataclassError)):  # either refuses
        model.save_pretrained(tmp_path / "hf")
        type(model).from_pretrained(tmp_path / "hf")
    prunekit.save_compacted(model, tmp_path / "compacted")
    loaded = prunekit.load_compacted(tmp_path / "compacted")
    assert type(loaded) is type(model) and not loaded.training
    assert_same(model, loaded, x)
    assert loaded.config.num_attention_heads == 3 and loaded.config.hidden_size == 32
    if name != "bert":
        assert loaded.lm_head.weight is loaded.get_input_embeddings().weight
        options = {"max_new_tokens": 4, "do_sample": False}
        assert torch.equal(model.generate(IDS, **options), loaded.generate(IDS, **options))


def test_bert_pooler_left_wide_warns_and_reloads(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = bert()().eval()
    found = compact_warnings(model, BERT_INPUTS, hidden=0.25, heads=0.25)
    assert "pooler.dense.weight is (32, 24), built as (24, 24)" in found[0]
    prunekit.save_compacted(model, tmp_path)
    assert_same(model, prunekit.load_compacted(tmp_path), BERT_INPUTS)


@pytest.mark.parametrize(
    ("make", "x", "amounts"),
    [
        (bert(), BERT_INPUTS, {"amount": 0.3}),
        (bert(add_pooling_layer=False), BERT_INPUTS, {"heads": 0.25, "hidden": 0.25}),
        (llama, {"input_ids": IDS}, {"heads": 0.5, "amount": 0.3}),
    ],
)
def test_rebuildable_compactions_do_not_warn(
    make: Callable[[], nn.Module], x: Any, amounts: dict[str, float]
) -> None:
    torch.manual_seed(0)
    assert compact_warnings(make().eval(), x, **amounts) == []


def test_a_uniform_llama_reloads_from_its_folder_like_from_pretrained(tmp_path: Path) -> None:
    model = compacted(llama, {"input_ids": IDS}, "layer", heads=0.25, hidden=0.25)
    prunekit.save_compacted(model, tmp_path)
    model.save_pretrained(tmp_path / "hf")
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    loaded = prunekit.load_compacted(tmp_path)
    assert_same(reference, loaded, {"input_ids": IDS})
    mine, theirs = loaded.config.to_dict(), reference.config.to_dict()
    assert mine.pop("_name_or_path") == str(tmp_path) and theirs.pop("_name_or_path")
    assert {k: v for k, v in mine.items() if k not in ("architectures", "dtype")} == {
        k: v for k, v in theirs.items() if k not in ("architectures", "dtype")
    }


def test_a_folder_transformers_cannot_build_is_refused(tmp_path: Path) -> None:
    model = compacted(bert(add_pooling_layer=False), BERT_INPUTS, "layer", heads=0.25)
    prunekit.save_compacted(model, tmp_path)
    with pytest.raises(ValueError, match=r"the model's \['pooler', .*not in the file"):
        prunekit.load_compacted(tmp_path)  # BertModel(config) builds a pooler it lacks
    loaded = prunekit.load_compacted(
        tmp_path, factory=lambda config: transformers.BertModel(config, add_pooling_layer=False)
    )
    assert_same(model, loaded, BERT_INPUTS)
    where = tmp_path / "compacted.json"
    manifest = json.loads(where.read_text())
    manifest["modules"][""]["type"] = "transformers.NoSuchModel"
    manifest["config"]["architectures"] = ["NoSuchModel"]
    where.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"{where}: transformers .* has no model class for the "
                       r"saved model transformers.NoSuchModel \(config 'architectures': "
                       r"\['NoSuchModel'\]\)"):  # fmt: skip
        prunekit.load_compacted(tmp_path)


def qwen3_moe() -> nn.Module:
    config = transformers.Qwen3MoeConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
        max_position_embeddings=32,
    )  # fmt: skip
    return transformers.Qwen3MoeForCausalLM(config)


def logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model.eval()(input_ids=IDS).logits
    return out


@pytest.mark.parametrize(
    ("make", "amounts", "named"),
    [(qwen3_moe, {"experts": 0.25}, r"masked experts of the routers model\.layers\.0\.mlp\.gate,"),
     (llama, {"hidden": 0.25}, r"masked hidden width of the norms model\.layers\.0\.input_la")],
)  # fmt: skip
def test_masks_that_act_through_hooks_are_refused_until_compacted(
    tmp_path: Path, make: Callable[[], nn.Module], amounts: dict[str, float], named: str
) -> None:
    """Masked experts (router hooks) and a masked hidden width (norm hooks) compute through
    forward hooks no file holds: saved masked, the reloaded model would compute another
    output. save_compacted refuses them before writing anything; compacted, they round trip."""
    torch.manual_seed(0)
    model = make().eval()
    prunekit.prune_channels(model, {"input_ids": IDS}, **amounts)
    masked = logits(model)
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "notes.txt").write_text("kept")
    with pytest.raises(ValueError, match=rf"save_compacted: .*{named}.*prunekit\.compact\(model, "
                       r"inputs\).*then save_compacted"):  # fmt: skip
        prunekit.save_compacted(model, tmp_path / "saved")
    assert [p.name for p in (tmp_path / "saved").iterdir()] == ["notes.txt"]
    assert torch.equal(logits(model), masked)
    prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    prunekit.save_compacted(model, tmp_path / "saved")
    loaded = prunekit.load_compacted(tmp_path / "saved")
    compact = logits(model)
    assert torch.allclose(compact, masked, atol=1e-5) and torch.equal(logits(loaded), compact)


def test_masks_saved_exactly_save_and_reload_uncompacted(tmp_path: Path) -> None:
    """Masked MLP channels and heads are weight masks alone (no hook): saved masked, they
    reload masked and compute the same."""
    torch.manual_seed(0)
    model = llama().eval()
    prunekit.prune_channels(model, {"input_ids": IDS}, 0.3, heads=0.25)
    prunekit.save_compacted(model, tmp_path)
    loaded = prunekit.load_compacted(tmp_path)
    assert prunekit.is_pruned(loaded)
    assert torch.equal(logits(loaded), logits(model))


def test_skipped_blocks_are_refused_until_removed(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = llama().eval()
    prunekit.skip_blocks(model, [1])
    with pytest.raises(ValueError, match=r"save_compacted: .*the skipped block model\.layers\.1: "
                       r".*prunekit\.remove_blocks\(model\)"):  # fmt: skip
        prunekit.save_compacted(model, tmp_path / "saved")
    assert not (tmp_path / "saved").exists()
    prunekit.remove_blocks(model)
    prunekit.save_compacted(model, tmp_path / "saved")
    loaded = prunekit.load_compacted(tmp_path / "saved")
    assert len(loaded.model.layers) == 1 and torch.equal(logits(loaded), logits(model))
