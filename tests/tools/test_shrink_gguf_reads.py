"""prunekit shrink of a GGUF source reads the file's metadata and tensor table once: the
source check, its storage and half type, the export's source check, its tokenizer and the
types kept for gguf_type='source' each built a gguf.GGUFReader of the same file (a parse of
every field and tensor entry each time); one reader of the unchanged file serves them all,
and a file changed since is read again."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import gguf_models, tiny_llm
from prunekit.export import gguf_reading
from prunekit.tools.shrink import ShrinkConfig, shrink

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files prunekit's own code builds a gguf.GGUFReader of, one entry a reader."""
    opened: list[Path] = []
    real = gguf.GGUFReader

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        if f"{os.sep}prunekit{os.sep}" in caller:
            opened.append(Path(path).resolve())
        return real(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    return opened


def test_a_gguf_source_is_read_once_by_shrink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, _ = gguf_models.tiny_llama_gguf(tmp_path / "src" / "tiny.gguf", dtype="q8_0")
    text = tiny_llm.text_file(tmp_path / "text.txt")
    opened = _counted(monkeypatch)
    config = ShrinkConfig(source, tmp_path / "out", params=0.25, calibration=text,
                          calibration_tokens=256, evaluation_tokens=128, length=32,
                          latency_runs=1, formats=("hf", "gguf"), gguf_type="source")  # fmt: skip
    shrink(config)
    assert opened.count(source.resolve()) == 1, opened
    assert (tmp_path / "out" / "model.gguf").is_file()


def test_a_changed_file_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, _ = gguf_models.tiny_llama_gguf(tmp_path / "a" / "tiny.gguf", dtype="f32")
    second, _ = gguf_models.tiny_llama_gguf(tmp_path / "b" / "tiny.gguf", dtype="q8_0")
    opened = _counted(monkeypatch)
    with gguf_reading.shared():
        types = {t.name: t.tensor_type.name for t in gguf_reading.reader(first).tensors}
        assert gguf_reading.reader(first) is gguf_reading.reader(first)
        assert len(opened) == 1
        os.replace(second, first)  # another file at the same path
        changed = {t.name: t.tensor_type.name for t in gguf_reading.reader(first).tensors}
        assert len(opened) == 2
    assert types["blk.0.attn_q.weight"] == "F32" and changed["blk.0.attn_q.weight"] == "Q8_0"


def test_outside_a_run_each_read_is_a_new_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = gguf_models.tiny_llama_gguf(tmp_path / "tiny.gguf")
    opened = _counted(monkeypatch)
    with gguf_reading.shared():
        kept = gguf_reading.reader(path)
    assert gguf_reading.reader(path) is not kept  # nothing held after the run
    assert gguf_reading.reader(path) is not gguf_reading.reader(path)
    assert len(opened) == 4


def test_a_file_that_is_no_gguf_is_refused_and_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 12)
    with gguf_reading.shared():
        for _ in range(2):
            with pytest.raises((ValueError, OSError, IndexError, KeyError)):
                gguf_reading.reader(path)
