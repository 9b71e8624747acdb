"""Hostile calls of prunekit.tools.shrink (ShrinkConfig, shrink) and of the `prunekit shrink`
command: every refusal names the bad argument or file and leaves the source's files and the
output location as they were (no partial output, no stage beside it); a success writes a
model that loads and computes what the report says, the same on a repeat."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hostile.support import refused, tree
from prunekit.io.files import CheckpointError
from prunekit.tools.cli import main
from prunekit.tools.shrink import ShrinkConfig, shrink

FAST: dict[str, Any] = dict(calibration_tokens=128, evaluation_tokens=64, length=32,
                            latency_runs=1)  # fmt: skip


def config(source: Path, out: Path, text: Path | None, **options: Any) -> ShrinkConfig:
    return ShrinkConfig(source, out, **{"params": 0.25, "calibration": text, **FAST, **options})


# --- the config, checked on creation ----------------------------------------------------------

BAD_CONFIG: list[tuple[str, dict[str, Any], str]] = [
    ("params-str", {"params": "0.25"}, r"params='0\.25'"),
    ("params-bool", {"params": True}, r"params=True"),
    ("params-nan", {"params": math.nan}, r"params=nan"),
    ("params-inf", {"params": math.inf}, r"params=inf"),
    ("params-complex", {"params": 0.25j}, r"params=0\.25j"),
    ("params-zero", {"params": 0.0}, r"params=0\.0"),
    ("params-one", {"params": 1.0}, r"params=1\.0"),
    ("params-negative", {"params": -0.1}, r"params=-0\.1"),
    ("macs-and-params", {"macs": 0.2}, r"exactly one"),
    ("latency-nan", {"params": None, "latency": math.nan}, r"latency=nan"),
    ("length-float", {"length": 32.5}, r"length=32\.5"),
    ("length-bool", {"length": True}, r"length=True"),
    ("length-one", {"length": 1}, r"length=1"),
    ("seed-negative", {"seed": -1}, r"seed=-1"),
    ("seed-float", {"seed": 1.5}, r"seed=1\.5"),
    ("latency-runs-zero", {"latency_runs": 0}, r"latency_runs=0"),
    ("lr-nan", {"lr": math.nan}, r"lr=nan"),
    ("lr-zero", {"lr": 0.0}, r"lr=0\.0"),
    ("distill-negative", {"distill": -1.0}, r"distill=-1\.0"),
    ("distill-bool", {"distill": True}, r"distill=True"),
    ("distill-nan", {"distill": math.nan}, r"distill=nan"),
    ("round-to-bool", {"round_to": True}, r"round_to=True"),
    ("round-to-float", {"round_to": 2.5}, r"round_to=2\.5"),
    ("calibration-tokens-short", {"calibration_tokens": 16}, r"calibration_tokens=16"),
    ("evaluation-tokens-bool", {"evaluation_tokens": True}, r"evaluation_tokens=True"),
    ("formats-str", {"formats": "hf"}, r"formats='hf'"),
    ("formats-twice", {"formats": ("hf", "hf")}, r"formats=\('hf', 'hf'\)"),
    ("formats-upper", {"formats": ("HF",)}, r"formats=\('HF',\)"),
    ("formats-empty", {"formats": ()}, r"formats=\(\)"),
    ("kinds-bogus", {"kinds": ("bogus",)}, r"kinds"),
    ("kinds-str", {"kinds": "channels"}, r"kinds='channels'"),
    ("kinds-empty", {"kinds": ()}, r"kinds=\(\)"),
    ("calibration-empty", {"calibration": ()}, r"calibration=\(\)"),
    ("calibration-bytes", {"calibration": b"text"}, r"calibration=b'text'"),
    ("calibration-ints", {"calibration": [1, 2]}, r"calibration=\[1, 2\]"),
    ("calibration-blank", {"calibration": ("",)}, r"calibration=\(''"),
    ("evaluation-int", {"evaluation": 3}, r"evaluation=3"),
    ("source-none", {"source": None}, r"source=None"),
    ("out-int", {"out": 3}, r"out=3"),
    ("compensate-str", {"compensate": "yes"}, r"compensate='yes'"),
    ("compensate-int", {"compensate": 1}, r"compensate=1"),
    ("criterion-none", {"criterion": None}, r"criterion=None"),
    ("criterion-upper", {"criterion": "TAYLOR"}, r"criterion='TAYLOR'"),
    ("deci-round-8", {"formats": ("deci",), "round_to": 8}, r"round_to=8"),
    ("deci-heads", {"formats": ("deci",), "kinds": ("heads",)}, r"kinds=\('heads',\)"),
    ("dtype-unknown", {"dtype": "float64"}, r"dtype='float64'; expected one of 'auto'"),
    ("dtype-torch", {"dtype": torch.bfloat16}, r"dtype=torch\.bfloat16; expected .*\(by name"),
    ("dtype-upper", {"dtype": "BF16"}, r"dtype='BF16'"),
    ("dtype-none", {"dtype": None}, r"dtype=None"),
    ("dtype-half-onnx", {"dtype": "bfloat16", "formats": ("onnx",)},
     r"dtype='bfloat16' with formats=\('onnx',\).* float32"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "options", "match"), BAD_CONFIG,
                         ids=[c[0] for c in BAD_CONFIG])  # fmt: skip
def test_a_bad_config_is_named_on_creation(
    case: str, options: dict[str, Any], match: str, folder: Path, text: Path, tmp_path: Path
) -> None:
    arguments = {"source": folder, "out": tmp_path / "out", "params": 0.25, "calibration": text,
                 **FAST, **options}  # fmt: skip
    refused(lambda: ShrinkConfig(**arguments), (TypeError, ValueError),
            rf"ShrinkConfig: .*{match}", paths=(tmp_path, folder))  # fmt: skip


# --- sources damaged, missing, or of another kind ---------------------------------------------


def _damage(source: Path, case: str) -> None:
    index = source / "model.safetensors.index.json"
    if case == "config-not-json":
        (source / "config.json").write_text("{not json")
    elif case == "config-a-list":
        (source / "config.json").write_text("[]")
    elif case == "config-no-model-type":
        values = json.loads((source / "config.json").read_text())
        del values["model_type"]
        (source / "config.json").write_text(json.dumps(values))
    elif case == "config-binary":
        (source / "config.json").write_bytes(b"\xff\xfe\x00garbage")
    elif case == "config-a-folder":
        (source / "config.json").unlink()
        (source / "config.json").mkdir()
    elif case == "index-not-json":
        index.write_text("{")
    elif case == "index-map-a-list":
        index.write_text(json.dumps({"metadata": {}, "weight_map": ["model-1.safetensors"]}))
    elif case == "index-map-not-str":
        index.write_text(json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": 3}}))
    elif case == "index-missing-shard":
        values = json.loads(index.read_text())
        first = next(iter(values["weight_map"]))
        values["weight_map"][first] = "model-99-of-99.safetensors"
        index.write_text(json.dumps(values))
    elif case == "index-escapes-folder":
        values = json.loads(index.read_text())
        first = next(iter(values["weight_map"]))
        values["weight_map"][first] = "../../etc/passwd"
        index.write_text(json.dumps(values))
    elif case == "shard-truncated":
        shard = sorted(source.glob("*.safetensors"))[0]
        shard.write_bytes(shard.read_bytes()[:100])
    elif case == "weights-truncated":
        weights = source / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-1000])
    elif case == "weights-empty":
        (source / "model.safetensors").write_bytes(b"")
    elif case == "tokenizer-garbage":
        (source / "tokenizer.json").write_text("{garbage")
        for name in ("tokenizer_config.json",):
            (source / name).unlink(missing_ok=True)


SOURCES = [
    ("config-not-json", "folder", CheckpointError, r"config\.json: is not valid JSON"),
    ("config-a-list", "folder", CheckpointError, r"config\.json: holds a JSON list"),
    ("config-no-model-type", "folder", CheckpointError, r"architecture None"),
    ("config-binary", "folder", CheckpointError, r"config\.json: is not valid JSON"),
    ("config-a-folder", "folder", CheckpointError, r"config\.json"),
    ("index-not-json", "sharded", CheckpointError,
     r"index\.json: (is not valid JSON|not an index of shards)"),
    ("index-map-a-list", "sharded", CheckpointError, r"index\.json.*weight_map"),
    ("index-map-not-str", "sharded", CheckpointError, r"index\.json: 'lm_head\.weight' is in 3"),
    ("index-missing-shard", "sharded", CheckpointError, r"model-99-of-99\.safetensors"),
    ("index-escapes-folder", "sharded", CheckpointError, r"passwd"),
    ("shard-truncated", "sharded", CheckpointError, r"safetensors"),
    ("weights-truncated", "folder", CheckpointError, r"model\.safetensors"),
    ("weights-empty", "folder", CheckpointError, r"model\.safetensors"),
    ("tokenizer-garbage", "folder", CheckpointError, r"tokenizer"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "kind", "error", "match"), SOURCES,
                         ids=[c[0] for c in SOURCES])  # fmt: skip
def test_a_damaged_source_is_refused_and_left_as_it_was(
    case: str, kind: str, error: type[BaseException], match: str, request: pytest.FixtureRequest,
    copy_of: Callable[[Path], Path], text: Path, tmp_path: Path,
) -> None:  # fmt: skip
    source = copy_of(request.getfixturevalue(kind))
    _damage(source, case)
    out = tmp_path / "out"
    refused(lambda: shrink(config(source, out, text)), error, match, paths=(source, out))


def test_a_truncated_gguf_source_is_refused(tmp_path: Path, text: Path) -> None:
    pytest.importorskip("gguf")
    from helpers import gguf_models

    source, _ = gguf_models.tiny_llama_gguf(tmp_path / "src" / "tiny.gguf")
    source.write_bytes(source.read_bytes()[:-4096])
    out = tmp_path / "out"
    refused(lambda: shrink(config(source, out, text)), CheckpointError, r"tiny\.gguf",
            paths=(source, out))  # fmt: skip


# --- outputs it cannot take -------------------------------------------------------------------

OUTPUTS = [
    ("out-is-a-file", CheckpointError, r"is a file; expected a folder"),
    ("out-is-the-source", CheckpointError, r"is, holds or lies inside the source"),
    ("out-inside-the-source", CheckpointError, r"is, holds or lies inside the source"),
    ("out-holds-the-source", CheckpointError, r"is, holds or lies inside the source"),
    ("out-links-to-the-source", CheckpointError, r"is, holds or lies inside the source"),
    ("out-no-parent", CheckpointError, r"does not exist"),
    ("out-other-files", CheckpointError, r"holds files but no report\.json"),
    ("out-not-writable", CheckpointError, r"/proc.*takes no new folder"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "error", "match"), OUTPUTS, ids=[c[0] for c in OUTPUTS])
def test_an_output_it_cannot_take_is_refused(
    case: str, error: type[BaseException], match: str, copy_of: Callable[[Path], Path],
    folder: Path, text: Path, tmp_path: Path,
) -> None:  # fmt: skip
    source = copy_of(folder)
    out = tmp_path / "place" / "out"
    out.parent.mkdir()
    if case == "out-is-a-file":
        out.write_text("a file of mine")
    elif case == "out-is-the-source":
        out = source
    elif case == "out-inside-the-source":
        out = source / "out"
    elif case == "out-holds-the-source":
        out = tmp_path
    elif case == "out-links-to-the-source":
        os.symlink(source, out)
    elif case == "out-no-parent":
        out = tmp_path / "missing" / "out"
    elif case == "out-other-files":
        out.mkdir()
        (out / "mine.txt").write_text("mine")
    elif case == "out-not-writable":
        out = Path("/proc/prunekit-out")
    watched = (source, out) if case != "out-not-writable" else (source,)
    refused(lambda: shrink(config(source, out, text)), error, match, paths=watched)


# --- text it cannot calibrate on --------------------------------------------------------------

TEXTS = [
    ("text-missing", "missing", CheckpointError, r"no such file"),
    ("text-empty-file", "", (CheckpointError, ValueError), r"empty\.txt|text"),
    ("text-binary", b"\xff\xfe\x00\x00", CheckpointError, r"empty\.txt"),
    ("text-a-folder-of-nothing", "folder", CheckpointError, r"text"),
    ("text-too-short", "Tiny.", ValueError, r"expected at least one window"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "content", "error", "match"), TEXTS,
                         ids=[c[0] for c in TEXTS])  # fmt: skip
def test_text_it_cannot_calibrate_on_is_refused(
    case: str, content: Any, error: type[BaseException], match: str, folder: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    calibration = tmp_path / "empty.txt"
    if content == "folder":
        calibration = tmp_path / "texts"
        calibration.mkdir()
    elif isinstance(content, bytes):
        calibration.write_bytes(content)
    elif content != "missing":
        calibration.write_text(content)
    out = tmp_path / "out"
    refused(lambda: shrink(config(folder, out, calibration)), error, match,
            paths=(folder, out, calibration))  # fmt: skip


# --- runs that fail late, and runs that succeed -----------------------------------------------


def test_a_target_the_constraints_cannot_meet_leaves_nothing(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    refused(lambda: shrink(config(folder, out, text, params=0.99, formats=("gguf",))),
            ValueError, r"cannot be met", paths=(folder, out))  # fmt: skip


def test_an_interrupt_mid_way_leaves_the_old_output(
    folder: Path, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted while pruning (the write stage's faults: export's own cases)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("{}")  # an earlier output of shrink
    (out / "model.gguf").write_bytes(b"the old model")

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("prunekit.tools.shrink.prune_channels", interrupted)
    refused(lambda: shrink(config(folder, out, text, formats=("gguf",))), KeyboardInterrupt,
            "", paths=(folder, out))  # fmt: skip


def test_a_repeated_shrink_writes_the_same_checked_model(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    """Twice into one output: the same file, and the logits of the file (computed from it as
    llama.cpp would) give the perplexity the report states."""
    pytest.importorskip("gguf")
    from helpers import gguf_models
    from prunekit.tools.shrink_source import check_source, load_source
    from prunekit.tools.shrink_steps import text_windows

    out = tmp_path / "out"
    source = tree(folder)
    cfg = config(folder, out, text, formats=("gguf",), kinds=("channels",),
                 calibration_tokens=64, evaluation_tokens=32)  # fmt: skip
    first = shrink(cfg)
    written = (out / "model.gguf").read_bytes()
    second = shrink(cfg)
    assert (out / "model.gguf").read_bytes() == written
    assert sorted(p.name for p in out.iterdir()) == ["model.gguf", "report.json", "report.md"]
    assert tree(folder) == source
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    model, tokenizer = load_source(check_source(folder))
    losses = []
    for window in text_windows(cfg, tokenizer, model).evaluation:
        logits = gguf_models.gguf_logits(out / "model.gguf", window[None])[0, :-1]
        losses.append(torch.nn.functional.cross_entropy(logits, window[1:]))
    found = math.exp(float(torch.stack(losses).mean()))
    for report in (first, second):
        assert report.achieved >= 0.25 and report.params.after < report.params.before
        assert report.exports[0].verified_by is not None
        assert found == pytest.approx(report.perplexity.after, rel=1e-3)


# --- the command ------------------------------------------------------------------------------

COMMANDS = [
    ("cli-params-nan", ["--params", "nan"], 1, r"params=nan"),
    ("cli-params-text", ["--params", "a quarter"], 2, r"invalid float value"),
    ("cli-round-to-zero", ["--params", "0.25", "--round-to", "0"], 1, r"round_to=0"),
    ("cli-format-unknown", ["--params", "0.25", "--format", "tflite"], 2, r"invalid format list"),
    ("cli-no-target", [], 2, r"one of the arguments"),
    ("cli-length-zero", ["--params", "0.25", "--length", "0"], 1, r"length=0"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "args", "status", "match"), COMMANDS,
                         ids=[c[0] for c in COMMANDS])  # fmt: skip
def test_the_command_refuses_with_a_message_and_no_output(
    case: str, args: list[str], status: int, match: str, folder: Path, text: Path,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "out"
    before = tree(folder, out)
    try:
        code = main(["shrink", str(folder), "-o", str(out), "--calibration", str(text), *args])
    except SystemExit as exited:
        code = exited.code
    error = capsys.readouterr().err
    assert code == status, error
    assert re.search(match, error), error
    assert tree(folder, out) == before


# --- sources that are outputs already ---------------------------------------------------------


@pytest.mark.parametrize(("form", "kind"), [("hf", "pruned_llama"), ("deci", "nemotron-nas")])
def test_a_pruned_export_as_source_is_refused_by_name(
    form: str, kind: str, folder: Path, text: Path, tmp_path: Path
) -> None:
    """A folder export wrote from a model whose layers differ (a modeling file of its own,
    or DeciLM's block_configs) is refused before anything is read: never loaded at the
    config's stock widths."""
    from hostile.support import llama
    from prunekit.export import export

    source = tmp_path / "src"
    export(llama("per-layer" if form == "hf" else "deci"), source, form, source=folder,
           verify=False)  # fmt: skip
    out = tmp_path / "out"
    refused(
        lambda: shrink(config(source, out, text)),
        CheckpointError,
        rf"architecture '{kind}' is not one prunekit shrink knows",
        paths=(source, out),
    )


def test_shrink_to_onnx_writes_a_graph_of_any_batch(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    """shrink traced its ONNX graph on one window (a batch of 1), which the Llama's code
    specializes: every `--format onnx` run failed at the export, after all the work."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    out = tmp_path / "out"
    report = shrink(config(folder, out, text, formats=("onnx",), kinds=("channels",)))
    assert report.exports[0].verified_by is not None
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = torch.randint(0, 300, (3, 7), generator=torch.Generator().manual_seed(0)).numpy()
    (logits,) = session.run(None, {"input_ids": ids})
    assert logits.shape == (3, 7, 300)


def test_shrink_of_a_bfloat16_source_writes_a_smaller_model(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    import transformers

    source = tmp_path / "bf16"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    model.save_pretrained(source)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (source / name).write_bytes((folder / name).read_bytes())
    report = shrink(config(source, tmp_path / "out", text, kinds=("channels",)))
    assert report.params.after < report.params.before
    assert report.bytes.after < report.bytes.before, report.storage
