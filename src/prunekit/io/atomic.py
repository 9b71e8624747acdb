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
import ctypes
import ctypes.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_folder", "atomic_path", "overlaps", "same_file", "umask"]

# The stages of the atomic_folder blocks running (in any thread): a link in one is a copy of
# the folder's own, which the stage's new file replaces rather than writes through.
_STAGES: set[Path] = set()


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a path to write to; on success its content replaces `target` atomically.

    A `target` that is a symbolic link (or a chain of them) is written through: the file
    it names takes the content, made beside that file (in its folder, where the rename is
    atomic), and the link stays a link. A dangling link makes the file it names. Inside
    the stage of an ``atomic_folder`` block, a link (copied from the folder replaced) is
    replaced by the new file instead: the folder is written whole, and nothing outside it
    changes, even where the block fails after.
    """
    # by its full name (the link below is made by the folder's descriptor); a symbolic
    # link resolved to the file it names, which the rename would otherwise put a file over
    given = Path(target)
    through = given.is_symlink() and not _staged(Path(os.path.abspath(given)))
    final = Path((os.path.realpath if through else os.path.abspath)(given))
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


@contextlib.contextmanager
def atomic_folder(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a staged folder beside `target` to write the whole new folder into; when the
    block ends without error it takes `target`'s place, else it is removed.

    The stage starts with `target`'s present files hard-linked in (copied where links
    fail), so files the block does not write stay; writers must replace files (as
    atomic_path and the shard writer do), never write into them. Where Linux offers
    renameat2(RENAME_EXCHANGE) the swap is one atomic exchange, so a kill leaves the old
    folder or the new one at `target`; elsewhere two renames, between which a kill leaves
    the old folder under a hidden name beside it. The parent folder must exist.
    """
    # by its full name: the system refuses to rename '.', and 'a/..' stages inside itself
    final = Path((os.path.realpath if Path(target).is_symlink() else os.path.abspath)(target))
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    _STAGES.add(stage)
    try:
        if final.is_dir():  # its files, and its permissions (copytree copies them)
            shutil.copytree(final, stage, symlinks=True, copy_function=_link_or_copy,
                            dirs_exist_ok=True)  # fmt: skip
        else:  # mkdtemp's 0o700: a new folder's, as mkdir makes it
            os.chmod(stage, 0o777 & ~umask())
        yield stage
        for path in stage.rglob("*"):
            if path.is_file() and not path.is_symlink():
                with open(path, "rb") as stream:
                    os.fsync(stream.fileno())
        _swap(stage, final)
    finally:
        _STAGES.discard(stage)
        shutil.rmtree(stage, ignore_errors=True)  # the stage, or the old folder once swapped
    _sync_folder(final.parent)


def _staged(path: Path) -> bool:
    """Whether `path` (absolute, links not resolved) lies in a running atomic_folder's
    stage."""
    return any(stage in path.parents for stage in set(_STAGES))


def overlaps(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether the folders (or files) `a` and `b` are one, or one holds the other, with
    links resolved (`b` need not exist yet)."""
    x, y = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    return x == y or x in y.parents or y in x.parents


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, destination)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _swap(stage: Path, final: Path) -> None:
    """Put `stage` at `final`; the old `final` (if any) ends at `stage` (to be removed)."""
    if not final.exists():
        os.rename(stage, final)
        stage.mkdir()  # the caller removes it
        return
    if _exchange(stage, final):
        return
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old.", dir=final.parent))
    try:
        os.rename(final, old / "x")
    except OSError:  # `final` stays where it was: nothing of the swap is left beside it
        old.rmdir()
        raise
    os.rename(stage, final)
    os.rename(old / "x", stage)
    old.rmdir()


def _exchange(a: Path, b: Path) -> bool:
    """Exchange two paths atomically (Linux renameat2); False where that is not offered."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        call = libc.renameat2
    except (OSError, AttributeError, TypeError):
        return False
    done = call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return bool(done == 0)


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
        os.chmod(temp, 0o666 & ~umask())  # mkstemp's 0o600: a new file's, as open makes it
        yield temp
        with open(temp, "rb") as stream:
            os.fsync(stream.fileno())
        os.replace(temp, final)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _sync_folder(final.parent)


def umask() -> int:
    """The process's umask: what a new file or folder is made without (temporary files are
    made 0o600 and folders 0o700 whatever it is, so output made that way must be given the
    permissions open and mkdir would give it)."""
    found = os.umask(0)
    os.umask(found)
    return found


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
