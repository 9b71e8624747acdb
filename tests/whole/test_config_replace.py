"""dataclasses.replace on a whole.Config: the copy is the Config its explicit fields make, so
a default that follows the method (`pattern`, `sequential`) follows the new method."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from torch import nn

import prunekit as prune
from prunekit.whole import Config
from prunekit.whole.registry import METHODS, default_pattern, default_sequential

PAIRS = list(itertools.permutations(METHODS, 2))


@pytest.mark.parametrize(("first", "then"), PAIRS)
def test_a_replaced_method_takes_the_new_methods_defaults(first: str, then: str) -> None:
    replaced = dataclasses.replace(Config(method=first, amount=0.5), method=then)
    fresh = Config(method=then, amount=0.5)
    assert replaced == fresh
    assert replaced.chosen_pattern == fresh.chosen_pattern == default_pattern(then, "layer")
    assert replaced.chosen_sequential == fresh.chosen_sequential == default_sequential(then, False)


@pytest.mark.parametrize(("first", "then"), [("wanda", "sparsegpt"), ("sparsegpt", "wanda")])
def test_a_replaced_method_keeps_what_was_given(first: str, then: str) -> None:
    given = Config(method=first, amount=0.5, pattern="row", sequential=True)
    replaced = dataclasses.replace(given, method=then)
    assert replaced == Config(method=then, amount=0.5, pattern="row", sequential=True)
    assert (replaced.chosen_pattern, replaced.chosen_sequential) == ("row", True)


def test_a_replaced_scope_takes_its_default_pattern_and_is_checked_when_made() -> None:
    wanda = Config(method="wanda", amount=0.5, sequential=False)
    replaced = dataclasses.replace(wanda, scope="global")
    assert replaced == Config(method="wanda", amount=0.5, sequential=False, scope="global")
    assert replaced.chosen_pattern == "unstructured"
    with pytest.raises(ValueError, match=r"^Config: scope='global' .*pattern='row'"):
        dataclasses.replace(wanda, scope="global", pattern="row")
    with pytest.raises(ValueError, match=r"^Config: scope='global' .*sequential=True"):
        dataclasses.replace(wanda, scope="global", sequential=True)
    # not given: Wanda's global ranking takes one pass
    assert dataclasses.replace(wanda, scope="global", sequential=None).chosen_sequential is False
    with pytest.raises(ValueError, match=r"^Config: scope='global' .*method='sparsegpt'"):
        Config(method="sparsegpt", amount=0.5, scope="global")


def test_a_default_sequential_follows_the_ranks_and_one_given_stays() -> None:
    assert Config(method="sparsegpt").over_ranks(True, "x").chosen_sequential is True
    assert Config(method="sparsegpt").over_ranks(False, "x").chosen_sequential == "layers"
    assert Config(method="sparsegpt", sequential=True).over_ranks(False, "x").chosen_sequential
    made = dataclasses.replace(Config(method="sparsegpt"), ranks=True)
    assert made.chosen_sequential is True and made.over_ranks(False, "x").chosen_sequential


def test_a_replaced_config_prunes_as_a_fresh_one() -> None:
    def pruned(config: Config) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        batches = [torch.randn(4, 16, generator=torch.Generator().manual_seed(i)) for i in range(2)]
        prune.prune_model(model, config=config, calibration=batches)
        return {k: v for k, v in model.state_dict().items() if k.endswith("_mask")}

    fresh = pruned(Config(method="sparsegpt", amount=0.5, progress=False))
    replaced = pruned(
        dataclasses.replace(Config(method="wanda", amount=0.5, progress=False), method="sparsegpt")
    )
    assert fresh and fresh.keys() == replaced.keys()
    assert all(torch.equal(fresh[k], replaced[k]) for k in fresh)
