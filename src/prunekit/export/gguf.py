"""``gguf``: the entry of the GGUF writer, importable without the ``gguf`` package.

``prunekit.export`` lists every format at import; the writer itself (``gguf_writer``: what it
writes, the tensor types, the tokenizer, the checks) needs ``gguf``, an optional dependency
(``pip install 'prunekit[llm]'``), so it is imported when a GGUF file is asked for.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from prunekit._extras import require
from prunekit.export.request import ExportReport, Request

__all__ = ["write"]


def write(model: nn.Module, target: Path, request: Request) -> ExportReport:
    """Write `model` as one GGUF file at `target` and check it (see ``gguf_writer.write``).

    Args:
        model: a compacted Hugging Face causal LM of the Llama family.
        target: the staged file to write.
        request: the checked call; ``source`` gives the tokenizer, ``dtype`` the tensor type.

    Returns:
        What was written and how it was checked.

    Raises:
        ImportError: the ``gguf`` package is not installed.
        ValueError, TypeError: a model, source or dtype it cannot write (before writing).
        RuntimeError: the file read back differs from the model.
    """
    require("gguf", "llm", "export(format='gguf')")
    # imported here: it imports gguf at its top, and prunekit.export must import without it
    from prunekit.export import gguf_writer  # noqa: PLC0415

    return gguf_writer.write(model, target, request)
