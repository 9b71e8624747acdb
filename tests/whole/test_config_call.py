"""prune_model(config=...): one Config in place of the keywords, which still work as before."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
from prunekit.whole import Config


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 4))


def masks(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if k.endswith("_mask")}


@pytest.mark.parametrize(
    "options",
    [
        {"method": "l1", "scope": "global", "exclude": ("3.*",)},
        {"method": "ln", "include": "0.weight"},
        {"method": "random", "pattern": "unstructured"},
    ],
)
def test_a_config_prunes_as_its_keywords_do(options: dict[str, Any]) -> None:
    by_keywords, by_config = mlp(), mlp()
    torch.manual_seed(1)
    prune.prune_model(by_keywords, 0.5, **options)
    torch.manual_seed(1)
    prune.prune_model(by_config, config=Config(amount=0.5, **options))
    expected = masks(by_keywords)
    assert expected and masks(by_config).keys() == expected.keys()
    for name, mask in masks(by_config).items():
        assert torch.equal(mask, expected[name]), name


def test_a_config_takes_the_options_the_keywords_do_not() -> None:
    model = mlp()
    prune.prune_model(
        model, config=Config(method="ln", amount=0.25, n=1, dim=1, include=("0.weight",))
    )
    columns = model[0].weight_mask.sum(dim=0)  # dim=1: whole input columns go
    assert set(columns.tolist()) == {0.0, 32.0}
    assert int((columns == 0).sum()) == 4  # a quarter of the 16 input columns


def test_errors_of_a_config_made_by_hand_name_prune_model() -> None:
    config = Config(method="ln", amount=0.5)
    with pytest.raises(ValueError, match=r"^prune_model: method='ln' prunes whole output channels"):
        prune.prune_model(mlp(), config=dataclasses.replace(config, scope="global"))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        ({"amount": 0.5, "config": Config(amount=0.5)}, ValueError,
         r"prune_model: config= holds every option, but amount=0.5 came beside it"),
        ({"config": Config(amount=0.5), "method": "l1"}, ValueError,
         r"prune_model: config= holds every option, but method= came beside it"),
        ({"config": {"amount": 0.5}}, TypeError, r"prune_model: invalid config=\{'amount': 0.5\}"),
        ({}, TypeError, r"prune_model: amount=None; expected the fraction to prune"),
        ({"amount": 0.5, "damp": 0.1}, TypeError, r"unexpected keyword argument 'damp'"),
        ({"amount": 0.5, "mehtod": "l1"}, TypeError, r"unexpected keyword argument 'mehtod'"),
    ],
)  # fmt: skip
def test_bad_calls_are_refused_and_leave_the_model_alone(
    call: dict[str, Any], error: type[Exception], message: str
) -> None:
    model = mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=message):
        prune.prune_model(model, **call)
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], v) for k, v in before.items())
