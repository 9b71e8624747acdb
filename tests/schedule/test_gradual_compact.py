"""Gradual channel pruning whose masks ``compact`` removes: a channel the pruner empties
carries exactly zero (its bias and norm parameters masked too), even into padded convs."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import prunekit as prune


class Padded(nn.Module):
    """Biases and a BatchNorm before zero-padded convolutions: what an emptied channel
    would still carry (bias, beta - mean x gamma / std) is a constant that padding breaks."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 12, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(12)
        self.conv2 = nn.Conv2d(12, 16, 3, padding=1)
        self.conv3 = nn.Conv2d(16, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.conv3(F.relu(self.conv2(x))))
        out: Tensor = self.fc(x.mean((2, 3)))
        return out


X = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3))


def train(model: nn.Module, pruner: prune.GradualPruner, steps: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(4)
    for _ in range(steps):
        x, y = torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        pruner.step()


def _pruner(model: nn.Module, **kwargs: Any) -> prune.GradualPruner:
    return prune.GradualPruner(
        model, 0.5, start_step=1, end_step=5, every=2, method="ln",
        include=["conv1.weight", "conv2.weight", "conv3.weight"], **kwargs,
    )  # fmt: skip


def test_without_example_inputs_compact_refuses_the_constant_into_padding() -> None:
    model = Padded()
    train(model, _pruner(model), 6)
    with pytest.raises(ValueError, match="pads with zeros"):
        prune.compact(model.eval(), X, latency_runs=0)


def test_gradual_channels_then_compact_computes_what_the_masked_model_computed() -> None:
    model = Padded()
    pruner = _pruner(model, example_inputs=X)
    train(model, pruner, 6)
    assert pruner.amount == 0.5
    assert float(model.bn1.running_mean.abs().max()) > 0  # the BatchNorm learned statistics
    model.eval()
    with torch.no_grad():
        masked = model(X)
    report = prune.compact(model, X, latency_runs=0)
    with torch.no_grad():
        compacted = model(X)
    assert (model.conv1.out_channels, model.conv2.out_channels, model.conv3.out_channels) == (
        6, 8, 4
    )  # fmt: skip
    assert model.bn1.num_features == 6 and model.fc.in_features == 4
    assert report.channels == 18
    assert float((compacted - masked).abs().max()) <= 1e-5 * float(masked.abs().max())


def test_the_bias_and_norm_of_an_emptied_channel_are_masked_and_resume_alike() -> None:
    model = Padded()
    pruner = _pruner(model, example_inputs=X)
    pruner.prepare()
    keys = set(model.state_dict())
    assert {"conv1.bias_mask", "bn1.weight_mask", "bn1.bias_mask", "conv2.bias_mask"} <= keys
    train(model, pruner, 6)
    dead = model.conv1.weight_mask.flatten(1).eq(0).all(1)
    assert int(dead.sum()) == 6
    for mask in (model.conv1.bias_mask, model.bn1.weight_mask, model.bn1.bias_mask):
        assert torch.equal(mask.eq(0), dead)
    state, pruner_state = model.state_dict(), pruner.state_dict()
    again = Padded()
    resumed = _pruner(again, example_inputs=X)
    resumed.load_state_dict(pruner_state)
    again.load_state_dict(state)
    assert torch.equal(again.bn1.bias_mask, model.bn1.bias_mask)
    assert prune.report(again)["bn1.bias"].method.startswith("Gradual(")


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"pattern": "unstructured", "example_inputs": X}, ValueError,
         "example_inputs is for method='ln'"),
        ({"pattern": prune.Channels(dim=1), "example_inputs": X}, ValueError,
         "example_inputs is for method='ln'"),
        ({"method": "ln", "example_inputs": "x"}, TypeError, "example_inputs=str"),
    ],
)  # fmt: skip
def test_bad_example_inputs_are_refused(kwargs: dict[str, Any], error: type, words: str) -> None:
    model = Padded()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=re.escape(words)):
        prune.GradualPruner(model, 0.5, start_step=0, end_step=4, **kwargs)
    assert list(model.state_dict()) == list(before)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_channels_keep_one_unit_per_layer_and_compact_removes_the_rest() -> None:
    """At 0.99 each layer would lose every channel (round(0.99 x 12) = 12); it keeps one, as
    prune_channels does, and compact then removes all the others."""
    model = Padded()
    pruner = prune.GradualPruner(
        model, 0.99, start_step=1, end_step=5, every=2, method="ln", example_inputs=X,
        include=["conv1.weight", "conv2.weight", "conv3.weight"],
    )  # fmt: skip
    train(model, pruner, 6)
    convs = (model.conv1, model.conv2, model.conv3)
    alive = [int((c.weight_mask.flatten(1).sum(1) > 0).sum()) for c in convs]
    assert alive == [1, 1, 1]
    model.eval()
    with torch.no_grad():
        masked = model(X)
    prune.compact(model, X, latency_runs=0)
    assert [c.out_channels for c in convs] == [1, 1, 1]
    with torch.no_grad():
        assert float((model(X) - masked).abs().max()) <= 1e-5 * float(masked.abs().max())
