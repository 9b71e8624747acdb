"""The op handlers' labels: a concatenation and a roll keep the dims their inputs are broadcast
along."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers import graph_frozen
from prunekit.structure.graph.tables import HANDLERS
from prunekit.structure.handlers import ops
from prunekit.structure.trace.tracer import run_traced


class _Dense(nn.Module):
    """DenseNet-like: each conv reads the concatenation of all the features before it."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.a, self.b = nn.Conv2d(4, 2, 3, padding=1), nn.Conv2d(6, 2, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Conv2d(9, 5, 1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        x = torch.cat([x, self.a(x)], 1)
        x = self.norm(torch.cat((x, self.b(x)), dim=1))
        return self.head(torch.cat([x, x.mean(1, keepdim=True)], 1))  # a part of no channel


def _labels_into(model: nn.Module, layer: nn.Module, x: Tensor) -> Tensor:
    """The traced labels of the input `layer` gets."""
    seen: dict[str, Tensor] = {}

    def keep(_: nn.Module, args: Any) -> None:
        seen["x"] = args[0]

    handle = layer.register_forward_pre_hook(keep)
    tr, _ = run_traced(model, (x,), {}, HANDLERS)
    handle.remove()
    found = tr.label(seen["x"])
    assert found is not None
    return found


def test_a_concatenation_of_broadcast_labels_stays_broadcast() -> None:
    torch.manual_seed(0)
    model, x = _Dense().eval(), torch.randn(1, 3, 6, 5)
    labels = _labels_into(model, model.norm, x)
    assert labels.shape == (1, 8, 6, 5) and labels.stride()[2:] == (0, 0)
    assert labels[0, :, 0, 0].tolist() == labels[0, :, 5, 4].tolist()


def _same_as_replayed(
    monkeypatch: pytest.MonkeyPatch,
    model: nn.Module,
    x: Tensor,
    layer: nn.Module,
    *shortcuts: str,
) -> Tensor:
    """The labels reaching `layer` with the handler shortcuts `ops.<shortcut>` and with them
    turned off (the op replayed on every value's id, or taken by the general path): equal,
    and the same groups. Returns the labels without the shortcuts."""
    fast = graph_frozen.summary(model, prunekit.channel_groups(model, x))
    fast_labels = _labels_into(model, layer, x)
    for shortcut in shortcuts:
        off = None if shortcut in ("_cat", "_rolled_broadcast") else False
        monkeypatch.setattr(ops, shortcut, lambda *args, off=off: off)
    replayed = _labels_into(model, layer, x)
    assert torch.equal(fast_labels, replayed)
    assert graph_frozen.summary(model, prunekit.channel_groups(model, x)) == fast
    return replayed


def test_the_broadcast_concatenation_gives_the_groups_of_a_replayed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model, x = _Dense().eval(), torch.randn(1, 3, 6, 5)
    replayed = _same_as_replayed(monkeypatch, model, x, model.norm, "_cat", "_cat_channels")
    assert replayed.stride()[2:] != (0, 0)  # the replay materializes every value's id


def test_joined_channel_ids_give_the_labels_and_groups_of_the_broadcast_concatenation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model, x = _Dense().eval(), torch.randn(1, 3, 6, 5)
    kept = _same_as_replayed(monkeypatch, model, x, model.norm, "_cat_channels")
    assert kept.stride()[2:] == (0, 0)  # the other shortcut still keeps them broadcast


class _Scaled(nn.Module):
    """Residual adds, a per-channel scale parameter and a squeeze-excitation gate."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.conv = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1)
        self.scale = nn.Parameter(torch.rand(6, 1, 1))
        self.gate, self.head = nn.Conv2d(6, 6, 1), nn.Conv2d(6, 4, 1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        x = x + self.scale * self.conv(x)
        x = x * torch.sigmoid(self.gate(x.mean((2, 3), keepdim=True)))
        return self.head(torch.relu(x + x))


def test_channelwise_binary_ops_give_the_labels_and_groups_of_the_general_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Operands with one id per channel along one dim are merged pairwise as vectors: the
    labels and groups the general path (broadcast labels, spread checks) gives."""
    torch.manual_seed(0)
    model, x = _Scaled().eval(), torch.randn(1, 3, 5, 5)
    general = _same_as_replayed(monkeypatch, model, x, model.head, "_channelwise")
    assert general.stride()[2:] == (0, 0)
    (merged,) = [g for g in prunekit.channel_groups(model, x) if g.prunable]
    makers = {s.qualified for s in merged.slices if s.role in ("out", "element")}
    assert makers == {"stem.weight", "conv.weight", "gate.weight", "scale"}  # all one group


class _Shifted(nn.Module):
    """A shifted window's residual: tokens rolled along the spatial dims, channels last."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.mix = nn.Linear(3, 4), nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.embed(x)
        shifted = torch.roll(x, shifts=(-1, -2), dims=(1, 2))
        rolled = self.mix(shifted).roll(1, 2)  # one dim, given positionally
        return torch.roll(x + rolled, (1, 1), (1, 2)) + torch.roll(x, 2)  # all dims: flattened


def test_a_roll_along_broadcast_dims_gives_the_groups_of_a_replayed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model, x = _Shifted().eval(), torch.randn(1, 5, 6, 3)
    assert _labels_into(model, model.mix, x).stride()[1:3] == (0, 0)
    replayed = _same_as_replayed(monkeypatch, model, x, model.mix, "_rolled_broadcast")
    assert replayed.stride()[1:3] != (0, 0)  # the replay materializes every value's id
