"""Hostile cases of the patterns (prunekit.patterns) and the criteria: a criterion's own
per-channel scores (``Criterion.channel_scores``) are checked as its per-entry scores are,
integer importance scores rank under every pattern, Wanda's norms stay finite for finite
inputs, and a refusal leaves the module as it was."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

import prunekit
from hostile.support import refused
from prunekit.core.naming import TensorRef
from prunekit.criteria.criterion import Criterion


class OwnChannels(Criterion):
    """A criterion of a user's own that scores whole channels itself."""

    def __init__(self, channels: object) -> None:
        self.channels = channels

    def scores(self, values: Tensor, target: TensorRef = None) -> Tensor:
        return values.abs()

    def channel_scores(self, values: Tensor, dim: int, target: TensorRef = None) -> Tensor:
        return self.channels  # type: ignore[return-value]


def _linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(3, 4)


def _prune(module: nn.Module, criterion: Criterion) -> None:
    prunekit.Pruning.apply(module, "weight", amount=1, pattern=prunekit.Channels(dim=0),
                           criterion=criterion)  # fmt: skip


@pytest.mark.parametrize(("bad", "shown"),
                         [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")],
                         ids=["nan", "inf", "-inf"])  # fmt: skip
def test_channel_scores_that_cannot_be_ranked_are_refused(bad: float, shown: str) -> None:
    """A NaN was ranked as the largest score (its channel kept, another pruned) and -inf as
    the smallest, where the same values among the entries' scores are refused."""
    module = _linear()
    scores = torch.tensor([1.0, bad, 3.0, 0.5])
    refused(lambda: _prune(module, OwnChannels(scores)), ValueError,
            rf"^parameter 'weight' of Linear: Pruning: the channel scores of OwnChannels hold 1 "
            rf"value\(s\) that cannot be ranked, e\.g\. {shown} at index \(1,\)",
            model=module)  # fmt: skip


@pytest.mark.parametrize(
    ("scores", "shown"),
    [(torch.tensor([1.0, 2.0]), r"\(2,\)"), (torch.tensor([[1.0, 2.0, 3.0, 4.0]]), r"\(1, 4\)")],
    ids=["too-few", "2-d"],
)
def test_channel_scores_of_another_shape_are_refused_naming_the_criterion(
    scores: Tensor, shown: str
) -> None:
    """Too few: a raw "shape '[4, 1]' is invalid for input of size 2" from a reshape; a (1, 4)
    tensor was read flat."""
    module = _linear()
    refused(lambda: _prune(module, OwnChannels(scores)), ValueError,
            rf"OwnChannels\.channel_scores returned shape {shown}; expected \(4,\)",
            model=module)  # fmt: skip


def test_channel_scores_that_are_no_tensor_are_refused_naming_the_criterion() -> None:
    module = _linear()
    refused(lambda: _prune(module, OwnChannels([1.0, 2.0, 3.0, 0.5])), TypeError,
            r"OwnChannels\.channel_scores returned list", model=module)  # fmt: skip


def test_integer_channel_scores_rank_as_numbers() -> None:
    module = _linear()
    _prune(module, OwnChannels(torch.tensor([3, 1, 2, 4])))
    mask: Tensor = getattr(module, "weight_mask")  # noqa: B009 (typed as a Tensor)
    assert mask[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("pattern", [prunekit.PerRow(), prunekit.NM(2, 4)], ids=repr)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16], ids=str)
def test_integer_importance_scores_rank_a_tensor_pruned_before(
    pattern: prunekit.Pattern, dtype: torch.dtype
) -> None:
    """As Unstructured and Channels rank them: PerRow and NM raised a raw "value cannot be
    converted to type int64_t without overflow" once a mask was there (the entries pruned
    before were set apart as +inf in the scores' own dtype)."""
    scores = (torch.arange(32).reshape(4, 8) * 7 % 11).to(dtype)
    masks = []
    for given in (scores, scores.double()):
        module = _linear8()
        prunekit.Pruning.apply(module, "weight", amount=8, importance_scores=given)
        prunekit.Pruning.apply(module, "weight", amount=0.5, pattern=pattern,
                               importance_scores=given)  # fmt: skip
        masks.append(getattr(module, "weight_mask"))  # noqa: B009 (typed as a Tensor)
    assert torch.equal(masks[0], masks[1])
    assert int(masks[0].sum()) < 24  # the second pruning pruned


def _linear8() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(8, 4)


# --- Wanda's input norms ----------------------------------------------------------------------


def test_wanda_ranks_finite_inputs_whose_squares_pass_float32() -> None:
    """An input of 1e30 (finite in float32) made the norm inf (its square summed in float32)
    and the layer was refused: 'the scores hold 8 value(s) that cannot be ranked, e.g. inf'."""
    torch.manual_seed(0)
    first = nn.Linear(8, 8)
    model = nn.Sequential(first, nn.ReLU(), nn.Linear(8, 4))
    batches = [torch.randn(5, 8), torch.randn(3, 8)]
    batches[1][0, 2] = 1e30
    weight = first.weight.detach().clone()
    prunekit.prune_model(model, 0.5, calibration=batches, method="wanda")
    norms = torch.cat(batches).double().square().sum(0).sqrt()
    scores = weight.double().abs() * norms
    order = scores.argsort(dim=1, stable=True)
    expected = torch.ones_like(weight).scatter_(1, order[:, :4], 0.0)
    assert torch.equal(getattr(first, "weight_mask"), expected)  # noqa: B009
