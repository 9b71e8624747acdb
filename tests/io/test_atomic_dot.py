"""io.atomic.atomic_folder with a target spelled relative to the current folder ('.', 'a/..'):
the swap renames the folder by its full name, as the system refuses to rename '.' (which
left a stray '..old.*' folder in it and wrote nothing), and a swap that fails leaves no
folder of its own behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prunekit.io import atomic
from prunekit.io.atomic import atomic_folder


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
@pytest.mark.parametrize("target", [".", "sub/.."])
def test_the_current_folder_is_swapped_by_its_full_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, exchange: bool
) -> None:
    here = tmp_path / "here"
    (here / "sub").mkdir(parents=True)
    (here / "kept.txt").write_text("kept")
    monkeypatch.chdir(here)
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    with atomic_folder(target) as stage:
        (stage / "new.txt").write_text("new")
    assert sorted(p.name for p in here.iterdir()) == ["kept.txt", "new.txt", "sub"]
    assert (here / "new.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]


def test_a_swap_that_fails_leaves_no_folder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    real = os.rename

    def refused(a: object, b: object) -> None:
        if Path(str(a)) == target:
            raise OSError(16, "Device or resource busy")
        real(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(atomic.os, "rename", refused)
    with pytest.raises(OSError, match="busy"), atomic_folder(target) as stage:
        (stage / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
