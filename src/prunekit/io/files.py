"""Reading and writing files of named tensors: PyTorch state_dict files and safetensors.

Reading never runs code from the file unless the caller says the file is
trusted: PyTorch files load with ``weights_only=True`` by default.
"""

from __future__ import annotations

import os
import pickle
import stat
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from prunekit._extras import require
from prunekit.core.checks import refuse_empty_path  # re-exported: where callers find it
from prunekit.io.atomic import atomic_path, overlaps

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

__all__ = [
    "EXTRA_STATE",
    "CheckpointError",
    "available_memory",
    "detect_format",
    "load_state_dict",
    "open_regular",
    "refuse_empty_path",
    "save_state_dict",
    "writable_file",
    "writable_folder",
]

FORMATS = ("torch", "safetensors")
EXTRA_STATE = "_extra_state"
"""The key under a module's prefix of its ``get_extra_state()`` in a state_dict."""
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = 0x80


class CheckpointError(ValueError):
    """A file that cannot be read or written as a state_dict; the message is one line."""


def detect_format(path: str | os.PathLike[str]) -> str:
    """Return 'torch' or 'safetensors' from the file's first bytes, whatever its suffix."""
    return _probe(path)[0]


def _probe(path: str | os.PathLike[str]) -> tuple[str, int]:
    """The file's format and how many bytes its tensors take once loaded (as declared)."""
    where = str(path)
    fd, info = open_regular(path)
    with os.fdopen(fd, "rb") as stream:
        head = stream.read(9)
    size = info.st_size
    if head.startswith(_ZIP_MAGIC):
        return "torch", _zip_bytes(path, size)
    # Before the pickle's first byte: a header of 128 bytes (384, ...) begins with it too.
    header = int.from_bytes(head[:8], "little")
    if len(head) == 9 and head[8:9] == b"{" and header <= size - 8:
        return "safetensors", size - 8 - header
    if head and head[0] == _PICKLE_PROTO:
        return "torch", size
    raise CheckpointError(
        f"{where}: not a PyTorch state_dict file (torch.save) nor a .safetensors file"
    )


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file `path` (the caller closes it) and its
    status. Opened non-blocking, so that a FIFO does not wait for a writer before it is
    refused; directories, FIFOs, devices and sockets raise CheckpointError."""
    where = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise CheckpointError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise CheckpointError(f"{where}: is a directory, expected a checkpoint file") from None
    except OSError as error:
        raise CheckpointError(f"{where}: cannot read: {error.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            raise CheckpointError(f"{where}: is a directory, expected a checkpoint file")
        raise CheckpointError(
            f"{where}: is not a regular file (a FIFO, device or socket); expected a checkpoint file"
        )
    return fd, info


def _zip_bytes(path: str | os.PathLike[str], size: int) -> int:
    """What the records of a torch.save zip take unpacked, as its directory declares them
    (a small file can declare far more: compressed records); the file's size if unreadable."""
    try:
        with zipfile.ZipFile(path) as archive:
            return max(size, sum(info.file_size for info in archive.infolist()))
    except (zipfile.BadZipFile, OSError, ValueError):
        return size  # torch.load explains what is wrong with it


def available_memory() -> int | None:
    """Bytes this process may still allocate: the least of the memory the system has
    available, the address-space limit (ulimit -v) and the cgroup's limit; None if unknown."""
    limits = []
    meminfo = _read("/proc/meminfo")
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            limits.append(int(line.split()[1]) * 1024)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS) if resource else (-1, -1)
    if soft not in (-1, getattr(resource, "RLIM_INFINITY", -1)):
        used = next(
            (
                int(x.split()[1]) * 1024
                for x in _read("/proc/self/status").splitlines()
                if x.startswith("VmSize:")
            ),
            0,
        )
        limits.append(max(soft - used, 0))
    for cap, current in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        cap_text, current_text = _read(cap).strip(), _read(current).strip()
        if cap_text.isdigit() and current_text.isdigit() and int(cap_text) < 2**60:
            limits.append(max(int(cap_text) - int(current_text), 0))
    return min(limits) if limits else None


def _read(path: str) -> str:
    try:
        with open(path) as stream:
            return stream.read()
    except OSError:
        return ""


def _check_memory(where: str, needed: int, headroom: float) -> None:
    """Refuse a file whose tensors (times `headroom`) would not fit in memory."""
    budget = available_memory()
    if budget is not None and needed * headroom > budget:
        raise CheckpointError(
            f"{where}: its tensors take {_gib(needed)} once loaded; this needs about "
            f"{_gib(needed * headroom)} of memory and {_gib(budget)} are available"
        )


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def load_state_dict(
    path: str | os.PathLike[str],
    trust_pickle: bool = False,
    headroom: float = 1.0,
    extra_state: bool = False,
) -> dict[str, Tensor]:
    """Return the tensors saved in `path` by name, on the CPU.

    A PyTorch file holding a whole pickled module is refused unless
    `trust_pickle` is True (unpickling runs code from the file); with it, the
    module's state_dict() is returned. A file whose tensors, times `headroom` (what the
    caller needs beside them), would not fit in the memory available is refused before
    anything is allocated, and so is any tensor but a dense one. With `extra_state`, a
    PyTorch file's entries under ``<prefix>._extra_state`` may hold other objects (a
    module's ``get_extra_state``, which ``load_state_dict`` gives back to it) and are
    returned as they are.
    """
    kind, needed = _probe(path)
    _check_memory(str(path), needed, headroom)
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
        with warnings.catch_warnings():  # torch's notes on old formats: the error says it all
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path}: holds pickled Python objects besides tensors (a whole model?); "
            "loading them runs code from the file, so it is refused unless you trust the file "
            "(--trust-pickle, or trust_pickle=True)"
        ) from None
    except Exception as error:
        raise CheckpointError(f"{path}: cannot load ({_first_line(error)})") from None
    return _as_state_dict(obj, str(path), extra_state)


def writable_file(path: str | os.PathLike[str]) -> Path:
    """`path` as a Path, refused unless a file can be written there: no directory of that
    name, and its directory exists."""
    target = Path(path)
    if target.is_dir():
        raise CheckpointError(f"{target}: is a directory, expected a file name")
    if not target.parent.is_dir():
        raise CheckpointError(f"{target}: the directory {target.parent} does not exist")
    return target


def writable_folder(path: str | os.PathLike[str], what: str, source: Path | None = None) -> Path:
    """`path` as a Path, refused unless a folder for `what` can be written there: no file of
    that name, apart from the input folder `source` (if given), and its parent exists."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"{folder}: is a file; expected a folder for {what}")
    if source is not None and overlaps(source, folder):
        raise CheckpointError(
            f"{folder}: is, holds or lies inside the input folder {source} (links "
            "resolved); expected an output folder apart from the input"
        )
    if not folder.parent.is_dir():
        raise CheckpointError(f"{folder}: the folder {folder.parent} does not exist")
    return folder


def save_state_dict(state: Mapping[str, Tensor], path: str | os.PathLike[str]) -> Path:
    """Write `state` to `path`, as safetensors if it ends in .safetensors, else torch.save.

    `path` holds either its old content or the complete new one, even if the process is
    killed mid-write (see atomic_path). A .safetensors file is made in memory first.

    Raises:
        ValueError: an empty `path` (Path('') is the current folder).
        CheckpointError: a `path` no file can be written at (a folder, or in a folder that
            does not exist), or an entry that is no tensor (a module's extra state) for a
            .safetensors file, which holds tensors only; `path` is left as it was.
    """
    refuse_empty_path("save_state_dict", "path", path)
    target = writable_file(path)
    if target.suffix == ".safetensors":
        for key, value in state.items():
            if not isinstance(value, Tensor):
                raise CheckpointError(
                    f"{target}: entry {key!r} is a {type(value).__name__} (a module's extra "
                    "state), not a tensor, and .safetensors files hold tensors only; "
                    "expected a PyTorch file for it (a path not ending in .safetensors)"
                )
        st = require("safetensors.torch", "cli", "writing .safetensors files")
        data: bytes = st.save(_unshared(state))
        with atomic_path(target) as temp, open(temp, "wb") as stream:
            stream.write(data)
    else:
        with atomic_path(target) as temp:
            torch.save(dict(state), temp)
    return target


def _as_state_dict(obj: Any, where: str, extra_state: bool = False) -> dict[str, Tensor]:
    """Check that a loaded object is a flat mapping of names to dense tensors (or a module);
    with `extra_state`, entries under ``<prefix>._extra_state`` may hold any object."""
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, Mapping):
        raise CheckpointError(
            f"{where}: holds a {type(obj).__name__}, expected a state_dict (names to tensors)"
        )
    for key, value in obj.items():
        name = str(key)
        extra = name == EXTRA_STATE or name.endswith("." + EXTRA_STATE)
        if extra_state and extra and not isinstance(value, Tensor):
            continue
        if not isinstance(value, Tensor):
            raise CheckpointError(
                f"{where}: entry {key!r} has type {type(value).__name__}, not a tensor; expected a "
                "flat state_dict (names to tensors), such as model.state_dict()"
            )
        kind = _unusual(value)
        if kind is not None:
            raise CheckpointError(
                f"{where}: entry {key!r} is a {kind} tensor; expected dense tensors, "
                "as model.state_dict() holds them"
            )
    return {str(key): value for key, value in obj.items()}


def _unusual(t: Tensor) -> str | None:
    """What sets `t` apart from a dense CPU tensor of values (sparse, quantized...), or None."""
    if t.layout != torch.strided:
        return str(t.layout).removeprefix("torch.")
    if t.is_quantized:
        return "quantized"
    if t.is_nested:
        return "nested"
    if t.device.type != "cpu":
        return f"{t.device.type} device"
    return None


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
