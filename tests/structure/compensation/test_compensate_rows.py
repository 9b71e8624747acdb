"""compensate=True warns when a consumer's statistics hold fewer calibration rows than its
input has features (an underdetermined least-squares update), naming it and the counts."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import prunekit


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 5))


def test_fewer_rows_than_the_consumers_width_warns_naming_it_and_the_counts() -> None:
    model = mlp()
    batches = [torch.randn(4, 6), torch.randn(6, 6)]  # 10 rows for a 32-wide input
    with pytest.warns(UserWarning, match="compensate=True") as caught:
        prunekit.prune_channels(
            model, torch.randn(2, 6), 0.25, criterion="l2", calibration=batches, compensate=True
        )
    (found,) = [w for w in caught if "compensate=True" in str(w.message)]
    message = str(found.message)
    assert "10 calibration rows (tokens or positions) for 2," in message
    assert "32 features" in message and "at least 32 rows" in message
    assert found.filename == __file__  # points at the caller's line
    assert prunekit.is_pruned(model)  # a warning, not a refusal


def test_enough_rows_do_not_warn_and_the_update_is_the_same_as_with_the_warning() -> None:
    batches = [torch.randn(40, 6)]
    model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prunekit.prune_channels(
            model, torch.randn(2, 6), 0.25, criterion="l2", calibration=batches, compensate=True
        )
    assert prunekit.is_pruned(model)


def test_every_short_consumer_is_counted_in_one_warning() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 24), nn.ReLU(),
                          nn.Linear(24, 5))  # fmt: skip
    with pytest.warns(UserWarning, match="compensate=True") as caught:
        prunekit.prune_channels(
            model, torch.randn(2, 6), 0.25, criterion="l2", calibration=[torch.randn(12, 6)],
            compensate=True,
        )  # fmt: skip
    messages = [str(w.message) for w in caught if "compensate=True" in str(w.message)]
    assert len(messages) == 1
    assert "12 calibration rows (tokens or positions) for 2," in messages[0]
    assert "and 1 other consumer:" in messages[0] and "at least 32 rows" in messages[0]


def test_a_failed_call_does_not_warn() -> None:
    model = mlp()

    def broken(group: prunekit.ChannelGroup) -> torch.Tensor:
        raise RuntimeError("criterion failed")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="criterion failed"):
            prunekit.prune_channels(
                model, torch.randn(2, 6), 0.25, criterion=broken,
                calibration=[torch.randn(3, 6)], compensate=True,
            )  # fmt: skip
