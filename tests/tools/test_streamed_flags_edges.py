"""`prunekit shrink SRC --streamed` refuses a flag it does not stream in the words of the
command line (the flag and its value, and what --streamed takes), not in those of the
library's ShrinkStreamedConfig, which the user never wrote; nothing is written. --eval is
refused (no perplexity is measured); --eval-tokens is taken, as it sizes the held-out end of
the calibration text, hence the calibration windows, as prunekit shrink's (test_calibrate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import tiny_llm
from prunekit.tools import cli_shrink
from prunekit.tools.cli import build_parser, main
from prunekit.tools.shrink import ShrinkConfig

pytest.importorskip("transformers")

REFUSED = [
    (["--macs", "0.2"], "expected --params S, got --macs 0.2"),
    (["--latency", "0.3"], "expected --params S, got --latency 0.3"),
    (["--params", "0.2", "--criterion", "taylor"],
     "expected --criterion activation, l1 or l2, got --criterion taylor"),
    (["--params", "0.2", "--criterion", "obs", "--no-compensate"],
     "expected --criterion activation, l1 or l2, got --criterion obs"),
    (["--params", "0.2", "--floor", "0.5"], "expected no --floor, got --floor 0.5"),
    (["--params", "0.2", "--floor", "auto"], "expected no --floor, got --floor auto"),
    (["--params", "0.2", "--floor", "0"], "expected no --floor, got --floor 0.0"),
    # refused before it is read: the file does not exist
    (["--params", "0.2", "--eval", "held.txt"], "expected no --eval, got --eval held.txt"),
    # nothing is timed nor drawn at random block by block: given, even at their defaults,
    # they would be ignored
    (["--params", "0.2", "--latency-runs", "3"],
     "measures no latency; expected no --latency-runs, got --latency-runs 3"),
    (["--params", "0.2", "--latency-runs", "5"],
     "expected no --latency-runs, got --latency-runs 5"),
    (["--params", "0.2", "--seed", "7"], "expected no --seed, got --seed 7"),
    (["--params", "0.2", "--seed", "0"], "expected no --seed, got --seed 0"),
    # each tensor is written in the type it is stored in
    (["--params", "0.2", "--dtype", "float32"], "expected --dtype auto, got --dtype float32"),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "words"), REFUSED)
def test_a_flag_it_does_not_stream_is_named_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    folder = tiny_llm.sharded_folder(tmp_path / "model")
    before = sorted(p.name for p in folder.iterdir())
    status = main(["shrink", str(folder), "-o", str(tmp_path / "out"), "--streamed", *flags])
    assert status == 1
    error = capsys.readouterr().err
    assert "prunekit shrink: error: --streamed" in error and words in error, error
    assert "ShrinkStreamedConfig" not in error and "Budget(" not in error
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in folder.iterdir()) == before


def test_latency_runs_and_seed_left_out_take_their_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not given, --latency-runs and --seed are None to the parser and to ShrinkConfig (so
    --streamed can tell them given), and 5 and 0 to the run, as --help shows."""
    made: list[ShrinkConfig] = []

    def caught(config: ShrinkConfig, progress: object = None) -> None:
        made.append(config)
        raise RuntimeError("stopped")

    monkeypatch.setattr(cli_shrink, "shrink", caught)
    folder = tiny_llm.sharded_folder(tmp_path / "model")
    base = ["shrink", str(folder), "-o", str(tmp_path / "out"), "--params", "0.2"]
    assert main(base) == 1
    assert main([*base, "--latency-runs", "3", "--seed", "7"]) == 1
    assert [(c.latency_runs, c.seed) for c in made] == [(None, None), (3, 7)]
    assert [(c.runs, c.run_seed) for c in made] == [(5, 0), (3, 7)]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["shrink", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "before against after (default 5)" in text and "random seed (default 0)" in text


def test_calibration_text_holding_the_output_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As prunekit shrink's (test_shrink): the output, replaced whole, lies inside the folder
    of texts, which the next run would read its report.md from."""
    folder = tiny_llm.sharded_folder(tmp_path / "model")
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "mine.txt").write_text(tiny_llm.TEXT * 20)
    out = texts / "out"
    argv = ["shrink", str(folder), "-o", str(out), "--streamed", "--params", "0.2"]
    assert main([*argv, "--calibration", str(texts)]) == 1
    error = capsys.readouterr().err
    assert f"{texts}: the calibration text is, holds or lies inside the output {out}" in error
    assert sorted(p.name for p in texts.iterdir()) == ["mine.txt"]
