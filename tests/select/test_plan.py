"""Which strategy a selection takes, and how it reads the scores."""

from __future__ import annotations

import math

import pytest
import torch

from prunekit.select import smallest_k, strategy, tuning


@pytest.mark.parametrize("nan_at", [None, 0, 5, -1])
def test_signed_ranking_is_seen_whatever_nan_the_scores_hold(nan_at: int | None) -> None:
    # A NaN made the least score NaN, so negative scores were once taken for magnitudes.
    scores = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    if nan_at is not None:
        scores[nan_at] = math.nan
    route = strategy.make([lambda: (scores, None)], magnitude=False)
    assert route.fast and route.signed
    chosen = smallest_k(scores, 1000)
    order = torch.sort(scores, stable=True).indices[:1000]
    want = torch.zeros(scores.shape, dtype=torch.bool)
    want[order] = True
    assert torch.equal(chosen, want)


def test_non_negative_scores_rank_as_their_magnitudes() -> None:
    scores = torch.rand(100_000).sub_(0.5).abs_()
    scores[::7] = -0.0  # equal to 0: not negative
    assert not strategy.make([lambda: (scores, None)], magnitude=False).signed
    with tuning.overridden(small=1 << 62):
        assert not strategy.make([lambda: (scores, None)], magnitude=False).fast
