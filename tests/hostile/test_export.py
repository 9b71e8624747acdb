"""Hostile calls of prunekit.export.export: every refusal names the bad argument and leaves
the model (bit for bit, config, mode), the source's files and the destination as they were;
every success writes what loads and computes the model's outputs, and changes no model."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import prunekit
from hostile.support import llama, refused, tree, unchanged
from prunekit.export import export
from prunekit.export import hf_folder as hf_writer

transformers = pytest.importorskip("transformers")

IDS = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(0))


def logits(model: nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


# --- arguments of a wrong type or value --------------------------------------------------------

BAD_ARGUMENTS: list[tuple[str, dict[str, Any], type[BaseException], str]] = [
    ("model-str", {"model": "model"}, TypeError, r"export: model is a str"),
    ("model-none", {"model": None}, TypeError, r"export: model is a NoneType"),
    ("format-upper", {"format": "HF"}, ValueError, r"format='HF'.*expected one of"),
    ("format-unknown", {"format": "tflite"}, ValueError, r"format='tflite'"),
    ("format-none", {"format": None}, ValueError, r"format=None"),
    ("format-list", {"format": ["hf"]}, ValueError, r"format=\['hf'\]"),
    ("hf-dtype-float64", {"dtype": "float64"}, ValueError, r"dtype='float64'.*expected one of"),
    ("hf-dtype-gguf-name", {"dtype": "f16"}, ValueError, r"dtype='f16'"),
    ("hf-dtype-torch", {"dtype": torch.float16}, ValueError, r"dtype=torch\.float16"),
    ("deci-dtype-int8", {"format": "deci", "dtype": "int8"}, ValueError, r"dtype='int8'"),
    ("gguf-dtype-q4k", {"format": "gguf", "dtype": "q4_k"}, ValueError, r"dtype='q4_k'"),
    ("gguf-dtype-int", {"format": "gguf", "dtype": 16}, ValueError, r"dtype=16"),
    ("gguf-dtype-same", {"format": "gguf", "dtype": "same"}, ValueError,
     r"dtype='same'.*'source' \(each tensor in its GGUF source's type\)"),
    ("gguf-source-types-no-source", {"format": "gguf", "dtype": "source"}, ValueError,
     r"dtype='source'.*source=None; expected the GGUF file the model came from"),
    ("gguf-source-types-not-gguf", {"format": "gguf", "dtype": "source",
     "source": "<tmp>/notes.txt"}, ValueError, r"dtype='source'.*notes\.txt.*no GGUF file"),
    ("hf-dtype-source", {"dtype": "source"}, ValueError, r"dtype='source'"),
    ("onnx-dtype-f16", {"format": "onnx", "dtype": "float16", "example_inputs": IDS},
     ValueError, r"dtype='float16'"),
    ("source-missing", {"source": "<tmp>/nowhere"}, ValueError, r"source=.*no such file"),
    ("source-not-gguf", {"source": "<tmp>/notes.txt"}, ValueError, r"source=.*not \.gguf"),
    ("gguf-no-source", {"format": "gguf"}, ValueError, r"source"),
    ("hf-inputs-list", {"example_inputs": [[1, 2, 3]]}, TypeError, r"example_inputs is a list"),
    ("hf-inputs-dict-int", {"example_inputs": {"input_ids": 3}}, TypeError, r"example_inputs"),
    ("hf-inputs-float-nan", {"example_inputs": torch.full((1, 4), float("nan"))},
     (ValueError, TypeError), r"example_inputs"),
    ("hf-inputs-out-of-vocab", {"example_inputs": torch.tensor([[1, 2, 100000]])},
     ValueError, r"example_inputs.*vocab"),
    ("hf-inputs-negative", {"example_inputs": torch.tensor([[1, -2, 3]])},
     ValueError, r"example_inputs"),
    ("hf-inputs-empty", {"example_inputs": torch.zeros((1, 0), dtype=torch.long)},
     ValueError, r"example_inputs"),
    ("hf-inputs-complex", {"example_inputs": torch.ones((1, 4), dtype=torch.complex64)},
     (ValueError, TypeError), r"example_inputs"),
    ("hf-inputs-meta", {"example_inputs": torch.ones((1, 4), dtype=torch.long, device="meta")},
     (ValueError, TypeError), r"example_inputs"),
    ("hf-inputs-sparse", {"example_inputs": torch.ones((1, 4), dtype=torch.long).to_sparse()},
     (ValueError, TypeError), r"example_inputs"),
    ("gguf-inputs-meta", {"format": "gguf", "source": "<folder>",
                          "example_inputs": torch.ones((1, 4), dtype=torch.long, device="meta")},
     (ValueError, TypeError), r"example_inputs"),
    ("gguf-inputs-sparse", {"format": "gguf", "source": "<folder>",
                            "example_inputs": torch.ones((1, 4), dtype=torch.long).to_sparse()},
     (ValueError, TypeError), r"example_inputs"),
    ("gguf-inputs-out-of-vocab", {"format": "gguf", "source": "<folder>",
                                  "example_inputs": torch.tensor([[1, 300]])},
     ValueError, r"example_inputs"),
    ("onnx-no-inputs", {"format": "onnx"}, ValueError, r"example_inputs=None"),
    ("onnx-inputs-str", {"format": "onnx", "example_inputs": "ids"}, TypeError,
     r"example_inputs is a str"),
]  # fmt: skip


def _fill(value: Any, tmp_path: Path, folder: Path) -> Any:
    if isinstance(value, str) and value.startswith("<tmp>/"):
        return tmp_path / value.removeprefix("<tmp>/")
    return folder if value == "<folder>" else value


@pytest.mark.parametrize(("case", "options", "error", "match"), BAD_ARGUMENTS,
                         ids=[c[0] for c in BAD_ARGUMENTS])  # fmt: skip
def test_a_bad_argument_is_named_and_changes_nothing(
    case: str, options: dict[str, Any], error: type[BaseException], match: str,
    tmp_path: Path, folder: Path,
) -> None:  # fmt: skip
    (tmp_path / "notes.txt").write_text("mine")
    model = llama("uniform")
    arguments: dict[str, Any] = {"model": model, "path": tmp_path / "out", "format": "hf"}
    arguments.update({k: _fill(v, tmp_path, folder) for k, v in options.items()})
    if arguments["format"] == "gguf" and arguments["path"].suffix != ".gguf":
        arguments["path"] = tmp_path / "out.gguf"
    given = arguments.pop("model")
    refused(lambda: export(given, **arguments), error, match,
            model=given if isinstance(given, nn.Module) else None,
            paths=(tmp_path, folder))  # fmt: skip


# --- models a format cannot express ----------------------------------------------------------


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=300)
    return transformers.GPT2LMHeadModel(config).eval()


def _bert() -> nn.Module:
    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=300)  # fmt: skip
    return transformers.BertModel(config).eval()


def _meta() -> nn.Module:
    return llama("uniform").to("meta")


def _nan() -> nn.Module:
    model = llama("uniform")
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    return model


def _torch_masked() -> nn.Module:
    """Masked by torch.nn.utils.prune itself (the library prunekit is a drop-in for)."""
    import torch.nn.utils.prune as torch_prune

    model = llama("uniform")
    torch_prune.l1_unstructured(model.model.layers[0].mlp.down_proj, "weight", 0.5)
    return model


def _qwen3() -> nn.Module:
    config = transformers.Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      vocab_size=300)  # fmt: skip
    return transformers.Qwen3ForCausalLM(config).eval()


UNSUPPORTED: list[tuple[str, Callable[[], nn.Module], str, type[BaseException], str]] = [
    ("masked-hf", lambda: llama("masked"), "hf", ValueError, r"pruning masks.*compact"),
    ("masked-deci", lambda: llama("masked"), "deci", ValueError, r"pruning masks"),
    ("masked-gguf", lambda: llama("masked"), "gguf", ValueError, r"pruning masks"),
    ("masked-onnx", lambda: llama("masked"), "onnx", ValueError, r"pruning masks"),
    ("torch-masked-hf", _torch_masked, "hf", ValueError, r"pruning masks.*down_proj"),
    ("torch-masked-gguf", _torch_masked, "gguf", ValueError, r"pruning masks.*down_proj"),
    ("torch-masked-deci", _torch_masked, "deci", ValueError, r"pruning masks.*down_proj"),
    ("plain-module-hf", lambda: nn.Sequential(nn.Linear(4, 4)), "hf", TypeError,
     r"expected a Hugging Face model"),
    ("gpt2-gguf", _gpt2, "gguf", TypeError, r"model_type 'gpt2'"),
    ("gpt2-deci", _gpt2, "deci", TypeError, r"GPT2LMHeadModel"),
    ("bert-gguf", _bert, "gguf", TypeError, r"model_type 'bert'"),
    ("bert-deci", _bert, "deci", TypeError, r"BertModel"),
    ("qwen3-gguf", _qwen3, "gguf", ValueError, r"qwen3"),
    ("qwen3-deci", _qwen3, "deci", ValueError, r"q/k norms"),
    ("per-layer-deci", lambda: llama("per-layer"), "deci", ValueError, r"one count of query"),
    ("uniform-48-deci", lambda: llama("uniform"), "deci", ValueError, r"round_to=256"),
    ("meta-hf", _meta, "hf", ValueError, r"meta"),
    ("meta-gguf", _meta, "gguf", ValueError, r"meta"),
    ("meta-deci", _meta, "deci", ValueError, r"meta"),
    ("nan-weights-gguf", _nan, "gguf", (ValueError, RuntimeError), r"NaN|nan|differ"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "build", "form", "error", "match"), UNSUPPORTED,
                         ids=[c[0] for c in UNSUPPORTED])  # fmt: skip
def test_a_model_the_format_cannot_express_is_refused(
    case: str, build: Callable[[], nn.Module], form: str, error: type[BaseException],
    match: str, tmp_path: Path, folder: Path,
) -> None:  # fmt: skip
    model = build()
    path = tmp_path / ("out.gguf" if form == "gguf" else "out.onnx" if form == "onnx" else "out")
    options: dict[str, Any] = {"source": folder} if form in ("gguf", "hf", "deci") else {}
    if form == "onnx":
        options["example_inputs"] = {"input_ids": IDS}
    refused(lambda: export(model, path, form, **options), error, match, model=model,
            paths=(tmp_path, folder))  # fmt: skip


# --- destinations -----------------------------------------------------------------------------


def _export_to(
    model: nn.Module, form: str, path: Path, source: Path | None = None
) -> prunekit.export.ExportReport:
    return export(model, path, form, source=source, verify=False)


DESTINATIONS = [
    ("hf-over-a-file", "hf", "file", ValueError, r"path=.*is a file; expected a folder"),
    ("deci-over-a-file", "deci", "file", ValueError, r"path=.*is a file; expected a folder"),
    ("gguf-over-a-folder", "gguf", "folder", ValueError, r"path=.*is a folder; expected a file"),
    ("hf-over-a-folder-of-other-files", "hf", "folder", ValueError,
     r"path=.*holds files but no config.json"),
    ("hf-no-parent", "hf", "no-parent", ValueError, r"path=.*does not exist"),
    ("gguf-no-parent", "gguf", "no-parent", ValueError, r"path=.*does not exist"),
    ("hf-is-the-source", "hf", "source", ValueError, r"path=.*source"),
    ("hf-inside-the-source", "hf", "inside-source", ValueError, r"path=.*source"),
    ("gguf-inside-the-source", "gguf", "inside-source", ValueError, r"path=.*source"),
    ("hf-holds-the-source", "hf", "holds-source", ValueError, r"path=.*source"),
    ("hf-links-to-the-source", "hf", "link-source", ValueError, r"path=.*source"),
    ("hf-empty-path", "hf", "empty", ValueError, r"path='\.' names no"),
    ("hf-not-writable", "hf", "proc", (ValueError, OSError), r"out|proc"),
    ("gguf-not-writable", "gguf", "proc", (ValueError, OSError), r"out|proc"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "form", "where", "error", "match"), DESTINATIONS,
                         ids=[c[0] for c in DESTINATIONS])  # fmt: skip
def test_a_destination_it_cannot_take_is_refused(
    case: str, form: str, where: str, error: type[BaseException], match: str,
    tmp_path: Path, copy_of: Callable[[Path], Path], folder: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    source = copy_of(folder)
    name = "out.gguf" if form == "gguf" else "out"
    path = tmp_path / "place" / name
    path.parent.mkdir()
    if where == "file":
        path.write_text("a file of mine")
    elif where == "folder":
        path.mkdir()
        (path / "mine.txt").write_text("mine")
    elif where == "no-parent":
        path = tmp_path / "missing" / name
    elif where == "source":
        path = source
    elif where == "inside-source":
        path = source / name
    elif where == "holds-source":
        path = tmp_path
    elif where == "link-source":
        path.symlink_to(source)
    elif where == "empty":
        monkeypatch.chdir(tmp_path / "place")
        path = Path("")
    elif where == "proc":
        path = Path("/proc") / name
    model = llama("deci" if form == "deci" else "uniform")
    watched = (source, path) if where not in ("empty", "proc") else (source, tmp_path / "place")
    refused(lambda: _export_to(model, form, path, source), error, match, model=model,
            paths=watched)  # fmt: skip


# --- writes that fail half way ----------------------------------------------------------------


@pytest.mark.parametrize("form", ["hf", "deci", "gguf"])
@pytest.mark.parametrize("fault", [OSError("No space left on device"), KeyboardInterrupt()],
                         ids=["oserror", "interrupt"])  # fmt: skip
def test_a_write_that_fails_half_way_leaves_the_old_output(
    form: str, fault: BaseException, tmp_path: Path, folder: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    path = tmp_path / ("out.gguf" if form == "gguf" else "out")
    if form == "gguf":
        path.write_bytes(b"an old file")
    else:
        path.mkdir()  # an earlier model folder, replaced whole
        (path / "config.json").write_text("{}")
        (path / "old.txt").write_text("old")
    if form == "gguf":
        import gguf

        def half(self: Any, *args: Any, **kwargs: Any) -> None:
            raise fault

        monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", half)
    else:

        def half_weights(model: nn.Module, target: Path, dtype: Any) -> None:
            (target / "model.safetensors").write_bytes(b"half")
            raise fault

        monkeypatch.setattr(hf_writer, "save_weights", half_weights)
        monkeypatch.setattr("prunekit.export.deci.save_weights", half_weights)
    model = llama("deci" if form == "deci" else "uniform")
    refused(lambda: export(model, path, form, source=folder, verify=False), type(fault), "",
            model=model, paths=(path, folder))  # fmt: skip


def test_a_failed_check_leaves_nothing(
    tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def wrong(*args: Any) -> torch.Tensor:
        return torch.zeros(1, 10, 300)

    monkeypatch.setattr(hf_writer, "loaded_output", wrong)
    model = llama("uniform")
    refused(lambda: export(model, tmp_path / "out", "hf", source=folder, example_inputs=IDS),
            RuntimeError, r"differ", model=model, paths=(tmp_path, folder))  # fmt: skip


# --- sources of the tokenizer, damaged or odd -------------------------------------------------


def test_a_damaged_gguf_source_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF" + b"\x00" * 20)
    model = llama("uniform")
    refused(lambda: export(model, tmp_path / "out", "hf", source=source, verify=False),
            ValueError, r"source=.*model\.gguf", model=model, paths=(tmp_path,))  # fmt: skip


def test_a_sharded_source_lends_no_index(tmp_path: Path, sharded: Path) -> None:
    """The sharded source's index must not come along: it would name shards the output does
    not have, and from_pretrained reads the index first."""
    model = llama("uniform")
    out = tmp_path / "out"
    export(model, out, "hf", source=sharded, verify=False)
    assert not list(out.glob("*.index.json"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert torch.equal(logits(loaded), logits(model))


def test_extra_files_of_the_source_do_not_shadow_the_weights(
    tmp_path: Path, copy_of: Callable[[Path], Path]
) -> None:
    source = copy_of(tmp_path.parent / "x") if False else None
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 999}))
    (source / "pytorch_model.bin").write_bytes(b"stale weights")
    (source / "notes").mkdir()
    (source / "notes" / "readme.txt").write_text("kept")
    model = llama("uniform")
    out = tmp_path / "out"
    export(model, out, "hf", source=source, verify=False)
    assert not (out / "pytorch_model.bin").exists()
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 32
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert torch.equal(logits(loaded), logits(model))


# --- successes: right, repeatable, and the model untouched -----------------------------------


@pytest.mark.parametrize("form", ["hf", "deci", "gguf"])
def test_a_success_changes_no_model_and_a_repeat_writes_the_same(
    form: str, tmp_path: Path, folder: Path
) -> None:
    model = llama("deci" if form == "deci" else "uniform")
    model.train()  # a mode the writer must give back
    before = unchanged(model)
    path = tmp_path / ("out.gguf" if form == "gguf" else "out")
    first = export(model, path, form, source=folder, verify=form == "gguf")
    written = tree(path)
    assert unchanged(model) == before
    second = export(model, path, form, source=folder, verify=form == "gguf")
    assert tree(path) == written and first.files == second.files
    assert unchanged(model) == before


def test_hf_in_float16_loads_as_the_rounded_model(tmp_path: Path, folder: Path) -> None:
    model = llama("per-layer")
    out = tmp_path / "out"
    export(model, out, "hf", source=folder, dtype="float16", verify=False)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=True, dtype=torch.float32
    ).eval()
    rounded = hf_writer.rounded_copy(model, torch.float16)
    assert torch.allclose(logits(loaded), logits(rounded), atol=1e-5, rtol=1e-5)
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float32


def test_a_model_with_blocks_removed_exports_right(tmp_path: Path, folder: Path) -> None:
    model = llama("uniform")
    prunekit.skip_blocks(model, [1])
    prunekit.remove_blocks(model)
    out = tmp_path / "out.gguf"
    report = export(model, out, "gguf", source=folder, example_inputs=IDS)
    assert report.difference is not None and report.difference < 1e-4
    hf = tmp_path / "hf"
    export(model, hf, "hf", source=folder, verify=False)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    assert loaded.config.num_hidden_layers == 2
    assert torch.equal(logits(loaded), logits(model))


def test_onnx_of_a_plain_network_is_checked(tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    net.eval()
    before = unchanged(net)
    path = tmp_path / "net.onnx"
    report = export(net, path, "onnx", example_inputs=torch.randn(2, 3, 8, 8))
    assert path.is_file() and unchanged(net) == before
    if report.verified_by is not None:
        assert report.difference is not None and report.difference <= 1e-4
    hidden = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert hidden == []


def test_a_symlinked_destination_is_replaced_at_its_target(tmp_path: Path, folder: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()  # an earlier model folder
    (real / "config.json").write_text("{}")
    (real / "old.txt").write_text("old")
    link = tmp_path / "link"
    os.symlink(real, link)
    model = llama("uniform")
    export(model, link, "hf", source=folder, verify=False)
    assert link.is_symlink() and (real / "config.json").is_file()
    assert not (real / "old.txt").exists()
    shutil.rmtree(real)


def test_a_model_of_values_not_ids_takes_its_own_example_inputs(tmp_path: Path) -> None:
    """The token-id check is for models whose main input is input_ids: pixel values pass."""
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=32)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.ViTModel(config).eval()
    pixels = torch.randn(1, 3, 8, 8)
    export(model, tmp_path / "vit", "hf", example_inputs=pixels, verify=False)
    loaded = transformers.ViTModel.from_pretrained(tmp_path / "vit").eval()
    with torch.no_grad():
        assert torch.equal(loaded(pixels).last_hidden_state, model(pixels).last_hidden_state)
    refused(lambda: export(model, tmp_path / "vit2", "hf",
                           example_inputs=torch.full((1, 3, 8, 8), math.nan), verify=False),
            ValueError, r"example_inputs is holding NaN or inf", model=model,
            paths=(tmp_path,))  # fmt: skip


# --- half-precision models and what llama.cpp loads -------------------------------------------


@pytest.mark.parametrize(("half", "dtype"), [(torch.bfloat16, None), (torch.float16, "float32")],
                         ids=["bfloat16-own", "float16-as-float32"])  # fmt: skip
def test_hf_of_a_half_model_is_checked_as_its_weights_compute(
    half: torch.dtype, dtype: str | None, tmp_path: Path
) -> None:
    """The check loads the folder in float32: it must compare with the model's weights
    computing in float32, not with the model's half-precision arithmetic (which no float32
    folder reproduces, so every half model was refused)."""
    model = llama("uniform").to(half)
    before = unchanged(model)
    out = tmp_path / "out"
    report = export(model, out, "hf", dtype=dtype, example_inputs=IDS)
    assert report.difference is not None and report.difference <= 1e-5
    assert unchanged(model) == before
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=True, dtype=torch.float32
    ).eval()
    wider = llama("uniform").to(half).float()  # the rotary buffer rounded too: not equal
    torch.testing.assert_close(logits(loaded), logits(wider), rtol=1e-5, atol=1e-5)


def _qwen2_heads_cut(budget: bool) -> nn.Module:
    config = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      vocab_size=300, max_position_embeddings=128)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    if budget:
        prunekit.prune_channels(model, IDS, budget=prunekit.Budget(params=0.3))
        with pytest.warns(UserWarning):
            prunekit.compact(model, IDS, latency_runs=0)
    else:
        prunekit.prune_channels(model, IDS, heads=0.5)
        prunekit.compact(model, IDS, latency_runs=0)
    assert model.model.layers[0].self_attn.q_proj.bias.numel() < 32  # query heads were cut
    return model


@pytest.mark.parametrize("budget", [False, True], ids=["uniform", "per-layer"])
def test_gguf_refuses_a_query_bias_llama_cpp_cannot_load(
    budget: bool, tmp_path: Path, folder: Path
) -> None:
    """llama.cpp's llama and deci architectures read attn_q.bias as {n_embd} (the hidden
    width): a query bias of the heads left after a cut fails its load ("wrong shape"), and
    no logits are compared here without llama_cpp to see it."""
    model = _qwen2_heads_cut(budget)
    refused(lambda: export(model, tmp_path / "out.gguf", "gguf", source=folder), ValueError,
            r"model\.layers\.0\.self_attn\.q_proj\.bias has 1?\d entries.*hidden width 32"
            r".*format='hf'", model=model, paths=(tmp_path, folder))  # fmt: skip


def _half_cnn(dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    return net.eval().to(dtype), torch.randn(2, 3, 8, 8).to(dtype)


def test_onnx_of_a_float16_network_is_checked_at_half_precision(tmp_path: Path) -> None:
    """ONNX Runtime and torch round a float16 graph's sums apart by a few of its ulps: the
    float32 tolerance (1e-4 of the largest output) refused every float16 network."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    net, pixels = _half_cnn(torch.float16)
    before = unchanged(net)
    path = tmp_path / "net.onnx"
    report = export(net, path, "onnx", example_inputs=pixels)
    assert report.difference is not None and report.difference <= 1e-2
    assert unchanged(net) == before
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (found,) = session.run(None, {"input": pixels.numpy()})
    assert found.dtype == np.float16 and found.shape == (2, 2)


def test_onnx_of_a_bfloat16_network_onnx_runtime_cannot_run_is_refused_by_name(
    tmp_path: Path,
) -> None:
    """ONNX Runtime's CPU kernels take no bfloat16: the check failed with its raw
    INVALID_GRAPH error after the tracing; now refused first, naming what runs."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    net, pixels = _half_cnn(torch.bfloat16)
    path = tmp_path / "net.onnx"
    refused(lambda: export(net, path, "onnx", example_inputs=pixels), ValueError,
            r"export\(format='onnx'\): model's 0\.weight is bfloat16.*ONNX Runtime.*"
            r"dtype='float32'.*verify=False", model=net, paths=(tmp_path,))  # fmt: skip
    export(net, path, "onnx", example_inputs=pixels, verify=False)
    assert path.is_file()


def test_gguf_f32_of_a_half_model_is_checked_as_its_weights_compute(
    tmp_path: Path, folder: Path
) -> None:
    """transformers' GGUF loader computes in float32: compared with the model's own bfloat16
    arithmetic, an f32 file of a bfloat16 model was refused (5e-3 against f32's 1e-4)."""
    model = llama("uniform").to(torch.bfloat16)
    before = unchanged(model)
    report = export(model, tmp_path / "out.gguf", "gguf", source=folder, dtype="f32")
    assert report.verified_by is not None and "transformers" in report.verified_by
    assert report.difference is not None and report.difference <= 1e-5
    assert unchanged(model) == before


def test_onnx_of_a_llama_from_a_batch_of_one_takes_any_batch(tmp_path: Path) -> None:
    """A Llama's code specializes a batch of 1 (torch.export's 0/1 rule): the graph came out
    with the batch fixed at 1, and the export was refused. Traced on the example repeated to
    a batch of 2, the file takes any batch, and is checked on the example as given."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    model = llama("uniform")
    before = unchanged(model)
    one = {"input_ids": IDS[:1]}
    path = tmp_path / "lm.onnx"
    report = export(model, path, "onnx", example_inputs=one)
    assert unchanged(model) == before
    assert report.difference is not None and report.difference <= 1e-4
    assert any(n.startswith("traced on a batch of 2 (the example's one repeated along axis 0 "
                            "of 'input_ids')") for n in report.notes), report.notes  # fmt: skip
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["batch", "sequence"]
    for ids in (IDS[:1], IDS[:1].repeat(3, 1).roll(1, dims=1)):
        (found,) = session.run(None, {"input_ids": ids.numpy()})
        expected = logits(model, ids)
        gap = float((expected - torch.from_numpy(found)).abs().max())
        assert gap <= 1e-4 * float(expected.abs().max())


class _OneRow(nn.Module):
    """A model whose code takes a batch of one row only (it flattens it into one Linear)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(x.reshape(4))
        return out


class _TwoRows(nn.Module):
    """A model whose code runs any batch, but tests for a batch of 2 (the size a batch of 1
    is traced on): the graph traced on 2 fixes the batch at 2."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(x)
        return out * 2 if x.shape[0] == 2 else out


def test_onnx_of_a_model_that_takes_one_row_keeps_the_batch_fixed(tmp_path: Path) -> None:
    """A batch of 1 is traced on 2 to stay dynamic; a model that takes no 2 rows is traced
    on its one, the axis fixed, and the report says so."""
    pytest.importorskip("onnxscript")
    report = export(_OneRow().eval(), tmp_path / "one.onnx", "onnx",
                    example_inputs=torch.randn(1, 4))  # fmt: skip
    assert report.difference is not None and report.difference <= 1e-4
    assert any("axis 0 (batch) of input 'x' is fixed at 1" in n for n in report.notes)


def test_onnx_refuses_a_batch_of_one_the_graph_fixes_at_two(tmp_path: Path) -> None:
    """The file traced on a batch of 2 would not take the example's 1: refused by name,
    before anything is written."""
    pytest.importorskip("onnxscript")
    model = _TwoRows().eval()
    path = tmp_path / "two.onnx"
    for verify in (True, False):
        refused(lambda v=verify: export(model, path, "onnx", example_inputs=torch.randn(1, 4),
                                        verify=v),
                ValueError, r"export\(format='onnx'\): traced on the example repeated to 2 "
                r"along axis 0 \(batch\) of input 'x'.*fixes that axis at 2.*would not take "
                r"the example's 1", model=model, paths=(tmp_path,))  # fmt: skip
    assert list(tmp_path.iterdir()) == []


class _TenTokens(nn.Module):
    """A model whose code needs exactly ten tokens (it flattens them into one Linear)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 4)
        self.head = nn.Linear(40, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).reshape(ids.shape[0], 40))


def test_onnx_of_a_model_that_needs_its_length_says_the_axis_is_fixed(tmp_path: Path) -> None:
    """A size the code needs (not a size of 1 it specializes) cannot be made dynamic by other
    inputs: it is written fixed, and the report says so, rather than refused."""
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = _TenTokens().eval()
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    report = export(model, tmp_path / "ten.onnx", "onnx", example_inputs=ids)
    assert report.difference is not None and report.difference <= 1e-4
    assert any("axis 1 (sequence) of input 'ids' is fixed at 10" in n for n in report.notes)


class _OneToken(nn.Module):
    """A model whose code takes exactly one token (it flattens it into one Linear)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).reshape(ids.shape[0], 4))


def test_onnx_of_a_model_that_takes_one_token_keeps_the_length_fixed(tmp_path: Path) -> None:
    """A sequence of 1 is traced on 2 tokens to stay dynamic; a model that takes no 2 is
    traced on its one, the axis fixed, and the report says so."""
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = _OneToken().eval()
    ids = torch.randint(0, 50, (2, 1), generator=torch.Generator().manual_seed(0))
    report = export(model, tmp_path / "one.onnx", "onnx", example_inputs=ids)
    assert report.difference is not None and report.difference <= 1e-4
    assert any("axis 1 (sequence) of input 'ids' is fixed at 1" in n for n in report.notes)
