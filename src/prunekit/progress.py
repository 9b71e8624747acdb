"""A dependency-free progress bar on stderr for long pruning runs."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``label [#####.....] done/total  elapsed`` redrawn in place; shown when `enabled`
    (None: when the stream is a terminal). Prints a final newline on close()."""

    def __init__(
        self, label: str, total: int, enabled: bool | None = None, stream: TextIO | None = None
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) if enabled is None else bool(enabled)
        self.label, self.total, self.done = label, max(total, 0), 0
        self.start = time.perf_counter()
        self._drawn = False

    def advance(self, steps: int = 1) -> None:
        self.done = min(self.total, self.done + steps)
        if self.enabled:
            self._draw()

    def _draw(self) -> None:
        width = 30
        filled = width * self.done // self.total if self.total else width
        bar = "#" * filled + "." * (width - filled)
        elapsed = time.perf_counter() - self.start
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {elapsed:6.1f}s")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
