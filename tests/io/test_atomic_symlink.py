"""io.atomic.atomic_path through a symbolic link: the content goes to the file the link names,
atomically beside it, and the link stays a link (it was replaced by a regular file, so the
file it named kept its old content and the link was gone)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prunekit.io import atomic
from prunekit.io.atomic import atomic_path
from prunekit.io.folders import copy_companions


@pytest.fixture(params=["unnamed", "named"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of writing: an O_TMPFILE file, and a hidden temporary file."""
    if request.param == "named":
        monkeypatch.setattr(atomic, "_unnamed_file", lambda folder: None)
    return str(request.param)


def _write(target: Path, text: str) -> None:
    with atomic_path(target) as temp, open(temp, "w") as stream:
        stream.write(text)


def test_a_link_to_a_file_in_another_folder_writes_that_file(tmp_path: Path, way: str) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "out").mkdir()
    real = tmp_path / "store" / "model.bin"
    real.write_text("old")
    link = tmp_path / "out" / "model.bin"
    link.symlink_to(os.path.join("..", "store", "model.bin"))  # relative to its own folder
    _write(link, "new")
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "store", "model.bin")
    assert real.read_text() == "new" and link.read_text() == "new"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.bin"]
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["model.bin"]


def test_a_chain_of_links_writes_the_last_ones_file(tmp_path: Path, way: str) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    (tmp_path / "b").symlink_to("real.txt")
    (tmp_path / "a").symlink_to("b")
    _write(tmp_path / "a", "new")
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()
    assert real.read_text() == "new"


def test_a_dangling_link_makes_the_file_it_names(tmp_path: Path, way: str) -> None:
    link = tmp_path / "link.txt"
    link.symlink_to("made.txt")
    _write(link, "new")
    assert link.is_symlink() and (tmp_path / "made.txt").read_text() == "new"


def test_a_failed_write_through_a_link_leaves_both_as_they_were(tmp_path: Path, way: str) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to("real.txt")
    with pytest.raises(RuntimeError, match="stopped"), atomic_path(link) as temp:
        Path(temp).write_text("partial")
        raise RuntimeError("stopped")
    assert link.is_symlink() and real.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


def test_a_link_in_a_staged_folder_is_replaced_and_a_failure_leaves_its_file(
    tmp_path: Path, way: str
) -> None:
    """A folder written whole (atomic_folder) starts its stage with the folder's files,
    links as links; writing a file of the stage went through such a link to the file it
    names outside the folder (a Hugging Face cache's blob, say), so a call that failed
    afterwards left that file changed. The stage's file replaces the link instead."""
    (tmp_path / "store").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "source").mkdir()
    real = tmp_path / "store" / "config.json"
    real.write_text("old")
    (tmp_path / "out" / "config.json").symlink_to(real)
    (tmp_path / "source" / "config.json").write_text("new")
    (tmp_path / "source" / "tokenizer.json").write_text("{}")
    with (
        pytest.raises(RuntimeError, match="stopped"),
        atomic.atomic_folder(tmp_path / "out") as stage,
    ):
        copy_companions(tmp_path / "source", stage)
        raise RuntimeError("stopped")
    assert real.read_text() == "old"
    assert (tmp_path / "out" / "config.json").is_symlink()
    with atomic.atomic_folder(tmp_path / "out") as stage:
        copy_companions(tmp_path / "source", stage)
    assert real.read_text() == "old"  # the folder's own file now, not the one linked
    assert not (tmp_path / "out" / "config.json").is_symlink()
    assert (tmp_path / "out" / "config.json").read_text() == "new"
