"""Which entry point each hostile case exercises (by its test file), and the cases that broke
before their fixes, each with the bug it showed (kept: the tally at the end of a run prints
them, and a case listed here must pass now)."""

from __future__ import annotations

# test file -> the entry point its cases call
ENTRY_POINTS = {
    "test_export": "export",
    "test_shrink": "shrink / prunekit shrink",
    "test_streamed": "prune_streamed / prunekit prune",
    "test_damping": "prune_channels(damping='auto')",
    "test_depth": "blocks / load_compacted",
}

# a part of a case's id -> the bug it found (fixed since)
BROKE: dict[str, str] = {}


def entry_point(nodeid: str) -> str:
    """The entry point of the case `nodeid` (its test file's)."""
    name = nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return ENTRY_POINTS.get(name, name)
