"""Saving a compacted model with its shapes, and rebuilding it from a freshly built one.

``save_compacted(model, folder)`` writes the weights (``compacted.safetensors`` where
safetensors is installed, else ``compacted.pt``) and ``compacted.json``: for every module
its class, the shape and dtype of each of its parameters and buffers, and its integer (and
tuple of integers) attributes, which fix its widths (in/out features, channels, groups,
num_features, normalized_shape, num_heads, head_dim, ...); and the model's Hugging Face
config where it has one. ``load_compacted(fresh, folder)`` gives a freshly built model of
the same code those shapes, attributes and config fields, loads the weights strictly and
checks that everything matches. Per-layer widths need no config field that can hold them.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from prunekit.core.transaction import transaction
from prunekit.io.atomic import atomic_path
from prunekit.io.checkpoint import load_pruned_state_dict
from prunekit.io.files import load_state_dict, save_state_dict
from prunekit.structure.graph import check_model
from prunekit.structure.rebuild import Layout, apply_layout, describe_module, verify

__all__ = ["MANIFEST", "load_compacted", "save_compacted"]

MANIFEST = "compacted.json"
FORMAT = "prunekit-compacted"
VERSION = 1


def save_compacted(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Write `model` (compacted, pruned or not) to the folder `path`, made if missing.

    The weights go to ``compacted.safetensors`` (or ``compacted.pt`` without safetensors)
    as ``model.state_dict()`` holds them (``<name>_orig`` and ``<name>_mask`` for tensors
    still masked); the shapes, attributes and config to ``compacted.json``. Both files are
    written atomically. Returns the folder.
    """
    check_model(model, "save_compacted")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"save_compacted: path={str(path)!r} is a file; expected a folder")
    folder.mkdir(parents=True, exist_ok=True)
    weights = "compacted.safetensors" if _has_safetensors() else "compacted.pt"
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "weights": weights,
        "model": type(model).__qualname__,
        "modules": {name: describe_module(m) for name, m in model.named_modules()},
        "config": _config_dict(model),
    }
    save_state_dict(model.state_dict(), folder / weights)
    with atomic_path(folder / MANIFEST) as temp, open(temp, "w", encoding="utf-8") as stream:
        json.dump(manifest, stream, indent=1)
    return folder


def load_compacted(model: nn.Module, path: str | os.PathLike[str]) -> nn.Module:
    """Rebuild into `model` (built fresh by the same code) what save_compacted wrote to `path`.

    Every module takes the saved shapes (its tensors replaced by new ones of those shapes,
    dtypes and devices kept), attributes and Hugging Face config fields; the weights are
    loaded strictly (tensors saved masked are pruned to the saved masks) and everything is
    checked against the file. On any error, naming the module, the tensor and both shapes
    where shapes differ, `model` is left exactly as it was. Returns `model`.
    """
    check_model(model, "load_compacted")
    folder = Path(path)
    manifest = _read_manifest(folder)
    state = load_state_dict(folder / _weights_name(folder, manifest))
    layout = Layout.plan(model, manifest["modules"], state, manifest.get("config"))
    with transaction(model, state=layout.configs()):
        apply_layout(model, layout)
        load_pruned_state_dict(model, state, strict=True)
        verify(model, layout, state)
    return model


def _has_safetensors() -> bool:
    return importlib.util.find_spec("safetensors") is not None


def _config_dict(model: nn.Module) -> dict[str, Any] | None:
    """The model's Hugging Face config as a JSON-ready dict (None for other models)."""
    config = getattr(model, "config", None)
    to_json = getattr(config, "to_json_string", None)
    if not callable(to_json):
        return None
    found: dict[str, Any] = json.loads(to_json(use_diff=False))
    return found


def _read_manifest(folder: Path) -> dict[str, Any]:
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
    if manifest.get("version") != VERSION or not isinstance(manifest.get("modules"), dict):
        raise ValueError(
            f"load_compacted: {where} has version {manifest.get('version')!r}; this prunekit "
            f"reads version {VERSION}"
        )
    return manifest


def _weights_name(folder: Path, manifest: dict[str, Any]) -> str:
    name = manifest.get("weights")
    if name not in ("compacted.safetensors", "compacted.pt") or not (folder / name).is_file():
        raise FileNotFoundError(
            f"load_compacted: the weights {name!r} named in {folder / MANIFEST} are not in "
            f"{folder}; expected the files save_compacted wrote together"
        )
    return str(name)
