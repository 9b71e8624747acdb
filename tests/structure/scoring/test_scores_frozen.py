"""Every built-in group criterion gives, bit for bit, the scores a known-good build gave
(helpers/scores_frozen.json, written by helpers/scores_frozen.py) on a small MLP,
convolutions (batch norm, grouped, depthwise), a small LLaMA and a small Mixtral: with and
without calibration batches, from ``.grad`` and from a loss. Close is not enough: the
ranking of tied or near-tied units, and so the pruned model, follows the last bit."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

from helpers import scores_frozen

FROZEN: dict[str, Any] = json.loads(scores_frozen.FILE.read_text())
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


@pytest.mark.parametrize("name", list(scores_frozen.CASES))
def test_group_scores_match_the_frozen_ones_bit_for_bit(name: str) -> None:
    if name in ("llama", "mixtral") and not HAS_TRANSFORMERS:
        pytest.skip("needs transformers (the hf extra)")
    found = scores_frozen.compute(name)
    assert list(found) == list(FROZEN[name])
    for criterion, groups in FROZEN[name].items():
        assert found[criterion] == groups, f"{name}, criterion {criterion!r}"
