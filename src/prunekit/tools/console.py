"""The terminal side of the command line: rich consoles, progress bars, safe text."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prunekit._extras import require

__all__ = ["consoles", "printable", "progress_bars"]


def consoles() -> tuple[Any, Any]:
    """Rich consoles for results (stdout) and progress (stderr)."""
    console_mod = require("rich.console", "cli", "the prunekit command")
    return console_mod.Console(), console_mod.Console(stderr=True)


@contextmanager
def progress_bars(console: Any) -> Iterator[Callable[[str, int, int], None]]:
    """A progress callback ``tick(label, done, total)`` drawing one rich bar per label.

    The bars appear at the first tick, so a call that fails its checks prints nothing.
    """
    progress_mod = require("rich.progress", "cli", "the prunekit command")
    bars = progress_mod.Progress(
        progress_mod.TextColumn("{task.description:<34}"),
        progress_mod.BarColumn(),
        progress_mod.MofNCompleteColumn(),
        progress_mod.TimeElapsedColumn(),
        console=console,
    )
    tasks: dict[str, Any] = {}

    def tick(label: str, done: int, total: int) -> None:
        if not tasks:
            bars.start()
        if label not in tasks:
            tasks[label] = bars.add_task(label, total=total)
        bars.update(tasks[label], completed=done)

    try:
        yield tick
    finally:
        if tasks:
            bars.stop()


def printable(text: str) -> str:
    """`text` with control characters (terminal escapes, newlines) shown as escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
