"""A seed is checked as the other integer arguments are (check_number(..., integral=True)):
a numpy integer scalar is taken as the int it holds, a numpy float or a bool is not; the
configs hold the plain int, which torch.Generator.manual_seed (that takes no numpy int) and
a JSON report take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import prunekit
from helpers.gradual_models import Small
from prunekit.io.statedict import prune_state_dict
from prunekit.schedule import GradualConfig
from prunekit.tools.shrink import ShrinkConfig

INTEGERS = [np.int64(5), np.int32(5), np.uint64(5), np.int8(5)]
NOT_INTEGERS = [np.float64(5.0), np.bool_(True), True, 5.0]


def shrink_config(tmp_path: Path, seed: Any) -> ShrinkConfig:
    return ShrinkConfig(tmp_path / "model", tmp_path / "out", params=0.25, seed=seed)


@pytest.mark.parametrize("seed", INTEGERS, ids=repr)
def test_a_numpy_integer_seeds_prune_state_dict_as_its_int(seed: Any) -> None:
    state = {"w": torch.arange(1.0, 65.0).reshape(8, 8)}
    got = prune_state_dict(state, 0.5, method="random", include=["w"], seed=seed)
    want = prune_state_dict(state, 0.5, method="random", include=["w"], seed=5)
    assert got.pruned == ["w"] and torch.equal(got.state["w"], want.state["w"])


@pytest.mark.parametrize("seed", INTEGERS, ids=repr)
def test_a_numpy_integer_seed_is_held_as_its_int_by_shrink_config(
    tmp_path: Path, seed: Any
) -> None:
    config = shrink_config(tmp_path, seed)
    assert type(config.seed) is int and config.seed == 5
    torch.Generator().manual_seed(config.seed)  # what the distillation draws windows with


@pytest.mark.parametrize("seed", INTEGERS, ids=repr)
def test_a_numpy_integer_seeds_a_gradual_pruner_as_its_int(seed: Any) -> None:
    found = []
    for given in (seed, 5):
        torch.manual_seed(0)
        model = Small()
        prunekit.GradualPruner(model, 0.5, start_step=0, end_step=0, method="random", seed=given)
        found.append({k: v.clone() for k, v in model.state_dict().items() if k.endswith("_mask")})
    assert found[0].keys() == found[1].keys() and found[0]
    assert all(torch.equal(found[0][k], found[1][k]) for k in found[1])
    config = GradualConfig(0.5, 0, 0, seed=seed)
    assert type(config.seed) is int and config.seed == 5


def test_the_ends_of_the_range_are_taken_as_numpy_integers(tmp_path: Path) -> None:
    # numpy's int64 and uint64 hold nothing beyond what torch takes: none is out of range
    assert shrink_config(tmp_path, np.uint64(2**64 - 1)).seed == 2**64 - 1
    assert GradualConfig(0.5, 0, 0, seed=np.int64(-(2**63))).seed == -(2**63)


@pytest.mark.parametrize("seed", NOT_INTEGERS, ids=repr)
def test_a_numpy_float_or_a_bool_is_still_refused(tmp_path: Path, seed: Any) -> None:
    kind = type(seed).__name__
    with pytest.raises(TypeError, match=rf"ShrinkConfig: invalid seed=.* of type {kind}; "):
        shrink_config(tmp_path, seed)
    state = {"w": torch.ones(4)}
    with pytest.raises(TypeError, match=rf"prune_state_dict: invalid seed=.* of type {kind}; "):
        prune_state_dict(state, 0.5, method="random", include=["w"], seed=seed)
    with pytest.raises(TypeError, match=r"GradualPruner: invalid seed="):
        GradualConfig(0.5, 0, 0, seed=seed)
    assert torch.equal(state["w"], torch.ones(4))


def test_a_gradual_seed_too_long_to_print_is_refused_in_words() -> None:
    # the pruner's own check formatted it with repr, which Python refuses past 4300 digits
    words = r"^GradualPruner: invalid seed=1000\d+\.\.\. \(5001 digits\), out of range; expected"
    with pytest.raises(ValueError, match=words):
        GradualConfig(0.5, 0, 0, seed=10**5000)
