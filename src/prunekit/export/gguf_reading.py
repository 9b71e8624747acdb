"""One ``gguf.GGUFReader`` of a GGUF file for the steps of one run that read it.

A reader parses every metadata field and tensor entry of its file when it is made; a
``prunekit shrink`` of a GGUF source looks at the file several times (the source check, its
storage and half type, the export's source check, its tokenizer, the types kept for
``gguf_type='source'``). Inside ``with shared():`` (the run), ``reader(path)`` gives the
reader made before for the same file, unchanged since (its device, inode, size and
modification time the same); a file replaced or written since is read again. Outside it,
each call makes a new reader, as ``gguf.GGUFReader`` would, and nothing is held after the
run (a reader maps its file).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from prunekit._extras import require

__all__ = ["reader", "shared"]

_Key = tuple[str, int, int, int, int]
_READERS: ContextVar[dict[_Key, Any] | None] = ContextVar("gguf_readers", default=None)


@contextmanager
def shared() -> Iterator[None]:
    """Within the block, ``reader`` gives one reader per unchanged file; they are let go
    when it ends (a block inside another shares the outer one's)."""
    if _READERS.get() is not None:
        yield
        return
    token = _READERS.set({})
    try:
        yield
    finally:
        _READERS.reset(token)


def reader(path: str | os.PathLike[str]) -> Any:
    """A ``gguf.GGUFReader`` of the GGUF file at `path`: inside ``shared()``, the one made
    before for this file if it has not changed since.

    Args:
        path: a GGUF file.

    Returns:
        The reader.

    Raises:
        ImportError: the ``gguf`` package is not installed.
        OSError, ValueError, ...: as ``gguf.GGUFReader`` raises them (no such file, not a
            GGUF file, one cut short); a failed read is never kept.
    """
    gguf = require("gguf", "llm", "reading a GGUF file")
    readers = _READERS.get()
    if readers is None:
        return gguf.GGUFReader(str(path))
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    found = readers.get(key)
    if found is None:
        found = gguf.GGUFReader(str(path))
        readers[key] = found
    return found
