"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code = compile(BLOCKS[index], f"README.md block {index}", "exec")
    exec(code, {"__name__": f"readme_block_{index}"})
    out = capsys.readouterr().out
    # every "print(...)  # expected" comment in the block matches what was printed
    expected = [
        line.split("#", 1)[1].strip()
        for line in BLOCKS[index].splitlines()
        if "print(" in line and "#" in line
    ]
    printed = out.splitlines()
    for want in expected:
        assert want in printed, f"README block {index}: expected {want!r} in {printed}"
