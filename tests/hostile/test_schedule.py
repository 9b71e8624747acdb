"""Hostile states for GradualPruner.load_state_dict, and resumes the earlier rounds left out:
a state the pruner could never have saved is refused by its value and nothing changes; a run
resumed where the masks of emptied channels' biases follow, or from before the first step,
ends bit for bit as the run that never stopped."""

from __future__ import annotations

import copy
import io
import math
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from helpers.gradual_models import Small, batch, train_step
from hostile.support import refused

STEPS = 12


def setup(seed: int = 0, prepare: bool = False, **kw: Any) -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(seed)
    model = Small()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    args = {"start_step": 2, "end_step": 9, "every": 3, **kw}
    pruner = prunekit.GradualPruner(model, 0.8, **args)
    if prepare:
        pruner.prepare()
    return model, optimizer, pruner


def train(model: nn.Module, optimizer: Any, pruner: Any, steps: range) -> None:
    for i in steps:
        train_step(model, optimizer, i)
        pruner.step()


# --- states no pruner saves -------------------------------------------------------------------


def saved() -> dict[str, Any]:
    model, optimizer, pruner = setup()
    train(model, optimizer, pruner, range(1, 6))
    return pruner.state_dict()


@pytest.mark.parametrize(
    ("amount", "error", "match"),
    [
        (0.95, ValueError, r"invalid amount=0\.95; expected a float in \[0, final_amount=0\.8\]"),
        (True, TypeError, r"invalid amount=True of type bool; expected a float in \[0, "),
    ],
    ids=["above-final", "bool"],
)
def test_an_amount_no_pruner_reaches_is_refused(
    amount: Any, error: type[Exception], match: str
) -> None:
    """A state whose amount is above final_amount (0.95 of a pruner to 0.8) was loaded, and
    every later update pruned to 0.95, past the sparsity asked; True was read as 1.0."""
    state = copy.deepcopy(saved())
    state["amount"] = amount
    model, _, pruner = setup(seed=1)
    refused(
        lambda: pruner.load_state_dict(state),
        error,
        rf"^GradualPruner\.load_state_dict: {match}",
        model=model,
    )
    assert pruner.steps == 0 and pruner.amount == 0.0


def test_the_final_amount_itself_loads() -> None:
    """The bound is final_amount itself: a state at the end of its schedule loads (the
    guard beside the refusal above)."""
    model, optimizer, pruner = setup()
    train(model, optimizer, pruner, range(1, STEPS + 1))
    state = pruner.state_dict()
    assert state["amount"] == 0.8
    _, _, again = setup(seed=1)
    again.load_state_dict(state)
    assert again.amount == 0.8 and again.steps == STEPS


# --- resumes ----------------------------------------------------------------------------------


def resumed_equals_uninterrupted(stop: int, prepare: bool, **kw: Any) -> None:
    model, optimizer, pruner = setup(prepare=prepare, **kw)
    train(model, optimizer, pruner, range(1, stop + 1))
    buffer = io.BytesIO()
    torch.save(
        {"model": model.state_dict(), "opt": optimizer.state_dict(), "pruner": pruner.state_dict()},
        buffer,
    )
    train(model, optimizer, pruner, range(stop + 1, STEPS + 1))

    again, again_optimizer, again_pruner = setup(seed=7, prepare=prepare, **kw)
    state = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    again_pruner.load_state_dict(state["pruner"])
    again.load_state_dict(state["model"])
    again_optimizer.load_state_dict(state["opt"])
    train(again, again_optimizer, again_pruner, range(stop + 1, STEPS + 1))
    ours, theirs = model.state_dict(), again.state_dict()
    assert list(ours) == list(theirs)
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.parametrize("prepare", [False, True], ids=["plain", "prepared"])
@pytest.mark.parametrize("stop", [0, 3, 5])
def test_a_resume_with_companion_masks_ends_bit_for_bit(stop: int, prepare: bool) -> None:
    """Channels pruned with example_inputs (the biases of emptied channels masked too),
    stopped before any step, at an update step, and between two."""
    options = {"method": "ln", "include": ("conv.weight", "fc1.weight")}
    resumed_equals_uninterrupted(stop, prepare, example_inputs=(batch(0)[0],), **options)


@pytest.mark.parametrize("stop", [0, 1, 4])
def test_a_resume_of_a_pruner_that_updates_when_made_ends_bit_for_bit(stop: int) -> None:
    """start_step=0: the pruner prunes when it is made (the fresh pruner of the resumed run
    too, with another seed), then loads the state."""
    resumed_equals_uninterrupted(stop, False, start_step=0, method="random", scope="global")


# --- a state of another set-up ----------------------------------------------------------------


def pruned(pattern: str | prunekit.Pattern) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = Small()
    options: dict[str, Any] = {"start_step": 1, "end_step": 4, "schedule": "constant"}
    pruner = prunekit.GradualPruner(
        model, 0.5, include=("fc1.weight", "fc2.weight"), pattern=pattern, **options
    )
    return model, pruner


@pytest.mark.parametrize(
    ("saved_by", "loaded_by", "words"),
    [
        ("row", "unstructured", r"'PerRow\(dim=0\)'; this pruner has pattern='Unstructured\(\)'"),
        ("2:4", "unstructured", r"'NM\(2, 4\)'; this pruner has pattern='Unstructured\(\)'"),
        ("2:4", "row", r"'NM\(2, 4\)'; this pruner has pattern='PerRow\(dim=0\)'"),
    ],
)
def test_a_state_of_another_pattern_is_refused(saved_by: str, loaded_by: str, words: str) -> None:
    """The set-up compared on loading left the pattern out (the label says 'L1' for each):
    a state of a pruner by rows or N:M loaded into an unstructured one, whose later updates
    then pruned otherwise than the run that saved it, silently."""
    _, pruner = pruned(saved_by)
    for _ in range(3):
        pruner.step()
    state = pruner.state_dict()
    again, other = pruned(loaded_by)
    refused(
        lambda: other.load_state_dict(state),
        ValueError,
        rf"^GradualPruner\.load_state_dict: the state was saved with pattern={words}; expected",
        model=again,
    )
    assert other.steps == 0


def test_a_state_saved_before_the_pattern_was_compared_still_loads() -> None:
    """A state whose set-up has no pattern (saved before it was compared) loads as before
    (the guard beside the refusal above)."""
    model, pruner = pruned("row")
    for _ in range(3):
        pruner.step()
    state = copy.deepcopy(pruner.state_dict())
    state["setup"].pop("pattern", None)
    again, other = pruned("row")
    other.load_state_dict(state)
    assert other.steps == 3
    assert torch.equal(again.fc1.weight_mask, model.fc1.weight_mask)


class Plain(prunekit.Unstructured):
    """A pattern of the user's whose repr is object's (it holds the object's address)."""

    __repr__ = object.__repr__


def test_a_pattern_without_a_repr_of_its_own_resumes() -> None:
    """The pattern is compared by its repr; one that holds an address (another in every
    process) is compared by its class (the guard of the comparison above)."""
    model, pruner = pruned(Plain())
    for _ in range(3):
        pruner.step()
    again, other = pruned(Plain())
    other.load_state_dict(pruner.state_dict())
    assert other.steps == 3
    assert torch.equal(again.fc1.weight_mask, model.fc1.weight_mask)


# --- masks a state leaves out -----------------------------------------------------------------


def test_a_state_missing_some_masks_is_refused() -> None:
    """A pruner saves the masks of all its targets once it has updated: a state without
    fc1's loaded, fc1 left unpruned at the state's sparsity (its entries competing again at
    the next update), silently."""
    state = copy.deepcopy(saved())
    del state["masks"]["fc1.weight"]
    model, _, pruner = setup(seed=1)
    refused(
        lambda: pruner.load_state_dict(state),
        ValueError,
        r"^GradualPruner\.load_state_dict: the state holds no mask for \['fc1\.weight'\]; "
        r"expected the masks of every target",
        model=model,
    )


@pytest.mark.parametrize("stop", [5, STEPS])
def test_a_state_without_masks_past_the_first_update_is_refused(stop: int) -> None:
    """A state of step 5 (amount 0.47) or of the end (0.8) with its masks left out loaded
    into a model left dense: past end_step no update comes, so the run ended unpruned while
    the pruner said 0.8, silently."""
    model, optimizer, pruner = setup()
    train(model, optimizer, pruner, range(1, stop + 1))
    state = copy.deepcopy(pruner.state_dict())
    state["masks"] = {}
    again, _, other = setup(seed=1)
    refused(
        lambda: other.load_state_dict(state),
        ValueError,
        rf"^GradualPruner\.load_state_dict: the state holds no masks at step {stop} "
        r"\(amount 0\.\d+\); expected the masks of",
        model=again,
    )
    assert not prunekit.is_pruned(again)


def test_a_state_before_the_first_update_loads_without_masks() -> None:
    """Before start_step a pruner has no masks (unless prepared): its state loads (the
    guard beside the refusals above)."""
    model, optimizer, pruner = setup()
    train(model, optimizer, pruner, range(1, 2))
    state = pruner.state_dict()
    assert state["masks"] == {}
    again, _, other = setup(seed=1)
    other.load_state_dict(state)
    assert other.steps == 1 and not prunekit.is_pruned(again)


# --- what lies behind a mask ------------------------------------------------------------------


@pytest.mark.parametrize("behind", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("scope", ["layer", "global"])
def test_what_lies_behind_a_mask_does_not_change_the_next_update(scope: str, behind: float) -> None:
    """Entries pruned at an update hold NaN or inf by the next: they do not compete, so the
    next masks are those of the same pruner where they stayed finite (scope 'layer' ranked
    the others); scope='global' refused them, misdiagnosed: 'pattern=Unstructured() cannot
    rank several tensors together (its select() gave None); expected scope='layer' for
    it'."""
    runs = []
    for bad in (False, True):
        model, optimizer, pruner = setup(scope=scope, start_step=1, end_step=4, every=1)
        train(model, optimizer, pruner, range(1, 3))
        if bad:
            with torch.no_grad():
                for name in ("conv", "fc1"):
                    layer = getattr(model, name)
                    dead = (layer.weight_mask == 0).nonzero()[0]
                    layer.weight_orig[tuple(dead)] = behind
        pruner.step()  # the update of step 3 (no training: a forward would spread the NaN)
        runs.append({k: v for k, v in model.state_dict().items() if k.endswith("_mask")})
    clean, dirty = runs
    assert list(clean) == list(dirty)
    for key in clean:
        assert torch.equal(clean[key], dirty[key]), key
