"""io.mapped.Writer lays files out in advance; a tensor never written would be zeros on disk.
commit refuses that (a bug of the caller), and nothing is renamed into place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prunekit.io.mapped import Planned, Writer

safe_open = pytest.importorskip("safetensors").safe_open


def plans() -> dict[str, list[Planned]]:
    return {"a.safetensors": [Planned("x", "F32", (2, 3)), Planned("y", "BF16", (4,))]}


def test_a_tensor_left_unwritten_is_refused_and_nothing_committed(tmp_path: Path) -> None:
    writer = Writer(tmp_path, plans(), {})
    writer.write("x", 0, torch.arange(6.0))
    writer.write("y", 0, torch.ones(2, dtype=torch.bfloat16))  # half of it
    with pytest.raises(RuntimeError, match=r"'y'") as raised:
        writer.commit()
    assert "not written in full" in str(raised.value)
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_tensors_written_in_parts_commit(tmp_path: Path) -> None:
    writer = Writer(tmp_path, plans(), {})
    writer.write("x", 0, torch.arange(3.0))
    writer.write("x", 3, torch.arange(3.0, 6.0))
    writer.write("y", 0, torch.full((4,), 2.0, dtype=torch.bfloat16))
    writer.commit()
    with safe_open(str(tmp_path / "a.safetensors"), "pt") as opened:
        assert torch.equal(opened.get_tensor("x"), torch.arange(6.0).reshape(2, 3))
        assert torch.equal(opened.get_tensor("y"), torch.full((4,), 2.0, dtype=torch.bfloat16))
