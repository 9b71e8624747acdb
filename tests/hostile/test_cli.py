"""Hostile runs of the prunekit command as a user types it (``main(argv)``): an output that
is, holds or lies inside the input, options the chosen method would read and ignore; each
refusal exits with status 1, names the option and its value, and leaves the input and the
output location as they were."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hostile.support import tree
from prunekit.tools.cli import main

pytest.importorskip("transformers")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exited:  # argparse's own exits
        code = exited.code if isinstance(exited.code, int) else 1
    return code, capsys.readouterr().err


# --- an output over the input ------------------------------------------------------------------

PLACES = ["is", "inside", "holds", "links-to"]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_a_model_folders_output_may_not_overlap_it(
    kind: str, place: str, folder: Path, sharded: Path, copy_of: Callable[[Path], Path],
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A model folder with one weights file was pruned into a folder inside it (the input
    changed: a new folder in it) or into the folder holding it (that whole folder copied
    and swapped for a new one, the input moved meanwhile); the sharded path refused both."""
    source = copy_of(folder if kind == "single" else sharded)
    out = {
        "is": source,
        "inside": source / "pruned",
        "holds": tmp_path,
        "links-to": tmp_path / "link",
    }[place]
    if place == "links-to":
        out.symlink_to(source)
    before = tree(source, out)
    code, error = _run(["prune", str(source), "-o", str(out), "--amount", "0.5"], capsys)
    assert code == 1, error
    assert "is, holds or lies inside the input folder" in error, error
    assert str(out) in error, error
    assert tree(source, out) == before


# --- options the method would ignore -----------------------------------------------------------

IGNORED = [
    ("window-l1", ["--method", "l1", "--window", "8"], r"--window 8 .*got --method l1"),
    ("windows-random", ["--method", "random", "--windows", "2"],
     r"--windows 2 .*got --method random"),
    ("window-ln", ["--method", "ln", "--window", "64", "--windows", "1"],
     r"--window 64, --windows 1 .*got --method ln"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "args", "match"), IGNORED, ids=[c[0] for c in IGNORED])
@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_a_calibration_option_of_a_method_without_calibration_is_refused(
    case: str, args: list[str], match: str, kind: str, folder: Path, sharded: Path,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """--window and --windows size the calibration text's windows of wanda and sparsegpt;
    with l1, random or ln they were read and silently ignored (the run the same)."""
    source = folder if kind == "single" else sharded
    out = tmp_path / "out"
    before = tree(source, out)
    code, error = _run(["prune", str(source), "-o", str(out), "--amount", "0.5", *args], capsys)
    assert code == 1, error
    assert re.search(match, error), error
    assert "wanda or sparsegpt" in error, error
    assert tree(source, out) == before


def test_the_calibration_options_still_size_the_windows(
    sharded: Path, text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the refusal above must leave: with wanda, --window and --windows are read (2
    windows taken of 16 tokens), and their defaults apply when they are not given."""
    out = tmp_path / "out"
    argv = ["prune", str(sharded), "-o", str(out), "--amount", "0.5", "--method", "wanda",
            "--calibration", str(text)]  # fmt: skip
    code, error = _run([*argv, "--window", "16", "--windows", "2"], capsys)
    assert code == 0, error
    code, error = _run([*argv, "--window", "0"], capsys)
    assert code == 1 and "invalid --window 0" in error, error


# --- the demos' options ------------------------------------------------------------------------

DEMO = [
    ("distill-cnn", ["--distill", "5"], r"--distill 5\.0 is for --llm"),
    ("sparsity-llm", ["--llm", "--sparsity", "0.5"], r"--sparsity 0\.5 .*without --llm"),
    ("epochs-llm", ["--llm", "--epochs", "3", "--gradual-epochs", "0"],
     r"--epochs 3, --gradual-epochs 0 .*without --llm"),
    ("finetune-llm", ["--llm", "--finetune-epochs", "1"], r"--finetune-epochs 1 .*without --llm"),
    ("gradual-llm", ["--llm", "--gradual-sparsity", "0.9"],
     r"--gradual-sparsity 0\.9 .*without --llm"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "args", "match"), DEMO, ids=[c[0] for c in DEMO])
def test_a_demo_option_of_the_other_demo_is_refused(
    case: str, args: list[str], match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """--distill is the LLM demo's, the training and pruning steps the CNN demo's; each was
    read and silently ignored by the other demo (its run and output the same)."""
    import importlib.util

    monkeypatch.chdir(tmp_path)
    looked_up: list[str] = []  # refused before the model package or the digits are looked up
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: looked_up.append(name))
    code, error = _run(["demo", *args, "--out", str(tmp_path / "out")], capsys)
    assert code == 1, error
    assert re.search(match, error), error
    assert not looked_up and list(tmp_path.iterdir()) == []


# --- an output folder written before -----------------------------------------------------------


@pytest.mark.parametrize("first", ["sharded", "single"])
def test_a_model_folder_pruned_over_an_earlier_output_holds_only_the_new_weights(
    first: str, folder: Path, sharded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A single-file folder pruned into the output of a sharded one kept the old shards and
    their index beside the new model.safetensors: `prunekit report OUT` read the old
    weights (90 % zero) where from_pretrained loads the new ones (10 %)."""
    earlier, later = (sharded, folder) if first == "sharded" else (folder, sharded)
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    for source, amount, target in ((earlier, "0.9", out), (later, "0.1", out),
                                   (later, "0.1", fresh)):  # fmt: skip
        code, error = _run(["prune", str(source), "-o", str(target), "--amount", amount], capsys)
        assert code == 0, error
    written = {p.relative_to(out): p.read_bytes() for p in out.rglob("*")}
    assert written == {p.relative_to(fresh): p.read_bytes() for p in fresh.rglob("*")}


# --- a plot over the input ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["<weights>", "config.json", "plot.png"])
@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_a_plot_inside_the_model_folder_reported_is_refused(
    kind: str, name: str, folder: Path, sharded: Path, copy_of: Callable[[Path], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`prunekit report DIR --plot DIR/model.safetensors` wrote the PNG over the model's
    weights (or a shard, or its config), exit status 0: only a plot naming the input file
    itself was refused, never one inside the input folder."""
    source = copy_of(folder if kind == "single" else sharded)
    weights = "model.safetensors" if kind == "single" else "model-00001-of-00007.safetensors"
    plot = source / (weights if name == "<weights>" else name)
    before = tree(source)
    code, error = _run(["report", str(source), "--plot", str(plot)], capsys)
    assert code == 1, error
    assert f"{plot}: lies inside the input folder {source}" in error, error
    assert tree(source) == before
