"""prunekit.io.text: text read from a file, a folder of text files or JSON lines, and cut
into windows of token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from prunekit.io.files import CheckpointError
from prunekit.io.text import read_texts, windows


def test_a_file_is_one_passage(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\n", encoding="utf-8")
    assert read_texts(tmp_path / "a.txt") == ["one\ntwo\n"]


def test_json_lines_give_their_text_fields_in_order(tmp_path: Path) -> None:
    lines = [json.dumps({"text": t, "id": i}) for i, t in enumerate(["first", "é second"])]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    assert read_texts(tmp_path / "a.jsonl") == ["first", "é second"]


def test_a_folder_gives_its_text_files_by_name_and_passes_over_the_rest(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("bee")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("sea")
    (tmp_path / "a.txt").write_text("ay")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / ".hidden.txt").write_text("hidden")
    (tmp_path / "empty.txt").write_text("  \n")
    assert read_texts(tmp_path) == ["ay", "bee", "sea"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.txt", None, r"missing\.txt: no such file"),
        ("latin.txt", b"caf\xe9", r"latin\.txt: is not UTF-8 text \(byte 3\)"),
        ("bad.jsonl", b'{"text": "ok"}\n{"text": ', r"bad\.jsonl:2: is not JSON"),
        ("list.jsonl", b'["text"]\n', r"list\.jsonl:1: has no string under 'text'"),
        ("blank.txt", b" \n\t", r"blank\.txt: holds no text; expected a text file"),
    ],
)
def test_text_it_cannot_read_is_refused_with_the_file_and_line(
    tmp_path: Path, name: str, content: bytes | None, message: str
) -> None:
    if content is not None:
        (tmp_path / name).write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        read_texts(tmp_path / name)


def test_an_empty_folder_holds_no_text(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="holds no text"):
        read_texts(tmp_path)


def test_windows_sit_side_by_side_and_never_run_past_the_end() -> None:
    ids = torch.arange(10)
    assert [w.tolist() for w in windows(ids, 4, 5)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [w.tolist() for w in windows(ids, 4, 1)] == [[0, 1, 2, 3]]
    assert windows(ids, 11, 3) == [] and windows(ids, 2, 0) == []
