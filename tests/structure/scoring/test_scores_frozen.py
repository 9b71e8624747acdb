"""Every built-in group criterion gives the scores a known-good build gave
(helpers/scores_frozen.json, written by helpers/scores_frozen.py) on a small MLP,
convolutions (batch norm, grouped, depthwise), a small LLaMA and a small Mixtral: with and
without calibration batches, from ``.grad`` and from a loss. Within a thousandth of
each group's largest score (scores_frozen.RTOL): the last bits differ from one CPU to another."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

from helpers import scores_frozen

FROZEN: dict[str, Any] = json.loads(scores_frozen.FILE.read_text())
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


@pytest.mark.parametrize("name", list(scores_frozen.CASES))
def test_group_scores_match_the_frozen_ones(name: str) -> None:
    if name in ("llama", "mixtral") and not HAS_TRANSFORMERS:
        pytest.skip("needs transformers (the hf extra)")
    found = scores_frozen.compute(name)
    assert list(found) == list(FROZEN[name])
    for criterion, groups in FROZEN[name].items():
        assert [g for g, _ in found[criterion]] == [g for g, _ in groups], criterion
        for (group, scores), (_, frozen) in zip(found[criterion], groups, strict=True):
            why = scores_frozen.differences(scores, frozen)
            assert why is None, f"{name}, criterion {criterion!r}, group {group}: {why}"


def test_a_moved_score_or_a_nan_is_a_difference() -> None:
    frozen = [1.0, 2.0, 4.0]
    assert scores_frozen.differences([1.0, 2.0, 4.0 + 1e-4], frozen) is None
    assert scores_frozen.differences([1.0, 2.01, 4.0], frozen) is not None
    assert scores_frozen.differences([1.0, float("nan"), 4.0], frozen) is not None
    assert scores_frozen.differences([1.0, 2.0], frozen) is not None
