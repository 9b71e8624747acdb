"""Safetensors files read one tensor at a time through memory maps, and written the same way.

Nothing here loads a whole file: `Stored.load()` maps the bytes of one tensor (released
when the tensor is dropped), and `Writer` lays out every output file's header first,
then takes the tensors' bytes in any order, chunk by chunk, into temporary files that
are renamed into place only once all are complete. The format is the one documented by
safetensors: an 8-byte little-endian header size, a JSON header (names to dtype, shape
and data offsets, plus an optional ``__metadata__`` of strings), then the raw bytes.
"""

from __future__ import annotations

import errno
import itertools
import json
import mmap
import os
import struct
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from prunekit.core.errors import value_error
from prunekit.io.atomic import umask
from prunekit.io.files import CheckpointError, open_regular

__all__ = ["DTYPES", "Stored", "Writer", "read_header", "stored_values"]

DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
}
CODES = {dtype: code for code, dtype in DTYPES.items()}
_MAX_HEADER = 100 << 20  # as safetensors: a larger header is not a safetensors file
_COPY = 64 << 20  # bytes copied between files at a time


@dataclass(frozen=True)
class Stored:
    """One tensor in a safetensors file: where its bytes are and what they hold."""

    name: str
    code: str  # the dtype as the file names it (BF16, F32, ...)
    shape: tuple[int, ...]
    path: Path
    begin: int  # offset of its first byte in the file
    nbytes: int

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.code]

    @property
    def numel(self) -> int:
        return self.nbytes // max(self.dtype.itemsize, 1)

    def meta(self) -> Tensor:
        """A tensor of its shape and dtype holding no data (for selecting by name and shape)."""
        return torch.empty(self.shape, dtype=self.dtype, device="meta")

    def load(self) -> Tensor:
        """The tensor, backed by a private memory map of the file: pages are read when
        touched and let go when the tensor (and every view of it) is dropped. While one
        is held, loading again from the same file maps nothing new; a file written anew
        at the path since is mapped anew (what the path holds now is read)."""
        if not self.nbytes:
            return torch.empty(self.shape, dtype=self.dtype)
        start = self.begin - self.begin % mmap.ALLOCATIONGRANULARITY
        fd, info = open_regular(self.path)
        try:  # the file there now: one written anew at the same path is another file
            key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, self.begin)
            mapped = _MAPPED.get(key)
            if mapped is None:
                length = self.begin - start + self.nbytes
                mapped = mmap.mmap(fd, length, offset=start, access=mmap.ACCESS_COPY)
                _MAPPED[key] = mapped
        finally:
            os.close(fd)
        flat = torch.frombuffer(
            mapped, dtype=self.dtype, count=self.numel, offset=self.begin - start
        )
        return flat.view(self.shape)


# The maps in use (a tensor's storage keeps its map alive), by file (device, inode, size and
# modification time: not its path, which a file written anew takes over) and offset.
_MAPPED: weakref.WeakValueDictionary[tuple[int, int, int, int, int], mmap.mmap] = (
    weakref.WeakValueDictionary()
)


def read_header(path: Path) -> tuple[dict[str, Stored], dict[str, str]]:
    """The tensors of a safetensors file in header order, and its metadata; every entry's
    bytes are checked to lie inside the file, without overlap."""
    fd, info = open_regular(path)  # non-blocking: a FIFO is refused, never waited on
    try:
        with os.fdopen(fd, "rb") as stream:
            size = info.st_size
            head = stream.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 2 <= length <= min(_MAX_HEADER, size - 8):
                raise CheckpointError(f"{path}: not a .safetensors file (bad header size)")
            header = json.loads(stream.read(length))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read: {error.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: not a .safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a .safetensors file (bad header)")
    metadata = _metadata(path, header.pop("__metadata__", None))
    data = 8 + length
    found = {name: _entry(path, name, info, data, size) for name, info in header.items()}
    spans = sorted((s.begin, s.begin + s.nbytes, s.name) for s in found.values() if s.nbytes)
    for (_, end, first), (begin, _, second) in itertools.pairwise(spans):
        if begin < end:
            raise CheckpointError(f"{path}: tensors {first!r} and {second!r} overlap")
    return found, metadata


def _metadata(path: Path, value: Any) -> dict[str, str]:
    """A header's ``__metadata__``, which the format makes a mapping of strings to strings;
    anything else is refused, never rewritten."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CheckpointError(
            f"{path}: the header's __metadata__ is a {type(value).__name__}; expected a "
            "mapping of strings to strings"
        )
    for key, item in value.items():
        if not isinstance(item, str):
            raise CheckpointError(
                f"{path}: the header's __metadata__[{key!r}] is a {type(item).__name__} "
                f"({json.dumps(item)[:60]}); expected a string (safetensors metadata maps "
                "strings to strings)"
            )
    return dict(value)


def _entry(path: Path, name: str, info: object, data: int, size: int) -> Stored:
    bad = CheckpointError(f"{path}: entry {name!r} of its header is malformed")
    if not isinstance(info, dict) or info.get("dtype") not in DTYPES:
        raise bad
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise bad
    if not (isinstance(offsets, list) and len(offsets) == 2):
        raise bad
    begin, end = offsets
    numel = 1
    for d in shape:
        numel *= d
    itemsize = DTYPES[info["dtype"]].itemsize
    if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
        raise bad
    if end - begin != numel * itemsize or data + end > size:
        raise CheckpointError(
            f"{path}: entry {name!r} holds {end - begin} bytes in a file of {size}; "
            f"expected {numel * itemsize} for shape {shape} of {info['dtype']}"
        )
    return Stored(name, info["dtype"], tuple(shape), path, data + begin, end - begin)


# copy_file_range's refusals of a pair of files it cannot copy between (two filesystems:
# EXDEV since Linux 5.19; no support in the kernel or the filesystem), not of a failed copy.
_UNCOPYABLE = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


def _copy_range(source: int, target: int, count: int, at: int, to: int) -> int:
    """Copy up to `count` bytes from offset `at` of `source` to offset `to` of `target`;
    how many were copied (0 at the end of `source`). In the kernel where it can, else
    read and written through memory."""
    copy = getattr(os, "copy_file_range", None)
    if copy is not None:
        try:
            done: int = copy(source, target, count, at, to)
            return done
        except OSError as error:
            if error.errno not in _UNCOPYABLE:
                raise
    data = os.pread(source, count, at)
    view = memoryview(data)
    while view:
        written = os.pwrite(target, view, to)
        view, to = view[written:], to + written
    return len(data)


@dataclass(frozen=True)
class Planned:
    """A tensor to write: its name, dtype code and shape."""

    name: str
    code: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * DTYPES[self.code].itemsize


class Writer:
    """Safetensors files laid out in advance and filled tensor by tensor, in any order.

    Each file is written to a temporary file beside its target; `commit()` renames them
    all into place, `abort()` removes them: a target holds either its old content or the
    complete new one.
    """

    def __init__(
        self,
        folder: Path,
        files: Mapping[str, Sequence[Planned]],
        metadata: Mapping[str, Mapping[str, str]],
    ) -> None:
        self.folder = folder
        self._temps: dict[str, str] = {}
        self._fds: dict[str, int] = {}
        self.where: dict[str, tuple[str, int, Planned]] = {}  # name -> file, offset, plan
        self.sizes: dict[str, int] = {}
        self._written: dict[str, int] = {}  # name -> bytes written into it so far
        try:
            for file, plans in files.items():
                self._lay_out(file, plans, metadata.get(file, {}))
        except BaseException:
            self.abort()
            raise

    def _lay_out(self, file: str, plans: Sequence[Planned], metadata: Mapping[str, str]) -> None:
        header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
        offset = 0
        spans = []
        for plan in plans:
            header[plan.name] = {
                "dtype": plan.code,
                "shape": list(plan.shape),
                "data_offsets": [offset, offset + plan.nbytes],
            }
            spans.append((plan, offset))
            offset += plan.nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-aligned
        fd, temp = tempfile.mkstemp(prefix=f".{file}.", dir=self.folder)
        self._temps[file], self._fds[file] = temp, fd
        os.chmod(temp, 0o666 & ~umask())  # a new file's permissions, not mkstemp's 0o600
        os.truncate(fd, 8 + len(text) + offset)
        os.pwrite(fd, struct.pack("<Q", len(text)) + text, 0)
        for plan, at in spans:
            self.where[plan.name] = (file, 8 + len(text) + at, plan)
        self.sizes[file] = offset

    def write(self, name: str, start: int, values: Tensor) -> None:
        """Write `values` (flat, of the planned dtype) into tensor `name` from entry `start`."""
        file, offset, plan = self.where[name]
        assert values.dtype == DTYPES[plan.code], (values.dtype, plan.code)
        raw = values.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        at = offset + start * values.element_size()
        self._written[name] = self._written.get(name, 0) + raw.nbytes
        view: memoryview = raw.data
        while view:
            done = os.pwrite(self._fds[file], view, at)
            view, at = view[done:], at + done
        del raw

    def copy(self, name: str, stored: Stored) -> None:
        """Copy a stored tensor's bytes as they are into tensor `name`."""
        file, offset, plan = self.where[name]
        assert plan.nbytes == stored.nbytes
        source, _ = open_regular(stored.path)
        try:
            done = 0
            while done < stored.nbytes:
                count = min(_COPY, stored.nbytes - done)
                at, to = stored.begin + done, offset + done
                step = _copy_range(source, self._fds[file], count, at, to)
                if step <= 0:
                    raise OSError(f"{stored.path}: ended early while copying {stored.name!r}")
                done += step
        finally:
            os.close(source)
        self._written[name] = self._written.get(name, 0) + stored.nbytes

    def commit(self) -> None:
        """Flush every file to disk and rename each into place.

        Raises:
            RuntimeError: a tensor laid out was not written in full (its bytes would be
                zeros on disk): a bug of the caller, the files are left uncommitted.
        """
        short = [n for n, (_, _, p) in self.where.items() if self._written.get(n, 0) < p.nbytes]
        if short:
            raise RuntimeError(
                f"Writer.commit: {len(short)} tensors laid out in {self.folder} were not "
                f"written in full ({', '.join(repr(n) for n in short[:5])}); not committed"
            )
        for fd in self._fds.values():
            os.fsync(fd)
            os.close(fd)
        self._fds.clear()
        for file, temp in list(self._temps.items()):
            os.replace(temp, self.folder / file)
            del self._temps[file]

    def abort(self) -> None:
        """Remove every temporary file."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for temp in self._temps.values():
            Path(temp).unlink(missing_ok=True)
        self._temps.clear()


def stored_values(name: str, values: torch.Tensor, dtype: torch.dtype, owner: str) -> torch.Tensor:
    """`values` of the tensor `name` (computed in COMPUTE's dtype) cast to its stored
    `dtype`.

    Args:
        name: the tensor's name in the folder (errors name it).
        values: its values as computed.
        dtype: the dtype it is stored in.
        owner: the function errors name.

    Returns:
        `values` in `dtype`.

    Raises:
        ValueError: a finite value lies beyond `dtype`'s range (it would be written as inf).
    """
    cast = values.to(dtype)
    if cast.dtype == values.dtype or not dtype.is_floating_point:
        return cast
    beyond = torch.isinf(cast) & torch.isfinite(values)
    if bool(beyond.any()):
        largest = float(values[beyond].abs().max())
        raise value_error(
            f"{owner}: {name!r} is computed with {int(beyond.sum())} values beyond the range "
            f"of its stored dtype {str(dtype).removeprefix('torch.')} (largest "
            f"{largest:.6g}, the dtype holds up to {torch.finfo(dtype).max:.6g}), which would "
            "be written as inf; expected weights that fit it (save the folder in float32 or "
            "bfloat16 first)"
        )
    return cast
