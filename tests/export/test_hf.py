"""export(..., "hf"): a folder stock transformers loads in a process without prunekit, with the
model's logits; the tokenizer and generation config beside it; refusals that write nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import prunekit
from prunekit.export import export

transformers = pytest.importorskip("transformers")

IDS = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))

SMALL = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, vocab_size=100, head_dim=8)  # fmt: skip


def causal_lm(kind: str) -> torch.nn.Module:
    config = {
        "llama": transformers.LlamaConfig,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
    }[kind](**SMALL)
    torch.manual_seed(0)
    classes = {
        "llama": transformers.LlamaForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
        "mistral": transformers.MistralForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
    }
    return classes[kind](config).eval()


def bert(kind: Any = None) -> torch.nn.Module:
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=48, vocab_size=100)  # fmt: skip
    torch.manual_seed(0)
    return (kind or transformers.BertModel)(config).eval()


def per_layer(model: torch.nn.Module, share: float = 0.3) -> torch.nn.Module:
    """`model` under a budget of `share` of its parameters: layers of their own widths."""
    prunekit.prune_channels(model, IDS, budget=prunekit.Budget(params=share))
    with pytest.warns(UserWarning, match="cannot rebuild"):
        prunekit.compact(model, IDS, latency_runs=0)
    return model


def uniform(model: torch.nn.Module) -> torch.nn.Module:
    prunekit.prune_channels(model, IDS, amount=0.25)
    prunekit.compact(model, IDS, latency_runs=0)
    return model


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out = model(IDS)
    return getattr(out, "logits", None) if hasattr(out, "logits") else out.last_hidden_state


LOAD = """
import sys
sys.modules["prunekit"] = None
import torch, transformers
ids = torch.load(sys.argv[1])
found = {}
for case in sys.argv[2:]:
    folder, name = case.split("::")
    model = getattr(transformers, name).from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        out = model(ids)
    logits = getattr(out, "logits", None)
    found[folder] = [logits if logits is not None else out.last_hidden_state]
    if name == "AutoModelForCausalLM":
        found[folder].append(model.generate(ids[:1, :4], max_new_tokens=4, do_sample=False))
torch.save(found, sys.argv[1] + ".out")
"""

# case -> (how the model is made, the name in transformers that loads its folder)
CASES = {
    "llama": (lambda: per_layer(causal_lm("llama")), "AutoModelForCausalLM"),
    "qwen3": (lambda: per_layer(causal_lm("qwen3")), "AutoModelForCausalLM"),
    "mistral": (lambda: per_layer(causal_lm("mistral")), "AutoModelForCausalLM"),
    "qwen2": (lambda: per_layer(causal_lm("qwen2")), "AutoModelForCausalLM"),
    "llama-uniform": (lambda: uniform(causal_lm("llama")), "LlamaForCausalLM"),
    # 0.25: at 0.3 the budget's nearest total leaves the BertModel's MLPs all 33 wide
    "bert": (lambda: per_layer(bert(transformers.BertModel), 0.25), "AutoModel"),
    "bert-mlm": (
        lambda: per_layer(bert(transformers.BertForMaskedLM), 0.25),
        "AutoModelForMaskedLM",
    ),
}


@dataclass
class Written:
    model: torch.nn.Module
    folder: Path
    outputs: list[torch.Tensor]  # what the folder computes, loaded where prunekit is absent


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Written]:
    """Every case exported (unchecked: the check here is the test's own), then all loaded in
    one process without prunekit (one start of transformers for them all)."""
    root = tmp_path_factory.mktemp("hf")
    models = {}
    for case, (make, _) in CASES.items():
        models[case] = make()
        export(models[case], root / case, "hf", verify=False)
    torch.save(IDS, root / "ids.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(root / "modules")
    cases = [f"{root / case}::{name}" for case, (_, name) in CASES.items()]
    done = subprocess.run([sys.executable, "-c", LOAD, str(root / "ids.pt"), *cases], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = torch.load(str(root / "ids.pt") + ".out")
    return {case: Written(models[case], root / case, found[str(root / case)]) for case in CASES}


def config_of(folder: Path) -> dict[str, Any]:
    values: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return values


@pytest.mark.parametrize("case", ["llama", "qwen3", "mistral", "qwen2"])
def test_layers_of_their_own_widths_load_by_the_modeling_file(
    written: dict[str, Written], case: str
) -> None:
    model, folder, (found, generated) = (
        written[case].model,
        written[case].folder,
        written[case].outputs,
    )
    config = config_of(folder)
    layers = model.model.layers
    assert config["layer_intermediate_sizes"] == [x.mlp.gate_proj.out_features for x in layers]
    assert config["layer_num_attention_heads"] == [
        x.self_attn.q_proj.out_features // 8 for x in layers
    ]
    assert config["layer_num_key_value_heads"] == [
        x.self_attn.k_proj.out_features // 8 for x in layers
    ]
    assert len(set(config["layer_intermediate_sizes"])) > 1
    assert config["model_type"] == f"pruned_{case}"
    assert config["auto_map"]["AutoModelForCausalLM"].startswith("modeling_pruned.")
    assert "prunekit" not in (folder / "modeling_pruned.py").read_text().split('"""', 2)[2]
    torch.testing.assert_close(found, logits(model), rtol=0, atol=1e-5)
    expected = model.generate(IDS[:1, :4], max_new_tokens=4, do_sample=False)
    assert torch.equal(generated, expected)


def test_uniform_widths_write_a_stock_config(written: dict[str, Written]) -> None:
    model, folder = written["llama-uniform"].model, written["llama-uniform"].folder
    assert model.config.intermediate_size == 36
    config = config_of(folder)
    assert config["model_type"] == "llama" and "auto_map" not in config
    assert config["intermediate_size"] == 36
    assert not (folder / "modeling_pruned.py").exists()
    assert (folder / "model.safetensors").is_file()
    torch.testing.assert_close(
        written["llama-uniform"].outputs[0], logits(model), rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("case", ["bert", "bert-mlm"])
def test_a_bert_of_its_own_widths_a_layer_loads(written: dict[str, Written], case: str) -> None:
    model, folder = written[case].model, written[case].folder
    config = config_of(folder)
    assert config["model_type"] == "pruned_bert" and config["attention_head_size"] == 8
    assert len(set(config["layer_intermediate_sizes"])) > 1
    torch.testing.assert_close(written[case].outputs[0], logits(model), rtol=0, atol=1e-5)


def test_transformers_no_longer_reads_pruned_heads() -> None:
    """Why BERT's heads need the modeling file: a config's pruned_heads builds every head."""
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=8, pruned_heads={"0": [0, 1]})  # fmt: skip
    model = transformers.BertModel(config)
    assert model.encoder.layer[0].attention.self.query.weight.shape == (32, 32)


def test_export_checks_the_folder_without_prunekit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = per_layer(causal_lm("llama"))
    monkeypatch.chdir(tmp_path)  # a path relative to the working folder
    report = export(model, "out", "hf", dtype="float16")
    assert config_of(tmp_path / "out")["dtype"] == "float16"
    assert report.difference is not None and report.difference <= 1e-5
    assert "without prunekit" in str(report.verified_by)
    assert next(model.parameters()).dtype == torch.float32


def test_a_folder_whose_logits_differ_is_not_written(tmp_path: Path) -> None:
    model = per_layer(causal_lm("llama"))
    model.lm_head.register_forward_hook(lambda module, args, out: out * float("nan"))
    with pytest.raises(RuntimeError, match=r"differ from the model's by inf.*nothing was written"):
        export(model, tmp_path / "out", "hf")
    assert list(tmp_path.iterdir()) == []


def tokenizer_folder(path: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"t{i}": i for i in range(100)}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="t0")
    fast.save_pretrained(path)
    transformers.GenerationConfig(max_new_tokens=7, eos_token_id=3).save_pretrained(path)
    (path / "config.json").write_text('{"model_type": "llama", "intermediate_size": 48}')
    torch.save({}, path / "old.bin")
    return path


def test_the_tokenizer_and_generation_config_come_from_the_source(tmp_path: Path) -> None:
    source = tokenizer_folder(tmp_path / "source")
    model = per_layer(causal_lm("llama"))
    export(model, tmp_path / "out", "hf", source=source, verify=False)
    folder = tmp_path / "out"
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert tokenizer("t5 t7")["input_ids"] == [5, 7]
    assert json.loads((folder / "generation_config.json").read_text())["max_new_tokens"] == 7
    assert config_of(folder)["model_type"] == "pruned_llama"  # not the source's config
    assert not (folder / "old.bin").exists()


def test_without_a_source_the_model_s_generation_config_and_no_tokenizer(tmp_path: Path) -> None:
    model = uniform(causal_lm("llama"))
    report = export(model, tmp_path / "out", "hf", verify=False)
    assert (tmp_path / "out" / "generation_config.json").is_file()
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    assert any("no tokenizer" in note for note in report.notes)


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def test_a_model_still_masked_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    model = causal_lm("llama")
    prunekit.prune_channels(model, IDS, amount=0.25)
    with pytest.raises(ValueError, match=r"pruning masks.*prunekit\.compact"):
        export(model, tmp_path / "out", "hf")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_family_it_cannot_describe_is_refused_naming_what_is(tmp_path: Path) -> None:
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.transformer.h[0].mlp.c_fc.weight.data = model.transformer.h[0].mlp.c_fc.weight.data
    prunekit.prune_channels(model, IDS, budget=prunekit.Budget(params=0.3))
    with pytest.warns(UserWarning):
        prunekit.compact(model, IDS, latency_runs=0)
    out = tmp_path / "out"
    out.mkdir()  # an earlier model folder
    (out / "config.json").write_text("{}")
    (out / "keep.txt").write_text("old")
    before = digest(out)
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*'gpt2'.*Llama\*.*Bert\*"):
        export(model, out, "hf")
    assert digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"source": "missing"}, ValueError, r"source=.*missing.*no such file"),
        ({"dtype": "int8"}, ValueError, r"dtype='int8'.*float32, float16, bfloat16"),
        ({"example_inputs": [1, 2]}, TypeError, r"example_inputs is a list"),
        ({"format": "safetensors"}, ValueError, r"format='safetensors'.*hf"),
    ],
)
def test_bad_arguments_are_named_and_nothing_is_written(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    model = causal_lm("llama")  # dense: nothing to compact
    if "source" in kwargs:
        kwargs["source"] = tmp_path / kwargs["source"]
    with pytest.raises(error, match=match):
        export(model, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_a_folder_of_other_files_is_refused_not_replaced(tmp_path: Path) -> None:
    out = tmp_path / "Documents"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files but no config.json: not a model folder"):
        export(causal_lm("llama"), out, "hf", verify=False)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Documents"]


def test_an_existing_folder_is_replaced_whole_and_the_model_left_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()  # an earlier model folder
    (out / "config.json").write_text("{}")
    (out / "model-00001-of-00002.safetensors").write_bytes(b"stale")
    kept = out / "keep.txt"
    kept.write_text("old")
    model = per_layer(causal_lm("llama"))
    config = model.config.to_dict()
    export(model, out, "hf", verify=False)
    assert (
        not (out / "keep.txt").exists() and not (out / "model-00001-of-00002.safetensors").exists()
    )
    assert json.loads((out / "config.json").read_text()) != {}
    assert model.config.to_dict() == config


def test_a_class_transformers_does_not_have_is_refused(tmp_path: Path) -> None:
    class Custom(transformers.LlamaForCausalLM):  # type: ignore[misc]
        pass

    torch.manual_seed(0)
    model = Custom(transformers.LlamaConfig(**SMALL)).eval()
    with pytest.raises(TypeError, match=r"Custom, which is not a class of transformers"):
        export(model, tmp_path / "out", "hf")
    assert list(tmp_path.iterdir()) == []


def test_a_model_loaded_from_gguf_is_written_as_the_float_model_it_is(tmp_path: Path) -> None:
    """transformers unpacks a GGUF file's weights to floats but keeps the model marked
    GGUF-quantized, which save_pretrained refuses; the folder is the float model's."""
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer
    from transformers.utils.quantization_config import GgufConfig

    model = uniform(causal_lm("llama"))
    quantizer = GgufHfQuantizer(GgufConfig())
    model.hf_quantizer = quantizer
    model.config.quantization_config = quantizer.quantization_config
    with pytest.raises(ValueError, match="not serializable"):
        model.save_pretrained(tmp_path / "plain")
    export(model, tmp_path / "out", "hf", verify=False)
    assert "quantization_config" not in config_of(tmp_path / "out")
    assert model.hf_quantizer is quantizer
    assert model.config.quantization_config is quantizer.quantization_config
