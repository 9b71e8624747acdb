"""prunekit.core.checks.refuse_shared: the one check that a second model (a teacher, a
reference) holds none of the parameters a call trains, which recover and reconstruct_blocks
both run, each naming itself and its own parameter."""

from __future__ import annotations

import copy

import pytest
from torch import nn

from prunekit.core.checks import refuse_shared

HEAD = "owner: invalid other: it"
TAIL = "so it would move too; expected a copy"


def test_a_parameter_held_by_both_is_named_on_both_sides() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    other = nn.ModuleDict({"first": copy.deepcopy(model[0]), "second": model[1]})
    with pytest.raises(ValueError) as raised:
        refuse_shared(model, other, "model", HEAD, TAIL)
    assert str(raised.value) == (
        "owner: invalid other: it shares the parameter '1.weight' with the model (as its "
        "'second.weight'), so it would move too; expected a copy"
    )


def test_only_the_parameters_trained_are_checked_when_given() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    other = nn.Sequential(model[0], copy.deepcopy(model[1]))
    refuse_shared(model, other, "model", HEAD, TAIL, trained=list(model[1].parameters()))
    refuse_shared(model, copy.deepcopy(model), "model", HEAD, TAIL)
    with pytest.raises(ValueError, match=r"^owner: invalid other: it shares the parameter "
                       r"'0\.weight' with the student \(as its '0\.weight'\)"):  # fmt: skip
        refuse_shared(model, other, "student", HEAD, TAIL, trained=list(model.parameters()))
