"""The allocator's free pages given back to the system between the blocks of a long call."""

from __future__ import annotations

import ctypes.util
from typing import Any

__all__ = ["trim"]


def trim() -> None:
    """Give the allocator's free pages back to the system (glibc's ``malloc_trim``; elsewhere
    nothing): without it, glibc keeps some of each block's freed memory in its heaps (a
    freed tensor also raises its threshold for mapping the next ones apart), and a call that
    works block by block grows its peak by part of a block's work per block."""
    if not _LIBC:
        _LIBC.append(_libc())
    if _LIBC[0] is not None:
        _LIBC[0].malloc_trim(0)


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC: list[Any] = []  # the C library, once looked up (None: no malloc_trim)
