"""core.nested: the one walk over a batch's mappings, lists and tuples, the names of the places
it finds, and the description errors give of a batch."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from prunekit.core.nested import LEVELS, described, first_not_finite, is_numeric, leaves, tensors

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


def test_a_complex_value_with_a_part_not_finite_is_not_finite() -> None:
    """One rule for the batches of calibration and recover: a complex tensor is finite when
    both its parts are; a meta tensor and integers hold nothing to check."""
    bad = torch.zeros(2, 3, dtype=torch.complex64)
    bad[1, 2] = torch.tensor(complex(1.0, math.nan))
    batch = {"ids": torch.ones(2, dtype=torch.long), "meta": T.to("meta"), "z": (T, bad)}
    assert first_not_finite(batch) == "(1+nanj) at index (1, 2) of z[1]"
    assert first_not_finite({"z": bad.real, "x": T}) is None
    infinite = torch.full((3,), complex(math.inf, 0.0))
    assert first_not_finite(infinite) == "(inf+0j) at index (0,)"
    assert not is_numeric(T.to("meta")) and not is_numeric(torch.ones(2, dtype=torch.long))
    assert is_numeric(bad) and is_numeric(T) and not is_numeric(3.0)


class _Magnitude(nn.Module):
    """A model of complex inputs (a spectrum): a Linear of their magnitudes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(z.abs())
        return out


def test_calibration_does_not_blame_the_loss_for_a_complex_batch_not_finite() -> None:
    """Taylor's check of the loss took a complex batch for finite (it looked at floating
    tensors only) and blamed the loss "with finite parameters and inputs"; the batch holds a
    NaN, as recover's check of the same batch says, and it is refused as a real one is."""
    model = _Magnitude()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    z = torch.randn(2, 4, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    z[1, 3] = torch.tensor(complex(0.5, math.nan))
    # as a real batch holding a NaN: the NaN gradients' scores are refused by name
    for batch in (z, z.abs()):
        with pytest.raises(ValueError, match=r"^'fc\.weight'.*scores hold 12 value\(s\) that "
                           r"cannot be ranked, e\.g\. nan"):  # fmt: skip
            prunekit.prune_model(model, 0.5, method="taylor", calibration=[batch],
                                 loss=lambda output, batch: output.pow(2).sum())  # fmt: skip
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    finite = z.clone()
    finite[1, 3] = 0.5
    with pytest.raises(ValueError, match="with finite parameters and inputs"):
        prunekit.prune_model(model, 0.5, method="taylor", calibration=[finite],
                             loss=lambda output, batch: output.sum() * math.nan)  # fmt: skip
