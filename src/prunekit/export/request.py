"""What an export was asked for (``Request``) and what it wrote (``ExportReport``): the
hand-over between ``export`` and each format's writer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "GGUF_BLOCK",
    "GGUF_QUANTIZED",
    "GGUF_SOURCE",
    "GGUF_TYPES",
    "ExportReport",
    "Request",
]

GGUF_QUANTIZED = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
"""The block-quantized GGUF tensor types written (those the ``gguf`` package quantizes in
numpy: llama.cpp's legacy types, blocks of 32 values with a float16 scale), by the names
`dtype` takes for them."""
GGUF_BLOCK = 32
"""The values in a block of every type of ``GGUF_QUANTIZED``: a matrix is quantized only
where its rows are a multiple of it (else written F16)."""
GGUF_TYPES = ("f32", "f16", "bf16", *GGUF_QUANTIZED)
"""The tensor types a GGUF file is written in, by the names `dtype` takes for them."""
GGUF_SOURCE = "source"
"""The `dtype` of the ``gguf`` format that writes each tensor in the type its GGUF source
holds it in (one of ``GGUF_TYPES`` where it is one, else F16; see ``gguf_writer``)."""


@dataclass(frozen=True)
class Request:
    """What the caller asked for, checked: the writers read it, never the raw arguments.

    Attributes:
        format: one of ``FORMATS``.
        path: the destination, as given.
        source: the Hugging Face folder or GGUF file the model came from, whose tokenizer and
            generation config go along (None: none are written).
        dtype: the tensor type to write (format-specific names; the ``gguf`` format's also
            ``GGUF_SOURCE``, each tensor in its source's type), or None for the model's own.
        example_inputs: inputs to compare the written model's outputs with the model's on
            (None: the format's own default, where it has one).
        verify: whether to read the written model back and compare.
    """

    format: str
    path: Path
    source: Path | None
    dtype: str | None
    example_inputs: Any
    verify: bool


@dataclass(frozen=True)
class ExportReport:
    """What ``export`` wrote and how it was checked.

    Attributes:
        format: the format written.
        path: where it was written.
        files: the files written, relative to ``path`` for a folder.
        verified_by: what read the written model back to compare (None: not checked).
        difference: the largest relative difference of its outputs from the model's on the
            example inputs (None: not checked).
        notes: what a reader should know (fields rounded, tensors converted, ...).
    """

    format: str
    path: Path
    files: tuple[str, ...]
    verified_by: str | None = None
    difference: float | None = None
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        lines = [f"{self.format}: {self.path} ({len(self.files)} files)"]
        if self.verified_by is not None and self.difference is not None:
            lines.append(f"checked by {self.verified_by}: max relative difference "
                         f"{self.difference:.2e}")  # fmt: skip
        elif self.verified_by is not None:  # a check of what was written, not of outputs
            lines.append(f"checked by {self.verified_by} (no outputs compared)")
        return "\n".join(lines + list(self.notes))
