"""recalibrate_norms: BatchNorm running statistics recomputed exactly on calibration data."""

from __future__ import annotations

from collections import UserDict

import pytest
import torch
from torch import nn

import prunekit as prune


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 3))


def test_running_stats_are_the_average_of_the_exact_batch_statistics() -> None:
    model = _model().train()
    model[1].running_mean.fill_(7.0)  # stale statistics that must not survive
    batches = [torch.randn(8, 4) * 3 + 1 for _ in range(3)]
    with torch.no_grad():
        hidden = [model[0](b) for b in batches]
    count = prune.recalibrate_norms(model, batches)
    assert count == 1
    means = torch.stack([h.mean(0) for h in hidden])
    variances = torch.stack([h.var(0, unbiased=True) for h in hidden])
    torch.testing.assert_close(model[1].running_mean, means.mean(0))
    torch.testing.assert_close(model[1].running_var, variances.mean(0))
    assert int(model[1].num_batches_tracked) == 3
    assert model[1].momentum == 0.1
    assert all(m.training for m in model.modules())  # flags restored


def test_other_modules_stay_in_eval_and_untouched() -> None:
    model = _model().eval()
    seen: list[bool] = []
    model[2].register_forward_hook(lambda m, a, o: seen.append(m.training))
    before = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("1.")}
    prune.recalibrate_norms(model, [torch.randn(8, 4)])
    assert seen == [False]  # dropout was off
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    assert not any(m.training for m in model.modules())


def test_a_failing_batch_restores_everything() -> None:
    model = _model().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError):
        prune.recalibrate_norms(model, [torch.randn(8, 4), torch.randn(8, 5)])
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    assert model[1].momentum == 0.1
    assert not any(m.training for m in model.modules())


def test_bad_calibration_is_refused() -> None:
    with pytest.raises(ValueError, match="recalibrate_norms: calibration holds no batch"):
        prune.recalibrate_norms(_model(), [])
    with pytest.raises(TypeError, match="recalibrate_norms: invalid calibration"):
        prune.recalibrate_norms(_model(), torch.randn(8, 4))
    one = UserDict({"input": torch.randn(8, 4)})  # one batch of keyword arguments
    with pytest.raises(TypeError, match="recalibrate_norms: invalid calibration of type User"):
        prune.recalibrate_norms(_model(), one)
