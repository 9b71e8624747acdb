"""core.nested: the one walk over a batch's mappings, lists and tuples, the names of the places
it finds, and the description errors give of a batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from prunekit.core.nested import LEVELS, described, leaves, tensors

T = torch.zeros(2, 3)


def test_a_tensor_batch_is_its_own_leaf() -> None:
    assert list(leaves(T)) == [("", T)]
    assert described(T) == "a tensor of shape (2, 3), torch.float32"


def test_keywords_by_name_positions_as_arguments_and_subscripts_further_in() -> None:
    ids = torch.ones(2, 4, dtype=torch.long)
    batch = {"input_ids": ids, "past": ((T, T), [T]), "inner": {"a": T}}
    places = [place for place, _ in leaves(batch)]
    assert places == ["input_ids", "past[0][0]", "past[0][1]", "past[1][0]", "inner['a']"]
    assert [place for place, _ in leaves((ids, {"b": T}))] == ["argument 0", "argument 1['b']"]
    assert tensors(batch)[0] is ids  # as given: not copied, not detached


def test_containers_are_looked_into_levels_deep_and_no_deeper() -> None:
    deepest: Any = T
    for _ in range(LEVELS):
        deepest = (deepest,)
    assert tensors(deepest) == [T]
    deeper = (deepest,)
    assert tensors(deeper) == []
    assert list(leaves(deeper)) == [("argument 0[0][0]", (T,))]


def test_tokenizer_and_model_outputs_are_mappings() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_outputs import BaseModelOutput

    encoding = transformers.BatchEncoding({"input_ids": T, "attention_mask": T})
    assert [place for place, _ in leaves(encoding)] == ["input_ids", "attention_mask"]
    output = BaseModelOutput(last_hidden_state=T, hidden_states=(T, T))
    assert [place for place, _ in leaves({"fed": output})] == [
        "fed['last_hidden_state']",
        "fed['hidden_states'][0]",
        "fed['hidden_states'][1]",
    ]


def test_a_description_shows_four_leaves_and_counts_the_rest() -> None:
    batch = {"x": T, "flag": True, "none": (), "more": [T, T, T]}
    assert described(batch) == (
        "x: a tensor of shape (2, 3), torch.float32; flag: a bool; none: an empty tuple; "
        "more[0]: a tensor of shape (2, 3), torch.float32; 2 more"
    )
    assert described({}) == "an empty dict"
    assert described(7) == "a int"
