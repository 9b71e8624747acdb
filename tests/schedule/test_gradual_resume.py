"""A run interrupted and resumed from the state_dicts ends with the same masks and weights,
bit for bit; a state that does not fit the pruner is refused and changes nothing."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
from helpers.gradual_models import Small, train_step

STEPS = 14


def setup(seed: int = 0, **kw: Any) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = Small()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-3)
    args = {"start_step": 2, "end_step": 11, "every": 3, **kw}
    return model, optimizer, prune.GradualPruner(model, 0.9, **args)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, pruner: Any, steps: range) -> None:
    for i in steps:
        train_step(model, optimizer, i)
        pruner.step()


def checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, pruner: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "pruner": pruner.state_dict(),
        },
        buffer,
    )
    return buffer.getvalue()


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"scope": "global"},
        {"method": "random"},
        {"method": "random", "scope": "global"},
        {"method": "ln", "include": ("conv.weight", "fc1.weight")},
    ],
    ids=["l1", "l1-global", "random", "random-global", "channels"],
)
@pytest.mark.parametrize("stop", [1, 6])
def test_resumed_run_ends_bit_for_bit(kw: dict[str, Any], stop: int) -> None:
    model, optimizer, pruner = setup(**kw)
    train(model, optimizer, pruner, range(1, stop + 1))
    saved = checkpoint(model, optimizer, pruner)
    train(model, optimizer, pruner, range(stop + 1, STEPS + 1))

    # A fresh process: new model, optimizer and pruner (another global seed), then the files.
    again, again_optimizer, again_pruner = setup(seed=123, **kw)
    state = torch.load(io.BytesIO(saved), weights_only=True)
    again_pruner.load_state_dict(state["pruner"])  # masks first: the model's keys need them
    again.load_state_dict(state["model"])
    again_optimizer.load_state_dict(state["optimizer"])
    assert again_pruner.steps == stop
    updates = [s for s in range(stop + 1) if pruner.timetable.is_update(s)]
    assert again_pruner.amount == (pruner.amount_at(updates[-1]) if updates else 0.0)
    train(again, again_optimizer, again_pruner, range(stop + 1, STEPS + 1))

    ours, theirs = model.state_dict(), again.state_dict()
    assert list(ours) == list(theirs)
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert prune.report(again)["fc1.weight"].method == prune.report(model)["fc1.weight"].method


def test_state_dict_of_a_live_pruner_loads_into_itself() -> None:
    model, optimizer, pruner = setup(method="random")
    train(model, optimizer, pruner, range(1, 6))
    state = copy.deepcopy(pruner.state_dict())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pruner.load_state_dict(state)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(state["masks"][k].dtype == torch.bool for k in state["masks"])


def _saved() -> dict[str, Any]:
    model, optimizer, pruner = setup()
    train(model, optimizer, pruner, range(1, 6))
    return pruner.state_dict()


SAVED = _saved()


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda s: s.pop("steps"), "the state lacks ['steps']"),
        (lambda s: s.update(version=7), "has version 7"),
        (lambda s: s["setup"].update(final_amount=0.5), "saved with final_amount=0.5"),
        (lambda s: s["setup"].update(method="Random"), "saved with method='Random'"),
        (lambda s: s["setup"].update(targets=["x"]), "saved with targets=['x']"),
        (lambda s: s.update(steps=-1), "invalid steps=-1"),
        (lambda s: s["masks"].update({"fc1.weight": torch.ones(2, 2)}), "has shape (2, 2)"),
        (lambda s: s.update(generator=torch.zeros(3)), "invalid generator state"),
    ],
)
def test_a_state_that_does_not_fit_changes_nothing(change: Any, words: str) -> None:
    state = copy.deepcopy(SAVED)
    change(state)
    fresh, _, fresh_pruner = setup()
    with pytest.raises(ValueError, match=r"^GradualPruner.load_state_dict: ") as caught:
        fresh_pruner.load_state_dict(state)
    assert words in str(caught.value)
    assert not prune.is_pruned(fresh) and fresh_pruner.steps == 0
    with pytest.raises(TypeError, match="invalid state of type list"):
        fresh_pruner.load_state_dict([])  # type: ignore[arg-type]
