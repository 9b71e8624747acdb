"""What goes beside the weights of a written folder: the tokenizer and the generation config,
taken from the folder or GGUF file the model came from, or from the model itself.

From a Hugging Face folder every file that is not weights is copied (the tokenizer's files,
``generation_config.json``, chat templates...), except its ``config.json``, which the writer
writes anew. From a GGUF file the tokenizer is read by transformers and saved as a
Hugging Face tokenizer; the generation config is the model's. With no source, only the
model's generation config is written (no tokenizer).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import nn

from prunekit._extras import require
from prunekit.core.errors import type_error, value_error
from prunekit.dropin.calls import is_pruned
from prunekit.export import gguf_reading
from prunekit.io.folders import copy_companions

__all__ = ["check_model", "check_source", "clear", "dequantized", "write_companions"]

CONFIG = "config.json"


def check_source(source: Path | None) -> Path | None:
    """`source` checked: an existing folder, or an existing ``.gguf`` file, or None.

    Raises:
        ValueError: anything else (the message names `source` and what it is).
    """
    if source is None:
        return None
    if source.is_dir():
        return source
    if source.is_file() and source.suffix.lower() == ".gguf":
        _check_gguf(source)
        return source
    what = "no such file or folder" if not source.exists() else "a file that is not .gguf"
    raise value_error(
        f"export: source={str(source)!r} is {what}; expected the Hugging Face model folder "
        "or the GGUF file the model was loaded from (its tokenizer and generation config "
        "are written beside the model), or None"
    )


def _check_gguf(source: Path) -> None:
    """Refuse a GGUF source its reader cannot read (checked before anything is written)."""
    try:
        require("gguf", "llm", "export: the tokenizer of a GGUF file")
    except ImportError:
        return  # transformers reads it later and says what is missing
    try:
        gguf_reading.reader(source)
    except (ValueError, OSError, IndexError, KeyError, TypeError) as error:
        raise value_error(
            f"export: source={str(source)!r} is not a readable GGUF file ({error}); expected "
            "the GGUF file the model was loaded from, whole"
        ) from None


def clear(folder: Path) -> None:
    """Unlink everything in the staged `folder` (it starts with the destination's files
    linked in; the destination is replaced whole, and a file is never written through a
    link into the destination's own)."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()


def write_companions(model: nn.Module, target: Path, source: Path | None) -> list[str]:
    """Write the tokenizer and generation config into `target` (which already holds the
    model's weights and its own generation config, if it has one); return notes for the
    report. The written ``config.json`` is the writer's to write after this."""
    if source is None:
        found = "the model's generation config" if (target / "generation_config.json").is_file() \
            else "no generation config (the model has none)"  # fmt: skip
        return [f"no source given: no tokenizer written; {found}"]
    if source.is_dir():
        kept = target / CONFIG
        before = kept.read_bytes() if kept.is_file() else None
        copy_companions(source, target)
        if before is not None:  # the source's config is not the pruned model's
            _replace(kept, before)
        else:
            kept.unlink(missing_ok=True)
        return [f"tokenizer and generation config copied from {source}"]
    transformers: Any = require("transformers", "hf", "export: the tokenizer of a GGUF file")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source.parent),
                                                           gguf_file=source.name)  # fmt: skip
    tokenizer.save_pretrained(str(target))
    return [f"tokenizer read from {source.name} by transformers; the model's generation config"]


def _replace(path: Path, content: bytes) -> None:
    temp = path.with_name(f".{path.name}.new")
    temp.write_bytes(content)
    os.replace(temp, path)


def check_model(model: Any, where: str) -> None:
    """Refuse a model that is not a Hugging Face model, or still holds masks.

    Raises:
        TypeError: `model` has no config or no save_pretrained.
        ValueError: `model` still carries pruning masks (call ``compact`` first).
    """
    if not (callable(getattr(model, "save_pretrained", None))
            and callable(getattr(getattr(model, "config", None), "to_dict", None))):  # fmt: skip
        raise type_error(
            f"{where}: model is a {type(model).__name__}; expected a Hugging Face model "
            "(a transformers PreTrainedModel with a config)"
        )
    masked = [name for name, _ in model.named_buffers() if name.endswith("_mask")]
    if masked or is_pruned(model):
        which = f" ({masked[0]})" if masked else ""
        raise value_error(
            f"{where}: model still holds pruning masks{which}; expected a compacted model: "
            "call prunekit.compact(model, example_inputs) first, which removes the masked "
            "units and leaves each layer at its own widths"
        )


@contextlib.contextmanager
def dequantized(model: Any) -> Iterator[None]:
    """Within the block, a model loaded from a GGUF file is written as the float model it
    is: transformers unpacks GGUF weights to floats on loading but keeps the model marked
    GGUF-quantized (``hf_quantizer``, ``config.quantization_config``), and save_pretrained
    refuses such a model; the mark is lifted in the block and put back after it.

    Raises:
        ValueError: the model still holds GGUF blocks (parameters that are not floats).
    """
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is None or str(getattr(method, "value", method)) != "gguf":
        yield
        return
    kept = [name for name, p in model.named_parameters() if not p.is_floating_point()]
    if kept:
        raise value_error(
            f"export: {kept[0]} holds GGUF blocks, not floats; expected a model whose weights "
            "transformers unpacked on loading (the pruned model is)"
        )
    config = model.config
    before = dict(vars(config))
    vars(config).pop("quantization_config", None)
    model.hf_quantizer = None
    try:
        yield
    finally:
        model.hf_quantizer = quantizer
        vars(config).clear()
        vars(config).update(before)
