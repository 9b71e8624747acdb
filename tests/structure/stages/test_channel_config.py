"""ChannelConfig: every option of prune_channels checked once, when made; prune_channels(...,
config=...) masks as the same keywords do, and refuses a config beside keywords."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from helpers.model_state import fingerprint
from prunekit.structure.stages import ChannelConfig, ChannelOptions


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))


def batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(16, 6, generator=gen) for _ in range(3)]


def masks(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if k.endswith(("_mask", "_orig"))}


def test_the_keywords_are_the_config_fields() -> None:
    fields = [f.name for f in dataclasses.fields(ChannelConfig) if f.init]
    assert fields[0] == "amount"
    assert set(fields[1:]) == set(ChannelOptions.__optional_keys__)


@pytest.mark.parametrize(
    "options",
    [
        {"amount": 0.5},
        {"amount": 0.5, "criterion": "l1", "scope": "global", "exclude": ["4"]},
        {"amount": 0.5, "criterion": "activation", "compensate": True, "damping": 0.1},
        {"budget": prunekit.Budget(params=0.3)},
    ],
)
def test_a_config_masks_as_its_keywords_do(options: dict[str, Any]) -> None:
    if options.get("compensate") or options.get("criterion") == "activation":
        options = {**options, "calibration": batches()}
    by_keywords, by_config = mlp(), mlp()
    x = torch.randn(2, 6)
    found = prunekit.prune_channels(by_keywords, x, **options)
    again = prunekit.prune_channels(by_config, x, config=ChannelConfig(**options))
    assert [(p.group.name, p.units) for p in found] == [(p.group.name, p.units) for p in again]
    assert type(found) is type(again)
    one, other = masks(by_keywords), masks(by_config)
    assert list(one) == list(other) and one
    for name, value in one.items():
        assert torch.equal(value, other[name]), name


def test_a_config_is_frozen_and_reused_with_its_batches_kept() -> None:
    def generated() -> Iterator[torch.Tensor]:
        yield from batches()

    config = ChannelConfig(0.5, criterion="activation", calibration=generated())
    assert isinstance(config.calibration, tuple) and len(config.calibration) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.amount = 0.2  # type: ignore[misc]
    first, second = mlp(), mlp()
    x = torch.randn(2, 6)
    a = prunekit.prune_channels(first, x, config=config)
    b = prunekit.prune_channels(second, x, config=config)
    assert [p.units for p in a] == [p.units for p in b]
    changed = dataclasses.replace(config, amount=0.25)
    assert changed.amount == 0.25 and changed.calibration == config.calibration


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"amount": 1.0}, ValueError, r"prune_channels: invalid amount=1.0; expected a float"),
        ({"heads": True}, ValueError, r"prune_channels: invalid heads=True"),
        ({"scope": "model"}, ValueError, r"prune_channels: invalid scope='model'"),
        ({"round_to": 0}, ValueError, r"prune_channels: invalid round_to=0"),
        ({"criterion": "l3"}, ValueError, r"prune_channels: unknown criterion='l3'"),
        ({"criterion": 3}, TypeError, r"prune_channels: invalid criterion=3"),
        ({"criterion": "activation"}, ValueError, r"needs calibration data"),
        ({"compensate": True}, ValueError, r"compensate=True needs calibration data"),
        ({"compensate": 1}, TypeError, r"invalid compensate=1"),
        ({"damping": 0.1}, ValueError, r"damping=0.1 needs compensate=True"),
        ({"budget": 0.2}, TypeError, r"invalid budget=0.2"),
        ({"budget": prunekit.Budget(params=0.2), "amount": 0.5}, ValueError, r"chooses the"),
        ({"exclude": ["a"], "ignore": ["b"]}, ValueError, r"ignore= is the old name"),
    ],
)  # fmt: skip
def test_a_config_is_checked_when_made(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    warned = pytest.warns(FutureWarning) if "ignore" in options else contextlib.nullcontext()
    with pytest.raises(error, match=match), warned:
        ChannelConfig(**options)
    model = mlp()
    before = fingerprint(model)
    warned = pytest.warns(FutureWarning) if "ignore" in options else contextlib.nullcontext()
    with pytest.raises(error, match=match), warned:
        prunekit.prune_channels(model, torch.randn(2, 6), **options)
    assert fingerprint(model) == before


def test_a_config_beside_keywords_or_of_another_type_is_refused() -> None:
    model = mlp()
    before = copy.deepcopy(model.state_dict())
    x = torch.randn(2, 6)
    config = ChannelConfig(0.5)
    with pytest.raises(ValueError, match=r"config= holds every option, but amount=0.25, heads="):
        prunekit.prune_channels(model, x, 0.25, config=config, heads=0.5)
    with pytest.raises(TypeError, match=r"prune_channels: invalid config=0.5; expected a Chan"):
        prunekit.prune_channels(model, x, config=0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"prune_channels\(\) got an unexpected keyword .*'amout'"):
        prunekit.prune_channels(model, x, amout=0.5)  # type: ignore[call-arg]
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], v) for k, v in before.items())
