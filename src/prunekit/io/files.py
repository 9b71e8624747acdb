"""Reading and writing files of named tensors: PyTorch state_dict files and safetensors.

Reading never runs code from the file unless the caller says the file is
trusted: PyTorch files load with ``weights_only=True`` by default.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from prunekit._extras import require

__all__ = ["CheckpointError", "detect_format", "load_state_dict", "save_state_dict"]

FORMATS = ("torch", "safetensors")
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = 0x80


class CheckpointError(ValueError):
    """A file that cannot be read or written as a state_dict; the message is one line."""


def detect_format(path: str | os.PathLike[str]) -> str:
    """Return 'torch' or 'safetensors' from the file's first bytes, whatever its suffix."""
    where = str(path)
    try:
        with open(path, "rb") as stream:
            head = stream.read(9)
            size = os.fstat(stream.fileno()).st_size
    except FileNotFoundError:
        raise CheckpointError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise CheckpointError(f"{where}: is a directory, expected a checkpoint file") from None
    except OSError as error:
        raise CheckpointError(f"{where}: cannot read: {error.strerror}") from None
    if head.startswith(_ZIP_MAGIC) or (head and head[0] == _PICKLE_PROTO):
        return "torch"
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    raise CheckpointError(
        f"{where}: not a PyTorch state_dict file (torch.save) nor a .safetensors file"
    )


def load_state_dict(path: str | os.PathLike[str], trust_pickle: bool = False) -> dict[str, Tensor]:
    """Return the tensors saved in `path` by name, on the CPU.

    A PyTorch file holding a whole pickled module is refused unless
    `trust_pickle` is True (unpickling runs code from the file); with it, the
    module's state_dict() is returned.
    """
    kind = detect_format(path)
    if kind == "safetensors":
        st = require("safetensors.torch", "cli", "reading .safetensors files")
        try:
            loaded: dict[str, Tensor] = st.load_file(str(path), device="cpu")
        except Exception as error:
            raise CheckpointError(
                f"{path}: not a valid .safetensors file ({_first_line(error)})"
            ) from None
        return loaded
    try:
        obj = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path}: holds pickled Python objects besides tensors (a whole model?); "
            "loading them runs code from the file, so it is refused unless you trust the file "
            "(--trust-pickle, or trust_pickle=True)"
        ) from None
    except Exception as error:
        raise CheckpointError(f"{path}: cannot load ({_first_line(error)})") from None
    return _as_state_dict(obj, str(path))


def save_state_dict(state: Mapping[str, Tensor], path: str | os.PathLike[str]) -> Path:
    """Write `state` to `path`, as safetensors if it ends in .safetensors, else torch.save.

    The file is written beside its target and renamed into place, so `path`
    holds either its old content or the complete new one.
    """
    target = Path(path)
    if target.is_dir():
        raise CheckpointError(f"{target}: is a directory, expected a file name")
    if not target.parent.is_dir():
        raise CheckpointError(f"{target}: the directory {target.parent} does not exist")
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        if target.suffix == ".safetensors":
            st = require("safetensors.torch", "cli", "writing .safetensors files")
            st.save_file(_unshared(state), temp)
        else:
            torch.save(dict(state), temp)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target


def _as_state_dict(obj: Any, where: str) -> dict[str, Tensor]:
    """Check that a loaded object is a flat mapping of names to tensors (or a module)."""
    if isinstance(obj, nn.Module):
        return dict(obj.state_dict())
    if not isinstance(obj, Mapping):
        raise CheckpointError(
            f"{where}: holds a {type(obj).__name__}, expected a state_dict (names to tensors)"
        )
    for key, value in obj.items():
        if not isinstance(value, Tensor):
            raise CheckpointError(
                f"{where}: entry {key!r} has type {type(value).__name__}, not a tensor; expected a "
                "flat state_dict (names to tensors), such as model.state_dict()"
            )
    return {str(key): value for key, value in obj.items()}


def _unshared(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Contiguous tensors, each with its own storage, as safetensors requires."""
    seen: set[int] = set()
    result = {}
    for key, value in state.items():
        tensor = value.detach().contiguous()
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen and tensor.numel():
            tensor = tensor.clone()
        seen.add(ptr)
        result[key] = tensor
    return result


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
