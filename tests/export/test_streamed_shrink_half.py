"""shrink_streamed on a bfloat16 folder: each block computed in float32 (as prune_streamed
computes one), written back in bfloat16."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import prunekit.export.streamed_shrink as streamed_shrink
from helpers import tiny_llm
from helpers.tiny_llm import folder_tensors as weights
from prunekit.export.streamed_shrink import ShrinkStreamedConfig, shrink_streamed
from prunekit.structure.budget import Budget

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

VOCAB = 96


def folders(root: Path) -> tuple[Path, Path]:
    """The same tiny random Llama twice: in bfloat16, and its bfloat16 values in float32."""
    model = tiny_llm.llama(vocab=VOCAB, layers=2).to(torch.bfloat16)
    model.save_pretrained(root / "half", max_shard_size="20KB")
    model.float().save_pretrained(root / "full", max_shard_size="20KB")
    return root / "half", root / "full"


def test_a_half_folder_is_computed_in_float32_and_written_in_its_dtype(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    half, full = folders(tmp_path)
    torch.manual_seed(1)
    calibration = [torch.randint(0, VOCAB, (2, 24)) for _ in range(2)]
    config = ShrinkStreamedConfig(Budget(params=0.3))
    seen: list[torch.dtype] = []
    compensate = streamed_shrink.compensate_groups

    def spy(holder: Any, *args: Any, **kwargs: Any) -> Any:
        seen.extend({p.dtype for p in holder.parameters()})
        return compensate(holder, *args, **kwargs)

    monkeypatch.setattr(streamed_shrink, "compensate_groups", spy)
    with warnings.catch_warnings():  # few calibration rows: compensation warns
        warnings.simplefilter("ignore", UserWarning)
        got = shrink_streamed(half, tmp_path / "out-half", calibration=calibration, config=config)
        want = shrink_streamed(full, tmp_path / "out-full", calibration=calibration, config=config)
    assert seen and set(seen) == {torch.float32}
    assert [p.units for p in got.budget] == [p.units for p in want.budget]
    written, reference = (
        weights(tmp_path / "out-half"),
        weights(tmp_path / "out-full"),
    )
    assert set(written) == set(reference)
    for name, tensor in written.items():
        assert tensor.dtype == torch.bfloat16, name
        torch.testing.assert_close(tensor.float(), reference[name], rtol=2e-2, atol=2e-3, msg=name)
