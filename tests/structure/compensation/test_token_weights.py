"""prune_channels(compensate=True, token_weights='equal'): the calibration rows weighed by
their size in the least-squares fit, against weighted moments by hand, on a model whose
calibration holds sink rows, after compaction, and the checks of the new argument."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint
from prunekit.calibrate.statistics import InputStatistics, row_weights

FEATURES, HIDDEN = 12, 48


def test_row_weights_are_the_median_energy_over_each_rows_capped_and_averaging_one() -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(9, 5, generator=g)
    rows[3] *= 40.0  # a sink
    rows[7] = 0.0  # a row of zeros: the largest weight
    energy = rows.square().sum(1)
    expected = (energy.median() / energy).clamp(max=100.0)
    expected = expected / expected.mean()
    found = row_weights(rows)
    torch.testing.assert_close(found, expected)
    assert float(found.mean()) == pytest.approx(1.0)
    assert int(found.argmin()) == 3 and int(found.argmax()) == 7


@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
def test_rows_that_are_not_finite_leave_every_weight_at_one(fill: float) -> None:
    rows = torch.randn(6, 4)
    rows[2, 1] = fill
    assert torch.equal(row_weights(rows), torch.ones(6))


def test_rows_of_zeros_only_leave_every_weight_at_one() -> None:
    assert torch.equal(row_weights(torch.zeros(4, 3)), torch.ones(4))


def test_equal_statistics_are_the_weighted_moments_of_each_batch() -> None:
    g = torch.Generator().manual_seed(1)
    layer = nn.Linear(6, 2)
    batches = [torch.randn(n, 6, generator=g) for n in (5, 8)]
    batches[0][0] *= 30.0
    with InputStatistics([layer], norms=True, hessian=True, means=True, equal=True) as stats:
        for batch in batches:
            stats.new_batch()
            layer(batch)
    weights = [row_weights(b).double() for b in batches]
    rows = sum(len(b) for b in batches)
    pairs = [(b.double(), w) for b, w in zip(batches, weights, strict=True)]
    hessian = sum((b.T * w) @ b for b, w in pairs) / rows
    means = sum((b * w[:, None]).sum(0) for b, w in pairs) / rows
    squares = sum(b.double().square().sum(0) for b in batches)
    torch.testing.assert_close(stats.hessian(layer).double(), hessian, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.means(layer), means, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.norms(layer), squares.sqrt(), rtol=1e-5, atol=1e-5)  # as is
    assert stats.rows(layer) == rows


def mlp(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, FEATURES))


def tokens(count: int, g: torch.Generator) -> Tensor:
    return torch.randn(count, FEATURES, generator=g)


def sink_mlp(seed: int, sink: Tensor) -> nn.Sequential:
    """An MLP whose first half of hidden units is small (the half 'l2' removes) and reads
    only the sink direction, which the other half does not read: on ordinary tokens they
    add little, on a sink all of the output, as attention sinks use channels of their own."""
    model = mlp(seed)
    half, unit = HIDDEN // 2, sink / sink.norm()
    with torch.no_grad():
        rest = model[0].weight[half:]
        rest -= (rest @ unit)[:, None] * unit
        model[0].weight[:half] = 0.02 * unit
        model[0].bias[:half] = 0.0
    return model


def with_sinks(g: torch.Generator, sink: Tensor) -> list[Tensor]:
    """Four batches of 96 rows, the first row of each a sink (a fixed direction, 60x)."""
    batches = []
    for _ in range(4):
        batch = tokens(96, g)
        batch[0] = 60.0 * sink + 0.1 * batch[0]
        batches.append(batch)
    return batches


def held_out_error(pruned: nn.Module, dense: nn.Module, fresh: Tensor) -> float:
    with torch.no_grad():
        return float((pruned(fresh) - dense(fresh)).norm() / dense(fresh).norm())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equal_weights_keep_ordinary_tokens_where_sinks_would_decide_the_fit(seed: int) -> None:
    g = torch.Generator().manual_seed(100 + seed)
    sink = torch.randn(FEATURES, generator=g)
    calibration, fresh = with_sinks(g, sink), tokens(2000, g)
    dense = sink_mlp(seed, sink)
    found = {}
    for weights in ("energy", "equal"):
        model = copy.deepcopy(dense)
        prunekit.prune_channels(model, tokens(1, g), 0.5, criterion="l2", compensate=True,
                                calibration=calibration, token_weights=weights)  # fmt: skip
        found[weights] = held_out_error(model, dense, fresh)
    assert found["equal"] < 0.5 * found["energy"], found  # about 0.03 against 0.2-0.3


def test_without_outlying_rows_equal_weights_fit_as_energy_does() -> None:
    # the consumer's input rows all of one energy (unit rows through orthonormal columns,
    # no bias): every weight is 1, the update the same
    g = torch.Generator().manual_seed(3)
    calibration = []
    for _ in range(3):
        batch = tokens(64, g)
        calibration.append(batch / batch.norm(dim=1, keepdim=True))
    columns, _ = torch.linalg.qr(torch.randn(HIDDEN, FEATURES, generator=g))
    results = []
    for weights in ("energy", "equal"):
        torch.manual_seed(4)
        model = nn.Sequential(nn.Linear(FEATURES, HIDDEN, bias=False), nn.Linear(HIDDEN, 5))
        with torch.no_grad():
            model[0].weight.copy_(columns)
        prunekit.prune_channels(model, tokens(1, g), 0.25, criterion="l2", compensate=True,
                                calibration=calibration, token_weights=weights)  # fmt: skip
        results.append(prunekit.permanent_state_dict(model))
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, rtol=1e-5, atol=1e-6)


def test_compaction_after_equal_weights_computes_what_the_masked_model_did() -> None:
    g = torch.Generator().manual_seed(6)
    model = mlp(7)
    prunekit.prune_channels(model, tokens(1, g), 0.5, criterion="l2", compensate=True,
                            calibration=with_sinks(g, torch.randn(FEATURES, generator=g)),
                            token_weights="equal")  # fmt: skip
    fresh = tokens(50, g)
    with torch.no_grad():
        masked = model(fresh)
    report = prunekit.compact(model, fresh[:1])
    assert report.params_after < report.params_before
    with torch.no_grad():
        torch.testing.assert_close(model(fresh), masked, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"token_weights": "tokens"}, ValueError, r"invalid token_weights='tokens'; expected one"),
        ({"token_weights": None}, TypeError, r"invalid token_weights=None; expected one of"),
        ({"token_weights": 1}, TypeError, r"invalid token_weights=1"),
        ({"token_weights": "equal", "compensate": False}, ValueError,
         r"token_weights='equal' needs compensate=True.*not compensate=False"),
        ({"token_weights": "equal", "compensate": "reference"}, ValueError,
         r"token_weights='equal' needs compensate=True.*not compensate='reference'"),
    ],
)  # fmt: skip
def test_a_bad_token_weights_is_refused_before_the_model_is_touched(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    g = torch.Generator().manual_seed(8)
    model = mlp(9)
    before = fingerprint(model)
    kwargs: dict[str, object] = {"compensate": True, "calibration": [tokens(16, g)], **options}
    with pytest.raises(error, match=f"prune_channels: {message}"):
        prunekit.prune_channels(model, tokens(1, g), 0.25, **kwargs)  # type: ignore[arg-type]
    assert fingerprint(model) == before


def test_the_default_is_energy_and_the_config_keeps_the_choice() -> None:
    assert prunekit.ChannelConfig().token_weights == "energy"
    config = prunekit.ChannelConfig(
        0.25, compensate=True, calibration=[torch.ones(2, 3)], token_weights="equal"
    )
    assert config.token_weights == "equal"
