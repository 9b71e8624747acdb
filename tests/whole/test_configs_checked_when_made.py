"""Configs that say they are checked when made (whole.Config, io.streamed.StreamedConfig)
refuse a bad pattern when made, not once a call has opened a folder or run a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from prunekit.io.streamed import StreamedConfig, prune_streamed
from prunekit.whole.config import Config


@pytest.mark.parametrize(
    ("pattern", "amount", "error", "words"),
    [
        (3, 0.5, ValueError, "pattern=3"),
        ("diagonal", 0.5, ValueError, "pattern='diagonal'"),
        ("2:4:8", 0.5, ValueError, "pattern='2:4:8'"),
        ("3:4", 0.5, ValueError, "amount=0.25"),
    ],
)
def test_a_bad_pattern_is_refused_when_the_config_is_made(
    pattern: object, amount: float, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match="Config") as raised:
        Config(method="wanda", amount=amount, pattern=pattern)  # type: ignore[arg-type]
    assert words in str(raised.value)
    with pytest.raises(error, match="prune_streamed") as raised:
        StreamedConfig("wanda", amount, pattern=pattern)  # type: ignore[arg-type]
    assert words in str(raised.value)


def test_prune_streamed_names_a_bad_pattern_before_it_reads_the_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pattern=3"):
        prune_streamed(tmp_path / "missing", tmp_path / "out", "wanda", 0.5,
                       calibration=[[1, 2]], pattern=3)  # type: ignore[arg-type]  # fmt: skip
    assert not (tmp_path / "out").exists()
