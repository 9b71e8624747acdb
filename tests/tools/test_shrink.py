"""prunekit shrink: from a Hugging Face folder (one file or shards) or a GGUF file to a smaller
model in a format that runs without prunekit, measured, with its report; every bad input
refused with a clear message and no output left behind."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import gguf_models, tiny_llm
from prunekit.export.api import WRITERS, ExportReport, Request
from prunekit.structure.measure import perplexity
from prunekit.tools.cli import main
from prunekit.tools.shrink import ShrinkConfig, shrink
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


@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_a_folder_shrinks_to_a_folder_transformers_loads(
    kind: str, folder: Path, sharded: Path, text: Path, tmp_path: Path
) -> None:
    needs("hf")
    source = folder if kind == "single" else sharded
    cfg = config(source, tmp_path / "out", text)
    report = shrink(cfg)
    out = tmp_path / "out"
    assert report.achieved >= 0.25 and report.target == ("params", 0.25)
    assert report.params.after < report.params.before and report.macs.after < report.macs.before
    assert report.bytes.before == sum(p.stat().st_size for p in source.glob("*.safetensors"))
    assert 0 < report.bytes.after < report.bytes.before
    assert (out / "report.json").is_file() and (out / "report.md").is_file()
    assert (out / "tokenizer.json").is_file()
    assert loaded_perplexity(out, cfg) == pytest.approx(report.perplexity.after, rel=1e-4)
    assert all(not p.name.startswith(".") for p in tmp_path.iterdir())  # no stage left


def test_a_gguf_file_shrinks(tmp_path: Path, text: Path) -> None:
    needs("hf")
    pytest.importorskip("gguf")
    source, _ = gguf_models.tiny_llama_gguf(tmp_path / "tiny.gguf")
    cfg = config(source, tmp_path / "out", text)
    report = shrink(cfg)
    assert report.bytes.before == source.stat().st_size
    assert loaded_perplexity(tmp_path / "out", cfg) == pytest.approx(
        report.perplexity.after, rel=1e-4
    )


def test_gguf_format_is_a_folder_of_the_file_and_the_report(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    needs("gguf")
    report = shrink(config(folder, tmp_path / "out", text, formats=("gguf",)))
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["model.gguf", "report.json", "report.md"]
    assert report.bytes.after == (tmp_path / "out" / "model.gguf").stat().st_size
    assert [r.path for r in report.exports] == ["model.gguf"]


def test_the_report_files_say_what_the_call_returned(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    needs("hf")
    report = shrink(config(folder, tmp_path / "out", text, distill=1.0))
    found = json.loads((tmp_path / "out" / "report.json").read_text())
    assert found == json.loads(report.to_json())
    assert found["target"] == {"measure": "params", "share": 0.25}
    assert found["calibration"] == {"windows": 8, "tokens": 32}
    assert found["evaluation"] == {"windows": 4, "tokens": 32}
    assert found["params"]["after"] < found["params"]["before"]
    assert found["distill_steps"] >= 1 and found["perplexity_pruned"] > 0
    assert [g["kind"] for g in found["groups"]] == ["channels", "heads", "channels", "heads"]
    assert found["text"]["evaluation"].startswith("the held-out end of")
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert f"| perplexity | {report.perplexity.before:.3f} | {report.perplexity.after:.3f} |" in (
        markdown
    )
    assert report.budget_table in markdown and "## Files" in markdown


def test_the_command_prints_the_budget_and_before_and_after(
    folder: Path, text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    needs("hf")
    out = tmp_path / "out"
    status = main(["shrink", str(folder), "-o", str(out), "--params", "0.25",
                   "--calibration", str(text), "--no-compensate", *FAST])  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0, printed
    for line in ("budget 25.0% of", "perplexity", "parameters", "MACs/token", "on disk",
                 "latency", f"Wrote to {out}"):  # fmt: skip
        assert line in printed
    assert json.loads((out / "report.json").read_text())["target"]["share"] == 0.25


def test_evaluation_text_of_its_own_and_jsonl_calibration(
    folder: Path, text: Path, tmp_path: Path
) -> None:
    needs("hf")
    lines = tmp_path / "cal.jsonl"
    lines.write_text("\n".join(json.dumps({"text": tiny_llm.TEXT * 5}) for _ in range(8)))
    report = shrink(config(folder, tmp_path / "out", lines, evaluation=text))
    assert report.text == (str(lines), str(text))
    assert report.calibration == (8, 32) and report.evaluation == (4, 32)


def test_an_existing_output_is_replaced_whole(folder: Path, text: Path, tmp_path: Path) -> None:
    needs("hf")
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    shrink(config(folder, out, text))
    assert not (out / "old.txt").exists() and (out / "report.json").is_file()


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
    assert not out.exists() or not any(out.iterdir())
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
    with pytest.raises(OSError, match="No space left"):
        shrink(config(folder, out, text))
    assert [p.name for p in out.iterdir()] == ["kept.txt"]
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
    ],
)
def test_config_is_checked_on_creation(
    options: dict[str, Any], message: str, folder: Path, text: Path
) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        config(folder, folder.parent / "out", text, **options)
