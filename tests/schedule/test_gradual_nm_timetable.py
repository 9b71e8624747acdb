"""N:M has one sparsity, (m - n) / m: a GradualPruner whose built-in schedule reaches any
other sparsity at an update step is refused when it is made, before it touches the model;
the schedules that give that sparsity alone (or 0 first) still run."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
from helpers.model_state import fingerprint
from prunekit.schedule import GradualConfig


def small() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))


@pytest.mark.parametrize(
    ("options", "step", "amount"),
    [
        ({"schedule": "linear", "start_step": 1, "end_step": 3}, 2, "0.25"),
        ({"schedule": "cubic", "start_step": 0, "end_step": 10, "every": 5}, 5, "0.4375"),
        ({"schedule": "constant", "start_step": 0, "end_step": 4}, 0, "0.6"),
        ({"schedule": "linear", "start_step": 2, "end_step": 6, "initial_amount": 0.2}, 2, "0.2"),
    ],
)
def test_a_schedule_off_the_nm_sparsity_is_refused_when_made(
    options: dict[str, Any], step: int, amount: str
) -> None:
    final = 0.6 if options["schedule"] == "constant" else 0.5
    model = small()
    before = fingerprint(model)
    with pytest.raises(ValueError, match=rf"GradualPruner: pattern=NM\(2, 4\) prunes 0\.5 of "
                       rf"every group of 4, but the schedule gives {amount} at update step "
                       rf"{step}; expected"):  # fmt: skip
        prune.GradualPruner(model, final, pattern=prune.NM(2, 4), **options)
    with pytest.raises(ValueError, match=rf"gives {amount} at update step {step}"):
        GradualConfig(final, pattern="2:4", **options)
    assert fingerprint(model) == before


@pytest.mark.parametrize(
    "options",
    [
        {"schedule": "constant", "start_step": 1, "end_step": 3},
        {"schedule": "linear", "start_step": 2, "end_step": 2},  # one update, at its end
        {"schedule": "cubic", "start_step": 1, "end_step": 5, "every": 4},  # 0, then 0.5
        {"schedule": "linear", "start_step": 1, "end_step": 9, "initial_amount": 0.5},
    ],
)
def test_a_schedule_at_the_nm_sparsity_prunes_n_of_m(options: dict[str, Any]) -> None:
    model = small()
    pruner = prune.GradualPruner(model, 0.5, pattern=prune.NM(2, 4), **options)
    for _ in range(10):
        pruner.step()
    assert pruner.amount == 0.5
    for layer in (model[0], model[2]):
        groups = layer.weight_mask.reshape(-1, 4)
        assert torch.equal(groups.sum(1), torch.full((groups.shape[0],), 2.0))


def test_no_pruning_at_all_is_no_conflict() -> None:
    pruner = prune.GradualPruner(small(), 0.0, pattern=prune.NM(2, 4), start_step=0, end_step=3)
    pruner.step()
    assert pruner.amount == 0.0


def test_a_callable_schedule_is_still_checked_at_the_step() -> None:
    """What a callable gives is known only when it is called: its step refuses it."""
    model = small()
    pruner = prune.GradualPruner(model, 0.5, pattern=prune.NM(2, 4), start_step=1, end_step=3,
                                 schedule=lambda step: 0.25)  # fmt: skip
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"NM\(2, 4\) prunes 0\.5 .* scheduled sparsity 0\.25"):
        pruner.step()
    assert pruner.steps == 0 and fingerprint(model) == before


def test_a_tensor_the_nm_groups_do_not_divide_is_refused_when_made() -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"GradualPruner \(4\.weight\): NM\(2, 4\) groups 4 "
                       r"consecutive entries along dim 1, whose size 6 \(shape \(2, 6\)\) is not "
                       r"a multiple of 4"):  # fmt: skip
        prune.GradualPruner(model, 0.5, pattern="2:4", schedule="constant", start_step=5,
                            end_step=9)  # fmt: skip
    assert fingerprint(model) == before
    prune.GradualPruner(model, 0.5, pattern="2:4", schedule="constant", start_step=5,
                        end_step=9, exclude=("4.*",))  # fmt: skip
