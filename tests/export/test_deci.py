"""export(..., "deci"): DeciLM block_configs from which vLLM's and llama.cpp's readers derive
every layer's widths, the weights under the names and shapes they load, refusals that name the
layer and what fits, and write nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import prunekit
from prunekit.export import export

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

IDS = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
HIDDEN = 64
SMALL = dict(hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=4, vocab_size=100,
             head_dim=16)  # fmt: skip


def llama(**overrides: Any) -> torch.nn.Module:
    values: dict[str, Any] = dict(SMALL, num_hidden_layers=3, intermediate_size=768)
    values.update(overrides)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**values)).eval()


def per_layer(model: torch.nn.Module, **options: Any) -> torch.nn.Module:
    """Each layer's MLP at its own width (multiples of 256), layer 1 with 2 key/value heads."""
    budget = prunekit.Budget(params=0.4, kinds=("channels",))
    prunekit.prune_channels(model, IDS, budget=budget, round_to=256, **options)
    with pytest.warns(UserWarning):
        prunekit.compact(model, IDS, latency_runs=0)
    attn = model.model.layers[1].self_attn
    for name in ("k_proj", "v_proj"):  # what pruning key/value heads leaves: 2 of 4
        old = getattr(attn, name)
        new = torch.nn.Linear(HIDDEN, 32, bias=False)
        new.weight.data = old.weight.data[:32].clone()
        setattr(attn, name, new)
    attn.num_key_value_groups = 2
    return model


def readers_widths(config: dict[str, Any]) -> dict[str, list[int]]:
    """Each layer's widths as the readers derive them, written from their rules:

    vLLM (nemotron_nas.DeciLMDecoderLayer): query heads = num_attention_heads, key/value
    heads = num_attention_heads // n_heads_in_group, head size = head_dim (or hidden /
    heads), MLP = int(2 * ffn_mult * hidden / 3) rounded up to a multiple of 256.
    llama.cpp (convert_hf_to_gguf DeciModel): the same head counts and MLP widths, and a
    head size of hidden_size // num_attention_heads (it ignores head_dim).
    """
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    ffn = []
    for block in config["block_configs"]:
        size = int(2 * block["ffn"]["ffn_mult"] * hidden / 3)
        ffn.append(size if size % 256 == 0 else size + 256 - size % 256)
    vllm_head = config.get("head_dim") or hidden // heads
    assert vllm_head == hidden // heads  # llama.cpp's head size is vLLM's
    return {
        "heads": [heads for _ in config["block_configs"]],
        "kv_heads": [heads // b["attention"]["n_heads_in_group"] for b in config["block_configs"]],
        "ffn": ffn,
        "head_dim": [hidden // heads for _ in config["block_configs"]],
    }


def module_widths(model: torch.nn.Module) -> dict[str, list[int]]:
    layers = model.model.layers
    return {
        "heads": [x.self_attn.q_proj.out_features // 16 for x in layers],
        "kv_heads": [x.self_attn.k_proj.out_features // 16 for x in layers],
        "ffn": [x.mlp.up_proj.out_features for x in layers],
        "head_dim": [16 for _ in layers],
    }


def test_block_configs_give_every_layer_s_widths_as_the_readers_derive_them(
    tmp_path: Path,
) -> None:
    model = per_layer(llama())
    widths = module_widths(model)
    assert len(set(widths["ffn"])) > 1 and widths["kv_heads"][1] == 2
    report = export(model, tmp_path / "out", "deci")
    folder = tmp_path / "out"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DeciLMForCausalLM"]
    assert config["model_type"] == "nemotron-nas"
    assert len(config["block_configs"]) == config["num_hidden_layers"] == 3
    assert all(isinstance(b["ffn"]["ffn_mult"], float) for b in config["block_configs"])
    assert readers_widths(config) == widths
    # the weights, under the names both readers map, of the shapes the blocks give
    tensors = safetensors_torch.load_file(str(folder / "model.safetensors"))
    derived = readers_widths(config)
    for i in range(3):
        q, kv = derived["heads"][i] * 16, derived["kv_heads"][i] * 16
        assert tensors[f"model.layers.{i}.self_attn.q_proj.weight"].shape == (q, HIDDEN)
        assert tensors[f"model.layers.{i}.self_attn.k_proj.weight"].shape == (kv, HIDDEN)
        assert tensors[f"model.layers.{i}.mlp.down_proj.weight"].shape == (
            HIDDEN,
            derived["ffn"][i],
        )
    assert torch.equal(tensors["model.embed_tokens.weight"], model.model.embed_tokens.weight)
    assert report.difference is None and "vLLM" in str(report.verified_by)
    assert "checked by block_configs derived" in str(report)
    assert any("not logits" in note for note in report.notes)


def test_the_config_reads_as_vllm_reads_it(tmp_path: Path) -> None:
    """vLLM reads block_configs[i].attention.n_heads_in_group (attributes), through the
    configuration file the folder names in auto_map."""
    from prunekit.export import remote_deci

    model = per_layer(llama())
    export(model, tmp_path / "out", "deci", verify=False)
    folder = tmp_path / "out"
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration_decilm.DeciLMConfig"}
    text = (folder / "configuration_decilm.py").read_text()
    assert text == Path(remote_deci.__file__).read_text() and "import prunekit" not in text
    read = remote_deci.DeciLMConfig.from_pretrained(folder)
    assert [b.attention.n_heads_in_group for b in read.block_configs] == [1, 2, 1]
    assert not any(b.attention.no_op or b.ffn.no_op for b in read.block_configs)
    assert read.to_dict()["block_configs"] == config["block_configs"]


def test_removed_blocks_are_absent(tmp_path: Path) -> None:
    model = per_layer(llama(num_hidden_layers=4))
    prunekit.prune_blocks(model, [IDS], count=1)
    prunekit.remove_blocks(model)
    export(model, tmp_path / "out", "deci")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["num_hidden_layers"] == len(config["block_configs"]) == 3
    assert readers_widths(config) == module_widths(model)


@pytest.mark.parametrize("hidden", [64, 576, 960, 2048, 3072, 4096, 5120, 8192])
def test_ffn_mult_reproduces_every_multiple_of_256(hidden: int) -> None:
    from prunekit.export.deci import ffn_mult

    for width in range(256, 8 * hidden + 1, 256):
        mult = ffn_mult(width, hidden)
        assert mult is not None
        size = int(2 * mult * hidden / 3)
        assert (size if size % 256 == 0 else size + 256 - size % 256) == width
    assert ffn_mult(1000, hidden) is None


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def refused(tmp_path: Path, model: torch.nn.Module, error: type[Exception], match: str) -> None:
    """The export is refused as `match` says, and the folder there is as it was."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "config.json").write_text('{"old": true}')
    before = digest(out)
    with pytest.raises(error, match=match):
        export(model, out, "deci")
    assert digest(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_width_the_readers_cannot_derive_is_refused_naming_round_to(tmp_path: Path) -> None:
    model = llama()
    prunekit.prune_channels(model, IDS, amount=0.3)
    prunekit.compact(model, IDS, latency_runs=0)
    refused(tmp_path, model, ValueError, r"model\.layers\.0\.mlp is 538 wide.*round_to=256")


def test_pruned_query_heads_are_refused_naming_the_budget_option(tmp_path: Path) -> None:
    model = llama(intermediate_size=256)
    prunekit.prune_channels(model, IDS, heads=0.5)
    prunekit.compact(model, IDS, latency_runs=0)
    refused(tmp_path, model, ValueError, r"model\.layers\.0\.self_attn has 2 query heads.*kinds")


def test_qwen3_norms_and_biases_and_windows_are_refused(tmp_path: Path) -> None:
    small = dict(SMALL, num_hidden_layers=1, intermediate_size=256)
    qwen3 = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**small))
    refused(tmp_path, qwen3, ValueError, r"model\.layers\.0\.self_attn has per-head q/k norms")
    qwen2 = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small))
    refused(tmp_path, qwen2, ValueError, r"model\.layers\.0\.q_proj has a bias")
    mistral = transformers.MistralForCausalLM(transformers.MistralConfig(**small))
    refused(tmp_path, mistral, ValueError, r"sliding_window=4096")


def test_other_families_and_masked_models_are_refused(tmp_path: Path) -> None:
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4))
    refused(tmp_path, gpt2, TypeError, r"GPT2LMHeadModel.*'gpt2'.*Llama family")
    masked = llama()
    prunekit.prune_channels(masked, IDS, amount=0.5, round_to=256)
    assert prunekit.is_pruned(masked)
    refused(tmp_path, masked, ValueError, r"pruning masks.*compact")


def test_the_tokenizer_comes_from_the_source(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    source = tmp_path / "source"
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="a").save_pretrained(
        source
    )
    (source / "config.json").write_text("{}")
    model = per_layer(llama())
    export(model, tmp_path / "out", "deci", source=source, verify=False)
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    assert (
        json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "nemotron-nas"
    )
