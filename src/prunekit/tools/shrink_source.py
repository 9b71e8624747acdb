"""The model a ``prunekit shrink`` starts from: a Hugging Face folder (one weights file or
shards) or a GGUF file, checked before anything heavy is read, then loaded with its tokenizer.

The checks read only small files (config.json, a GGUF file's metadata), so a bad source is
refused in a moment: no such path, no weights, an architecture outside the Llama family, no
tokenizer.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunekit._extras import require
from prunekit.export import gguf_reading
from prunekit.export.hf_folder import DTYPES as TENSOR_TYPES
from prunekit.export.layer_widths import LLAMA_FAMILY
from prunekit.io.files import CheckpointError, open_regular
from prunekit.io.folders import WEIGHTS
from prunekit.io.mapped import read_header
from prunekit.io.sharded import index_of, open_checkpoint

__all__ = [
    "TOKENIZER_FILES",
    "Source",
    "check_source",
    "load_source",
    "source_dtype",
]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""The files one of which a Hugging Face folder's tokenizer is saved in."""
_GGUF_MAGIC = b"GGUF"
# the element types of safetensors and GGUF tensors of the floating types a model is kept in
_STORED = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass(frozen=True)
class Source:
    """A checked source.

    Attributes:
        path: as given.
        folder: the Hugging Face folder, or the folder holding the GGUF file.
        gguf_file: the GGUF file's name in `folder` (None for a Hugging Face folder).
        model_type: the architecture (``config.model_type``; for GGUF ``general.architecture``).
        weights: the files holding the weights.
        storage: how the weights are stored, the element type holding most of their bytes
            (``"GGUF Q4_1"``, ``"safetensors BF16"``), so that sizes on disk compare.
    """

    path: Path
    folder: Path
    gguf_file: str | None
    model_type: str
    weights: tuple[Path, ...]
    storage: str = ""

    @property
    def bytes(self) -> int:
        """The size on disk of the weights."""
        return sum(path.stat().st_size for path in self.weights)


def check_source(path: str | os.PathLike[str]) -> Source:
    """Check that `path` is a model ``shrink`` can start from, reading only small files.

    Args:
        path: a Hugging Face folder (config.json, a tokenizer, model.safetensors or shards
            with model.safetensors.index.json) or a GGUF file with a tokenizer.

    Returns:
        What was found.

    Raises:
        CheckpointError: no such file or folder, no weights or config, an index or a
            weights file whose header is damaged or that is cut short, an architecture
            outside the Llama family, no tokenizer, a file that is not GGUF.
    """
    where = Path(path)
    if where.is_dir():
        return _check_folder(where)
    if not where.exists():
        raise CheckpointError(
            f"{where}: no such file or folder; expected a Hugging Face model folder or a GGUF file"
        )
    return _check_gguf(where)


def _check_folder(folder: Path) -> Source:
    config = folder / "config.json"
    if not config.is_file():
        raise CheckpointError(
            f"{folder}: a folder without config.json; expected a Hugging Face model folder "
            "as save_pretrained writes it, or a GGUF file"
        )
    index = index_of(folder)
    if index is not None:  # the index and every shard's header, checked (no data read)
        checkpoint = open_checkpoint(folder)
        weights = tuple(sorted({stored.path for stored in checkpoint.tensors.values()}))
    else:
        weights = (folder / WEIGHTS,)
    missing = [str(p.name) for p in weights if not p.is_file()]
    if missing or not weights:
        raise CheckpointError(
            f"{folder}: its weights are missing ({', '.join(missing) or 'an empty index'}); "
            f"expected {WEIGHTS}, or the shards that model.safetensors.index.json names"
        )
    if index is None:
        read_header(weights[0])  # a file cut short or not safetensors is refused here
    kind = _read_json(config).get("model_type")
    _check_family(folder, kind)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(
            f"{folder}: has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); expected "
            "the tokenizer saved beside the model (tokenizer.save_pretrained(folder))"
        )
    return Source(folder, folder, None, str(kind), weights, storage_of(weights))


def _check_gguf(path: Path) -> Source:
    fd, _ = open_regular(path)
    with os.fdopen(fd, "rb") as stream:
        magic = stream.read(4)
    if magic != _GGUF_MAGIC:
        raise CheckpointError(
            f"{path}: is not a GGUF file (it starts with {magic!r}); expected a Hugging Face "
            "model folder or a GGUF file"
        )
    require("gguf", "llm", "reading a GGUF file")
    try:
        reader = gguf_reading.reader(path)
    except (ValueError, OSError, IndexError, KeyError) as error:
        raise CheckpointError(f"{path}: not a readable GGUF file ({error})") from None
    kind = _field(reader, "general.architecture")
    _check_family(path, kind)
    if _field(reader, "tokenizer.ggml.model") is None:
        raise CheckpointError(
            f"{path}: has no tokenizer (no tokenizer.ggml.model in its metadata); expected a "
            "GGUF file that carries its tokenizer, as llama.cpp's converter writes it"
        )
    return Source(path, path.parent, path.name, str(kind), (path,), _gguf_storage([reader]))


def storage_of(weights: tuple[Path, ...] | list[Path]) -> str:
    """How weight files store their tensors: the format and the element type that holds most
    of their bytes (``"GGUF Q4_1"``, ``"safetensors BF16"``, ``"ONNX"``), read from headers."""
    suffixes = {path.suffix for path in weights}
    if suffixes == {".gguf"}:
        require("gguf", "llm", "a GGUF file's tensor types")
        return _gguf_storage([gguf_reading.reader(path) for path in weights])
    if suffixes == {".safetensors"}:
        return _safetensors_storage(weights)
    return "ONNX" if suffixes == {".onnx"} else "torch"


def source_dtype(source: Source) -> torch.dtype:
    """The floating type the source keeps its weights in, which ``shrink`` writes by default.

    The element type holding most of the weights' bytes (``Source.storage``) where it is
    F32, F16 or BF16; else, for a Hugging Face folder, the one config.json names (``dtype``,
    or ``torch_dtype`` as older transformers wrote it), float32 where it names none. A
    quantized GGUF file (Q8_0, Q4_1, Q4_K, ...) is written in a half type, not in the
    float32 transformers dequantizes it to (four bytes a weight where Q8_0 takes 1.06 and
    Q4_0 0.56): bfloat16 where its unquantized matrices (an embedding or output kept as a
    float) are BF16, as the model was then made in bfloat16; else float16, the type of the
    blocks' scales of GGUF's legacy, K and IQ types, so that a dequantized weight (a small
    integer times that scale) keeps 11 significant bits (bfloat16 would keep 8, close to
    what Q8_0 itself keeps); a weight beyond float16's range (65504, a scale above 515
    under Q8_0) is refused by ``shrink``, naming it and ``--dtype bfloat16``.

    Args:
        source: from ``check_source``.

    Returns:
        torch.float32, torch.float16 or torch.bfloat16.

    Raises:
        CheckpointError: the folder's config.json cannot be read (where the weights name
            no floating type).
    """
    stored = _STORED.get(source.storage.rpartition(" ")[2])
    if stored is not None:
        return stored
    if source.gguf_file is not None:
        return _gguf_half(source.folder / source.gguf_file)
    values = _read_json(source.folder / "config.json")
    for key in ("dtype", "torch_dtype"):
        name = values.get(key)
        if isinstance(name, str) and name.removeprefix("torch.") in TENSOR_TYPES:
            return TENSOR_TYPES[name.removeprefix("torch.")]
    return torch.float32


def _gguf_half(path: Path) -> torch.dtype:
    """bfloat16 where a quantized GGUF file keeps a matrix in BF16, else float16."""
    require("gguf", "llm", "a GGUF file's tensor types")
    for tensor in gguf_reading.reader(path).tensors:
        if len(tensor.shape) >= 2 and tensor.tensor_type.name == "BF16":
            return torch.bfloat16
    return torch.float16


def _gguf_storage(readers: list[Any]) -> str:
    """ "GGUF <type>" of the tensor type holding most bytes of the GGUF files `readers` read."""
    sizes: Counter[str] = Counter()
    for reader in readers:
        for tensor in reader.tensors:
            sizes[tensor.tensor_type.name] += int(tensor.n_bytes)
    return f"GGUF {sizes.most_common(1)[0][0]}" if sizes else "GGUF"


def _safetensors_storage(weights: tuple[Path, ...] | list[Path]) -> str:
    """ "safetensors <dtype>" of the element type holding most bytes, read from the headers."""
    sizes: Counter[str] = Counter()
    for path in weights:
        fd, _ = open_regular(path)
        with os.fdopen(fd, "rb") as file:
            length = int.from_bytes(file.read(8), "little")
            try:  # only a label: a damaged header is refused when the weights are read
                header = json.loads(file.read(min(length, 100_000_000)))
                for name, entry in header.items():
                    if name != "__metadata__":
                        start, end = entry["data_offsets"]
                        sizes[str(entry["dtype"])] += int(end) - int(start)
            except (ValueError, KeyError, TypeError, AttributeError):
                return "safetensors"
    return f"safetensors {sizes.most_common(1)[0][0]}" if sizes else "safetensors"


def _field(reader: Any, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    return str(bytes(field.parts[field.data[0]]), "utf-8")


def _check_family(where: Path, kind: Any) -> None:
    if kind not in LLAMA_FAMILY:
        raise CheckpointError(
            f"{where}: architecture {kind!r} is not one prunekit shrink knows; expected a "
            f"causal LM of the Llama family ({', '.join(LLAMA_FAMILY)})"
        )


def _read_json(path: Path) -> dict[str, Any]:
    fd, _ = open_regular(path)
    with os.fdopen(fd, "rb") as stream:
        data = stream.read()
    try:
        found = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: is not valid JSON ({error})") from None
    if not isinstance(found, dict):
        raise CheckpointError(f"{path}: holds a JSON {type(found).__name__}; expected an object")
    return found


def load_source(source: Source) -> tuple[nn.Module, Any]:
    """The model (float32, eval mode) and its tokenizer.

    Args:
        source: from ``check_source``.

    Returns:
        (model, tokenizer).

    Raises:
        CheckpointError: transformers cannot build the tokenizer from the source.
    """
    transformers = require("transformers", "hf", "prunekit shrink")
    options: dict[str, Any] = {}
    if source.gguf_file is not None:  # absolute: transformers tries a relative name in the
        options["gguf_file"] = str((source.folder / source.gguf_file).resolve())  # cwd first
    with _quiet(transformers):
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(source.folder.resolve()), **options
            )
        except (OSError, ValueError, KeyError) as error:
            raise CheckpointError(
                f"{source.path}: its tokenizer cannot be loaded ({' '.join(str(error).split())})"
                "; expected a tokenizer transformers' AutoTokenizer reads"
            ) from None
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(source.folder.resolve()), dtype=torch.float32, **options
        )
    if source.gguf_file is not None:
        _plain(model)
    return model.eval(), tokenizer


def _plain(model: nn.Module) -> None:
    """Forget that a model read from GGUF was quantized: transformers dequantized its
    tensors to float32 on loading but keeps the GGUF marks, with which it refuses to save it."""
    for name, value in (("hf_quantizer", None), ("is_quantized", False),
                        ("quantization_method", None)):  # fmt: skip
        if hasattr(model, name):
            setattr(model, name, value)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "quantization_config"):
        del config.quantization_config


@contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers' own progress bars off while it loads (the caller shows its own)."""
    logging = transformers.utils.logging
    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            logging.enable_progress_bar()
