"""Writing a file so that its path never holds a partial content, even if the process is killed.

``with atomic_path(target) as temp:`` yields a path to write the whole new content to; when
the block ends without error, that content replaces `target` in one rename, after being
flushed to disk. On Linux it is first an unnamed file (O_TMPFILE) in the target's folder,
so a process killed mid-write (SIGKILL included) leaves no file at all; it gets a hidden name
only once complete, just before the rename. Elsewhere it is a hidden temporary file from the
start, which a kill can leave behind (never at `target`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "same_file"]


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a path to write to; on success its content replaces `target` atomically."""
    final = Path(target)
    fd = _unnamed_file(final.parent)
    if fd is None:
        with _named_temp(final) as temp:
            yield temp
        return
    try:
        path = f"/proc/self/fd/{fd}"
        yield path
        os.fsync(fd)
        name = _fresh_name(final)
        folder = os.open(final.parent, os.O_RDONLY)
        try:  # linkat with AT_SYMLINK_FOLLOW: os.link uses it only when given a dir_fd
            os.link(path, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=True)
        finally:
            os.close(folder)
        try:
            os.replace(name, final)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise
    finally:
        os.close(fd)
    _sync_folder(final.parent)


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether the two paths name one existing file (through links too)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _unnamed_file(folder: Path) -> int | None:
    """An O_TMPFILE descriptor in `folder`, or None where the system or filesystem has none."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not Path("/proc/self/fd").is_dir():
        return None
    try:
        return os.open(folder, flag | os.O_RDWR, 0o666)  # the umask applies, as to any file
    except OSError:
        return None  # a filesystem without it (EOPNOTSUPP, EISDIR...): the named way


@contextlib.contextmanager
def _named_temp(final: Path) -> Iterator[str]:
    fd, temp = tempfile.mkstemp(prefix=f".{final.name}.", dir=final.parent)
    os.close(fd)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp, 0o666 & ~umask)
        yield temp
        with open(temp, "rb") as stream:
            os.fsync(stream.fileno())
        os.replace(temp, final)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _sync_folder(final.parent)


def _fresh_name(final: Path) -> str:
    """A hidden name beside `final` that no file has (for the instant before the rename)."""
    while True:
        candidate = final.parent / f".{final.name}.{os.urandom(6).hex()}"
        if not candidate.exists():
            return str(candidate)


def _sync_folder(folder: Path) -> None:
    """Flush the rename itself to disk, where the system allows opening a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
