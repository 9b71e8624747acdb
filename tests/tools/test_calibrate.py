"""prunekit.tools.calibrate: `prunekit shrink SRC --streamed` writes what `prunekit shrink SRC`
writes for the hf format (the same widths, the same weights to float rounding), holding one
block at a time; options it does not stream are refused before anything is written."""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

import pytest
import torch

from helpers import tiny_llm
from prunekit.tools.calibrate import shrink_folder
from prunekit.tools.cli import main
from prunekit.tools.shrink import ShrinkConfig, shrink

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

# no --latency-runs: --streamed times nothing, and refuses it (test_streamed_flags_edges)
FAST = ["--calibration-tokens", "256", "--eval-tokens", "128", "--length", "32"]


def test_streamed_shrink_writes_what_shrink_writes(tmp_path: Path) -> None:
    folder = tiny_llm.save_folder(tmp_path / "model", sharded=True)
    text = tiny_llm.text_file(tmp_path / "text.txt")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        status = main(["shrink", str(folder), "-o", str(tmp_path / "streamed"), "--params",
                       "0.25", "--calibration", str(text), "--streamed", *FAST])  # fmt: skip
        # floor 0: the streamed budget is allocated block by block, without one
        config = ShrinkConfig(folder, tmp_path / "memory", params=0.25, calibration=text,
                              calibration_tokens=256, evaluation_tokens=128, length=32,
                              latency_runs=1, floor=0.0)  # fmt: skip
        shrink(config)
    assert status == 0
    assert "blocks streamed" in printed.getvalue() and "budget 25.0%" in printed.getvalue()
    load = transformers.AutoModelForCausalLM.from_pretrained
    streamed = load(tmp_path / "streamed", trust_remote_code=True).state_dict()
    memory = load(tmp_path / "memory", trust_remote_code=True).state_dict()
    assert {k: v.shape for k, v in streamed.items()} == {k: v.shape for k, v in memory.items()}
    for name, tensor in streamed.items():
        torch.testing.assert_close(tensor, memory[name], rtol=1e-5, atol=1e-6, msg=name)
    widths = ("layer_intermediate_sizes", "layer_num_attention_heads")
    found = [json.loads((tmp_path / f / "config.json").read_text()) for f in ("streamed", "memory")]
    assert [found[0].get(k) for k in widths] == [found[1].get(k) for k in widths]


def test_options_it_does_not_stream_are_refused(tmp_path: Path) -> None:
    folder = tiny_llm.save_folder(tmp_path / "model", sharded=True)
    single = tiny_llm.save_folder(tmp_path / "single")
    cases = [
        (ShrinkConfig(folder, tmp_path / "out", params=0.2, formats=("gguf",)), "--format hf"),
        (ShrinkConfig(folder, tmp_path / "out", params=0.2, distill=1.0), "--distill 0"),
        (ShrinkConfig(folder, tmp_path / "out", macs=0.2), "expected --params S"),
        (ShrinkConfig(folder, tmp_path / "out", params=0.2, criterion="taylor"), "taylor"),
        (
            ShrinkConfig(folder, tmp_path / "out", params=0.2, evaluation=("a b", "c d")),
            r"expected no --eval, got --eval \(2 passages\)",
        ),
        (ShrinkConfig(single, tmp_path / "out", params=0.2), "model.safetensors.index.json"),
        # nothing is timed nor drawn at random block by block: given, even at their
        # defaults, they would be ignored
        (ShrinkConfig(folder, tmp_path / "out", params=0.2, seed=0),
         "draws nothing at random .*; expected no --seed, got --seed 0"),
        (ShrinkConfig(folder, tmp_path / "out", params=0.2, latency_runs=5),
         "measures no latency; expected no --latency-runs, got --latency-runs 5"),
    ]  # fmt: skip
    for config, words in cases:
        with pytest.raises(Exception, match=words) as found:
            shrink_folder(config)
        assert isinstance(found.value, ValueError | OSError)
    assert not (tmp_path / "out").exists()
