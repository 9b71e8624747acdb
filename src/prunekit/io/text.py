"""Text to calibrate and evaluate language models on: read from a file, a folder of text
files or JSON lines, and cut into windows of token ids."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import Tensor

from prunekit.io.files import CheckpointError, open_regular

__all__ = ["TEXT_SUFFIXES", "read_texts", "windows"]

# the files of a folder that are read as text (others, such as images, are passed over)
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text", ".jsonl")


def read_texts(path: str | os.PathLike[str]) -> list[str]:
    """The passages of text at `path`, in order.

    Args:
        path: a text file (one passage), a ``.jsonl`` file (a passage per line: a JSON
            object with a string under ``"text"``), or a folder whose files ending in one of
            ``TEXT_SUFFIXES`` are read in the order of their names (subfolders too).

    Returns:
        The passages that hold more than white space.

    Raises:
        CheckpointError: no such file or folder, a file that is no regular file or cannot
            be read as UTF-8, a JSON line without a ``"text"`` string, or no text at all.
    """
    where = Path(path)
    if where.is_dir():
        files = sorted(
            p
            for p in where.rglob("*")
            if p.suffix.lower() in TEXT_SUFFIXES
            and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(where).parts)
        )
        texts = [text for file in files for text in _read_file(file)]
    else:
        texts = _read_file(where)
    texts = [text for text in texts if text.strip()]
    if not texts:
        raise CheckpointError(
            f"{where}: holds no text; expected a text file, a folder of text files "
            f"({', '.join(TEXT_SUFFIXES)}) or JSON lines with a 'text' field"
        )
    return texts


def _read_file(path: Path) -> list[str]:
    fd, _ = open_regular(path)
    with os.fdopen(fd, "rb") as stream:
        data = stream.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(
            f"{path}: is not UTF-8 text (byte {error.start}); expected a text file"
        ) from None
    if path.suffix.lower() != ".jsonl":
        return [text]
    return [
        _json_text(path, number, line)
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]


def _json_text(path: Path, number: int, line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}:{number}: is not JSON ({error.msg})") from None
    text = record.get("text") if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise CheckpointError(
            f"{path}:{number}: has no string under 'text'; expected one JSON object a line "
            'such as {"text": "..."}'
        )
    return text


def windows(ids: Tensor, length: int, count: int) -> list[Tensor]:
    """Up to `count` windows of `length` token ids from the 1-D `ids`, side by side from its
    start (they never overlap); fewer where `ids` is shorter, and none where it holds fewer
    than `length`.

    Args:
        ids: token ids, one dimension.
        length: tokens per window, >= 1.
        count: windows wanted, >= 0.

    Returns:
        The windows, each a view of `ids`.
    """
    whole = min(count, len(ids) // length)
    return list(torch.split(ids[: whole * length], length)) if whole else []
