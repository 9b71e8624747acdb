"""Hugging Face model folders: where their weights are, the files beside the weights
(config, generation config, tokenizer, ...) that a pruned copy takes along, and the report
of a folder's tensors read one at a time."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from prunekit.io.atomic import atomic_path
from prunekit.io.files import CheckpointError, load_state_dict
from prunekit.io.sharded import INDEX, index_of, open_tensors
from prunekit.report import Report, TensorRow, report

__all__ = ["WEIGHTS", "copy_companions", "folder_report", "weights_file"]

WEIGHTS = "model.safetensors"  # what save_pretrained writes when the model fits one file
# Weights in any format: never copied beside the pruned ones (from_pretrained could load them).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")


def weights_file(folder: str | os.PathLike[str]) -> Path:
    """The single weights file of a model folder (``model.safetensors``).

    Raises:
        CheckpointError: the folder holds neither it nor a sharded index.
    """
    found = Path(folder) / WEIGHTS
    if not found.is_file():
        raise CheckpointError(
            f"{folder}: a folder without {WEIGHTS} or {INDEX}; expected a model folder as "
            "save_pretrained writes it (or a checkpoint file)"
        )
    return found


def _companions(folder: Path) -> list[Path]:
    """The files of `folder` (and its subfolders) that are not weights, hidden ones aside."""
    found = []
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if any(part.startswith(".") for part in parts) or not path.is_file():
            continue
        if path.name.endswith(_WEIGHT_SUFFIXES) or path.name.endswith(".index.json"):
            continue
        found.append(path)
    return found


def copy_companions(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> list[Path]:
    """Copy the files beside the weights in the folder `source` (config, generation config,
    tokenizer files, anything but weights) into the folder `out`, each written whole.

    Returns:
        The files written in `out`.

    Raises:
        OSError: a file could not be copied; those copied before it are removed again, and
            a file `out` had under the same name is as it was.
    """
    source, out = Path(source), Path(out)
    written: list[tuple[Path, Path | None]] = []  # (file, its former content kept aside)
    try:
        for path in _companions(source):
            target = out / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            kept = None
            if target.exists():
                kept = target.with_name(f".{target.name}.before")
                shutil.copy2(target, kept)
            written.append((target, kept))
            with atomic_path(target) as temp:
                shutil.copyfile(path, temp)
    except BaseException:
        for target, kept in written:
            if kept is not None:
                os.replace(kept, target)
            else:
                target.unlink(missing_ok=True)
        raise
    for _, kept in written:
        if kept is not None:
            kept.unlink()
    return [target for target, _ in written]


def folder_report(folder: str | os.PathLike[str]) -> Report:
    """The report of a model folder's tensors: a sharded one read a tensor at a time
    (memory holds about one tensor), a single-file one through its ``model.safetensors``.

    Raises:
        CheckpointError: not a model folder, or a file in it is not a valid one.
    """
    if index_of(folder) is None:
        return report(load_state_dict(weights_file(folder)))
    rows: list[TensorRow] = []
    for state in open_tensors(folder):
        rows.extend(report(state).rows)
    return Report(tuple(rows))
