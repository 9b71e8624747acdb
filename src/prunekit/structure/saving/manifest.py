"""compacted.json, the shapes file of save_compacted: reading it and checking its structure
field by field, so a damaged file is refused with the field that is wrong.

Top level: ``format`` (``"prunekit-compacted"``), ``version`` (the int 1), ``weights`` (a
file name), ``model`` (the class name), ``modules`` (a mapping of module path to entry) and
``config`` (a mapping, or null for a model without a Hugging Face config).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from prunekit.structure.compaction.fromconfig import EMBED_SCALES

__all__ = ["FORMAT", "MANIFEST", "VERSION", "read_manifest"]

MANIFEST = "compacted.json"
FORMAT = "prunekit-compacted"
VERSION = 1

# each top-level field: its type(s) and what the message says is expected
_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "version": ((int,), f"the int {VERSION}"),
    "weights": ((str,), "a str, the name of the weights file"),
    "model": ((str,), "a str, the saved model's class name"),
    "modules": ((dict,), "a mapping of module paths to their entries"),
    "config": ((dict, type(None)), "a mapping or null"),
}


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of `folder`, its structure checked.

    Raises:
        FileNotFoundError: the folder has no compacted.json.
        ValueError: naming the field that is missing or malformed and what it should be.
    """
    where = folder / MANIFEST
    if not where.is_file():
        raise FileNotFoundError(
            f"load_compacted: {where} does not exist; expected a folder written by "
            "prunekit.save_compacted"
        )
    try:
        manifest = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"load_compacted: {where} is no valid JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(
            f"load_compacted: {where} is not a file of prunekit.save_compacted (no "
            f"'format': {FORMAT!r})"
        )
    for field, (kinds, expected) in _FIELDS.items():
        _check_field(manifest, field, kinds, expected, where)
    if manifest["version"] != VERSION:
        raise ValueError(
            f"load_compacted: {where} has version {manifest['version']!r}; this prunekit "
            f"reads version {VERSION}"
        )
    for path, entry in manifest["modules"].items():
        _check_entry(path, entry, where)
    return manifest


def _check_field(
    manifest: dict[str, Any], field: str, kinds: tuple[type, ...], expected: str, where: Path
) -> None:
    if field not in manifest:
        raise ValueError(f"load_compacted: {where} lacks {field!r}; expected {expected}")
    value = manifest[field]
    if isinstance(value, bool) or not isinstance(value, kinds):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise ValueError(
            f"load_compacted: {where}: {field!r} is {shown} of type {type(value).__name__}; "
            f"expected {expected}"
        )


_ENTRY = {"type": str, "tensors": dict, "attributes": dict}
_OPTIONAL = {"scales": dict}  # written only for a module that holds embedding scales
_TENSOR = {"shape": list, "dtype": str, "kind": str, "persistent": bool}


def _entry_problem(entry: Any) -> str | None:
    """What is wrong with the form of one module's entry, or None."""
    if not isinstance(entry, dict):
        return f"is not a mapping (it is a {type(entry).__name__})"
    if not set(_ENTRY) <= set(entry) <= {*_ENTRY, *_OPTIONAL}:
        return f"is not a mapping of exactly {sorted(_ENTRY)} (and 'scales' optionally)"
    kinds = {**_ENTRY, **_OPTIONAL}
    wrong = [k for k in entry if not isinstance(entry[k], kinds[k])]
    if wrong:
        return f"has {wrong[0]!r} of the wrong type"
    for name, tensor in entry["tensors"].items():
        if not isinstance(tensor, dict) or set(tensor) != set(_TENSOR) or not all(
            isinstance(tensor[k], kind) for k, kind in _TENSOR.items()
        ) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                     for n in tensor["shape"]) or tensor["kind"] not in (
            "parameter", "buffer"):  # fmt: skip
            return f"describes tensor {name!r} as {tensor!r}"
    return None


def _check_entry(path: str, entry: Any, where: Path) -> None:
    """Raise unless `entry` has the form describe_module writes (keys, types of values)."""
    problem = _entry_problem(entry)
    if problem is not None:
        raise ValueError(
            f"load_compacted: {where}: module {path!r} {problem}; expected what "
            "save_compacted writes: {'type': str, 'tensors': {name: {'shape': [ints >= 0], "
            "'dtype': str, 'kind': 'parameter'|'buffer', 'persistent': bool}}, "
            "'attributes': {name: int or list of ints or {'tuple': list of ints}}, "
            "optionally 'scales': {name: float}}"
        )
    for key, value in entry.get("scales", {}).items():
        if key not in EMBED_SCALES or type(value) is not float or not math.isfinite(value):
            raise ValueError(
                f"load_compacted: {where}: module {path!r} has the embedding scale "
                f"{key!r}: {value!r}; expected a finite float under one of {list(EMBED_SCALES)}"
            )
