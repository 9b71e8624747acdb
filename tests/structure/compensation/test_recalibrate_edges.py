"""recalibrate_norms on batches that cannot give running statistics: a batch with NaN or inf
(the statistics would be NaN), an empty batch (torch counts it as a batch without adding to
the statistics, so the average of the others shrinks), and a BatchNorm the forward never runs
(its statistics would be left reset to 0 and 1). Each refusal names the batch and the
BatchNorm and leaves the model as it was; a BatchNorm that never ran keeps its statistics."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import Tensor, nn

import prunekit as prune
from prunekit.core.errors import is_explained


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(before: dict[str, Tensor], model: nn.Module) -> bool:
    after = model.state_dict()
    return list(before) == list(after) and all(torch.equal(v, after[k]) for k, v in before.items())


BATCH = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_batch_that_makes_the_statistics_not_finite_is_refused(bad: float) -> None:
    model = _model().eval()
    poisoned = BATCH.clone()
    poisoned[2, 1] = bad
    before = _state(model)
    with pytest.raises(ValueError) as raised:
        prune.recalibrate_norms(model, [BATCH, poisoned])
    text = str(raised.value)
    assert text.startswith("recalibrate_norms: batch 1 makes the running statistics of '1' "), text
    assert "expected" in text and is_explained(raised.value)
    assert _same(before, model)
    assert model[1].momentum == 0.1 and not model.training


def test_an_empty_batch_is_refused_not_counted() -> None:
    """Counted, it would halve the mean of the one real batch (torch adds nothing for it
    but counts it in the cumulative average)."""
    model = _model().eval()
    before = _state(model)
    with pytest.raises(ValueError) as raised:
        prune.recalibrate_norms(model, [BATCH[:0], BATCH])
    text = str(raised.value)
    assert text.startswith("recalibrate_norms: batch 0 gives '1' no values"), text
    assert _same(before, model)


class _Branch(nn.Module):
    """A BatchNorm run only in training mode, as auxiliary heads are."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm, self.aux = nn.Linear(3, 4), nn.BatchNorm1d(4), nn.BatchNorm1d(4)

    def forward(self, x: Tensor) -> Tensor:
        h: Tensor = self.norm(self.linear(x))
        return self.aux(h) if self.training else h


def test_a_batchnorm_that_never_runs_keeps_its_statistics_and_is_named() -> None:
    torch.manual_seed(0)
    model = _Branch().eval()
    assert model.aux.running_mean is not None
    model.aux.running_mean.fill_(5.0)
    kept = _state(model.aux)
    with pytest.warns(UserWarning, match=r"recalibrate_norms: 'aux' never ran") as warned:
        count = prune.recalibrate_norms(model, [BATCH])
    assert warned[0].filename == __file__  # the caller's line
    assert count == 1  # only 'norm' was re-estimated
    assert _same(kept, model.aux)
    with torch.no_grad():
        torch.testing.assert_close(model.norm.running_mean, model.linear(BATCH).mean(0))


def test_every_batchnorm_that_runs_gives_no_warning() -> None:
    model = _model().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prune.recalibrate_norms(model, [BATCH, BATCH[:2]]) == 1
