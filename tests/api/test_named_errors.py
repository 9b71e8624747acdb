"""Errors that name what the caller must fix: the calibrated layer by its path in the
model, the example inputs by the entry point that traced them, the loss by the entry point
whose calibration it serves."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from hostile.support import refused


class Reused(nn.Module):
    """`inner.a` run twice in one forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.inner.a = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.inner.a
        return self.head(a(torch.relu(a(x))))


class Shares(nn.Module):
    """`left` and `right` read one tensor in a batch of 3 rows, two tensors in any other."""

    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        other = x if x.shape[0] == 3 else x.clone()
        return self.left(x) + self.right(other)


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_layer_called_twice_is_named_by_its_path(method: str) -> None:
    torch.manual_seed(0)
    model = Reused()
    refused(
        lambda: prunekit.prune_model(model, 0.5, method=method, calibration=[torch.randn(3, 4)]),
        ValueError,
        r"^calibration: module 'inner\.a' \(Linear\) was called more than once per batch "
        r"\(the same module run on two inputs in one forward\); expected each calibrated "
        r"layer to run once per forward",
        model=model,
    )


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_layer_sharing_its_input_in_one_batch_only_is_named_by_its_path(method: str) -> None:
    torch.manual_seed(0)
    model = Shares()
    refused(
        lambda: prunekit.prune_model(
            model, 0.5, method=method, calibration=[torch.randn(3, 4), torch.randn(5, 4)]
        ),
        ValueError,
        r"^calibration: module 'right' \(Linear\) shared its input with another layer in the "
        r"first batch but not in this one; expected each batch to run the model the same way",
        model=model,
    )


class Widen(nn.Module):
    """A hidden width of 8 read by `down`, which runs twice."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        return self.down(h) + self.down(h * 2)


@pytest.mark.parametrize(
    "options",
    [{"criterion": "activation"}, {"compensate": True}],
    ids=["calibrated-criterion", "compensation"],
)
def test_prune_channels_names_a_layer_called_twice_by_its_path(options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = Widen()
    x = torch.randn(6, 4)
    refused(
        lambda: prunekit.prune_channels(model, x, 0.5, calibration=[x], **options),
        ValueError,
        r"calibration: module 'down' \(Linear\) was called more than once per batch",
        model=model,
    )
