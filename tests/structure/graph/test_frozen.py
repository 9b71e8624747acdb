"""Differential against frozen groups: ``channel_groups`` gives, group for group and field for
field, the groups a known-good build gave (tests/helpers/graph_frozen.json, written by
tests/helpers/graph_frozen.py) on torchvision models, a masked ResNet-18, a small ViT and small
Hugging Face configs (LLaMA with grouped-query heads by query and by group, BERT, GPT-2,
Mixtral)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from helpers import graph_frozen

FROZEN: dict[str, Any] = json.loads(graph_frozen.FILE.read_text())


@pytest.fixture(scope="module")
def vision() -> Any:
    found = pytest.importorskip("helpers.vision")
    try:
        return found.torchvision_models()
    except ImportError as error:  # torchvision not installed
        pytest.skip(f"torchvision: {error}")


def _compare(name: str, found: dict[str, Any]) -> None:
    frozen = [tuple(row) for row in FROZEN[name]["groups"]]
    now = [tuple(row) for row in found["groups"]]
    for k, (before, after) in enumerate(zip(frozen, now, strict=False)):
        assert after == before, f"{name}: group {k} differs: {after} (frozen: {before})"
    assert len(now) == len(frozen), f"{name}: {len(now)} groups (frozen: {len(frozen)})"


@pytest.mark.torchvision
@pytest.mark.parametrize("name", [*graph_frozen.VISION, "vit_small", "resnet18_masked"])
def test_vision_groups_equal_the_frozen_ones(vision: Any, name: str) -> None:
    _compare(name, graph_frozen.compute(graph_frozen.cases(vision)[name]))


@pytest.mark.parametrize("name", graph_frozen.TRANSFORMERS)
def test_transformers_groups_equal_the_frozen_ones(name: str) -> None:
    pytest.importorskip("transformers")
    _compare(name, graph_frozen.compute(graph_frozen.cases(None)[name]))


def test_a_changed_index_is_found() -> None:
    """The digest sees one changed position of one slice, in that group only."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 5, 3)).eval()
    groups = prunekit.channel_groups(model, torch.randn(1, 3, 8, 8))
    first = groups[0].slices[0]
    moved = replace(first, indices=(first.indices[1], first.indices[0], *first.indices[2:]))
    changed = [replace(groups[0], slices=(moved, *groups[0].slices[1:])), *groups[1:]]
    before, after = graph_frozen.summary(model, groups), graph_frozen.summary(model, changed)
    assert before["groups"][0][2] != after["groups"][0][2]
    assert before["groups"][1:] == after["groups"][1:]
