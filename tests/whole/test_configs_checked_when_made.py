"""Configs that say they are checked when made (whole.Config, io.streamed.StreamedConfig)
refuse a bad pattern when made, not once a call has opened a folder or run a model."""

from __future__ import annotations

import dataclasses
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


@pytest.mark.parametrize("method", ["l1", "random", "ln", "wanda", "taylor"])
@pytest.mark.parametrize(("name", "value"), [("damp", 0.1), ("blocksize", 64)])
def test_sparsegpts_settings_are_refused_for_every_other_method(
    method: str, name: str, value: float
) -> None:
    """damp and blocksize were kept and ignored for every method but SparseGPT: a user who
    gave them believed they took effect."""
    with pytest.raises(ValueError, match=r"^Config: ") as raised:
        Config(method=method, amount=0.5, **{name: value})  # type: ignore[arg-type]
    words = str(raised.value)
    assert f"{name}={value!r}" in words and f"method={method!r}" in words
    assert "'sparsegpt'" in words


def test_sparsegpts_settings_default_to_none_and_are_kept_for_sparsegpt() -> None:
    assert (Config(method="wanda").damp, Config(method="wanda").blocksize) == (None, None)
    made = Config(method="sparsegpt", amount=0.5, damp=0.2, blocksize=64)
    assert (made.damp, made.blocksize) == (0.2, 64)
    assert (made.sparsegpt.damp, made.sparsegpt.blocksize) == (0.2, 64)
    default = Config(method="sparsegpt", amount=0.5).sparsegpt
    assert (default.damp, default.blocksize) == (0.1, 128)
    # a method changed by replace keeps the settings given, and is refused with them
    assert dataclasses.replace(Config(method="sparsegpt"), method="wanda").damp is None
    with pytest.raises(ValueError, match=r"damp=0\.2"):
        dataclasses.replace(made, method="wanda")


def test_prune_streamed_refuses_sparsegpts_settings_for_wanda() -> None:
    with pytest.raises(ValueError, match=r"^prune_streamed: damp=0\.2 .*method='wanda'"):
        StreamedConfig("wanda", 0.5, damp=0.2)
    with pytest.raises(ValueError, match=r"^prune_streamed: blocksize=8 .*method='wanda'"):
        StreamedConfig("wanda", 0.5, blocksize=8)
    assert StreamedConfig("wanda", 0.5).whole.damp is None
    assert StreamedConfig("sparsegpt", 0.5, damp=0.2).whole.sparsegpt.damp == 0.2
