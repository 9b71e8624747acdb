"""``export``: one entry for every format, written whole or not at all.

Each format is a module of this package with a ``write(model, target, request)`` that writes
the model to ``target`` (a staged folder for the folder formats, a staged file for the file
formats), checks what it wrote against the model wherever the format's reader is installed,
and returns the report. The table of formats is ``WRITERS``, filled here and nowhere else.
A failed write or check leaves the destination as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from prunekit.core.errors import type_error, value_error
from prunekit.core.unsaved import refuse_unsaved
from prunekit.export import deci, gguf, gguf_reading, hf_folder, onnx
from prunekit.export.request import ExportReport, Request
from prunekit.io.atomic import atomic_folder, atomic_path, overlaps

__all__ = ["FORMATS", "WRITERS", "ExportReport", "Request", "export"]

# every format, and whether it is a folder (True) or one file (False)
FORMATS: dict[str, bool] = {"hf": True, "deci": True, "gguf": False, "onnx": False}
"""The formats ``export`` writes, each with whether it writes a folder (True) or one file."""


Writer = Callable[[nn.Module, Path, Request], ExportReport]
# the one table of formats, filled here
WRITERS: dict[str, Writer] = {
    "hf": hf_folder.write,
    "deci": deci.write,
    "gguf": gguf.write,
    "onnx": onnx.write,
}


def export(
    model: nn.Module,
    path: str | os.PathLike[str],
    format: str = "hf",
    *,
    source: str | os.PathLike[str] | None = None,
    dtype: str | None = None,
    example_inputs: Any = None,
    verify: bool = True,
) -> ExportReport:
    """Write a (compacted) model in a format that runs without prunekit, and check it.

    Args:
        model: the model, compacted (``compact``) where it was pruned structurally.
        path: the folder (``hf``, ``deci``) or file (``gguf``, ``onnx``) to write; an existing
            one (a folder: empty or a model folder, with its config.json) is replaced whole,
            and only once everything is written and checked.
        format: ``"hf"``, ``"deci"``, ``"gguf"`` or ``"onnx"``.
        source: the Hugging Face folder or GGUF file the model was loaded from; its tokenizer
            and generation config are written beside the model.
        dtype: the tensor type to write; None keeps the model's. For ``gguf`` also
            ``"source"``: each tensor in the type its GGUF `source` holds it in.
        example_inputs: inputs on which the written model's outputs are compared with the
            model's.
        verify: read the written model back with the format's own reader (where installed)
            and compare outputs.

    Returns:
        What was written and the difference found.

    Raises:
        TypeError: `model` is not a module.
        ValueError: an unknown format, a model the format cannot express (the message
            names the layer and what would fit), weights on the meta device or not finite,
            skipped blocks, masked experts or a masked hidden width (forward hooks that
            ``hf``, ``deci`` and ``gguf`` files do not hold; naming them and the call to
            make first),
            or a `path` that cannot take the output (a file where a folder goes or the
            reverse, a folder of other files, no parent folder, the source or a folder
            holding it); nothing is written.
    """
    if not isinstance(model, nn.Module):
        raise type_error(f"export: model is a {type(model).__name__}; expected an nn.Module")
    writer = WRITERS.get(format) if isinstance(format, str) else None
    if writer is None:
        raise value_error(
            f"export: format={format!r} is not a format it writes; expected one of "
            f"{', '.join(sorted(WRITERS))}"
        )
    request = Request(format, Path(path), None if source is None else Path(source), dtype,
                      example_inputs, bool(verify))  # fmt: skip
    _check_path(path, request)
    _check_weights(model)
    if format != "onnx":  # rebuilt from weights and config; an ONNX graph holds the hooks
        refuse_unsaved(model, "export")
    with gguf_reading.shared():  # a GGUF source read once by the writer's steps
        if FORMATS[format]:
            with atomic_folder(request.path) as stage:
                report = writer(model, stage, request)
        else:
            with atomic_path(request.path) as staged:
                report = writer(model, Path(staged), request)
    return report


def _check_path(given: object, request: Request) -> None:
    """Refuse a destination the output cannot take: it is written whole beside it and
    swapped in, so an existing one of the other kind, a missing parent or the source
    itself (or a folder holding it) would be lost or never reached."""
    path, folder = request.path, FORMATS[request.format]
    kind = "folder" if folder else "file"
    wrong = None
    if str(given) in ("", "."):
        wrong = "names no file or folder of its own"
    elif folder and path.exists() and not path.is_dir():
        wrong = "is a file; expected a folder (the format writes one)"
    elif folder and path.is_dir() and any(path.iterdir()) and not (path / "config.json").is_file():
        wrong = "holds files but no config.json: not a model folder, and it would be replaced whole"
    elif not folder and path.is_dir():
        wrong = "is a folder; expected a file (the format writes one)"
    elif not path.absolute().parent.is_dir():
        wrong = f"is in {str(path.absolute().parent)!r}, which does not exist"
    elif request.source is not None and request.source.exists() \
            and overlaps(request.source, path):  # fmt: skip
        wrong = f"is, holds or lies inside source={str(request.source)!r}"
    if wrong is not None:
        raise value_error(
            f"export: path={str(given)!r} {wrong}; expected a new {kind}, or an existing "
            f"{kind} to replace whole, apart from the source"
        )


def _check_weights(model: nn.Module) -> None:
    """Refuse weights a written model cannot hold: on the meta device (no values) or not
    finite (the written model would compute NaN, and no check could pass)."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise value_error(
                f"export: model's {name} is on the meta device (it has no values); expected "
                "a model with its weights loaded"
            )
        if tensor.is_floating_point() and not bool(tensor.detach().isfinite().all()):
            raise value_error(
                f"export: model's {name} holds NaN or inf; expected finite weights (the "
                "written model would compute NaN)"
            )
