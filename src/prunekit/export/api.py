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
from prunekit.export import deci, gguf, hf, onnx
from prunekit.export.request import ExportReport, Request
from prunekit.io.atomic import atomic_folder, atomic_path

__all__ = ["FORMATS", "WRITERS", "ExportReport", "Request", "export"]

# every format, and whether it is a folder (True) or one file (False)
FORMATS: dict[str, bool] = {"hf": True, "deci": True, "gguf": False, "onnx": False}
"""The formats ``export`` writes, each with whether it writes a folder (True) or one file."""


Writer = Callable[[nn.Module, Path, Request], ExportReport]
# the one table of formats, filled here
WRITERS: dict[str, Writer] = {
    "hf": hf.write,
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
            one is replaced whole, and only once everything is written and checked.
        format: ``"hf"``, ``"deci"``, ``"gguf"`` or ``"onnx"``.
        source: the Hugging Face folder or GGUF file the model was loaded from; its tokenizer
            and generation config are written beside the model.
        dtype: the tensor type to write; None keeps the model's.
        example_inputs: inputs on which the written model's outputs are compared with the
            model's.
        verify: read the written model back with the format's own reader (where installed)
            and compare outputs.

    Returns:
        What was written and the difference found.

    Raises:
        TypeError: `model` is not a module.
        ValueError: an unknown format, or a model the format cannot express (the message
            names the layer and what would fit); nothing is written.
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
    if FORMATS[format]:
        with atomic_folder(request.path) as stage:
            report = writer(model, stage, request)
    else:
        with atomic_path(request.path) as staged:
            report = writer(model, Path(staged), request)
    return report
