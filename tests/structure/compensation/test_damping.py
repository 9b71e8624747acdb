"""The damping of compensation chosen on held-out calibration batches: the errors against a
brute-force search over tokens, the choice through prune_channels against the same search,
the layers left where no damping helps, compaction after it, and the new argument's checks."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint
from prunekit.structure.compensation.damping import (
    DAMP,
    GRID,
    LIGHTEST,
    Moments,
    by_median,
    by_rows,
    choose,
    held_out_errors,
    least_squares_update,
)


def tokens(rows: int, features: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(features, features, generator=g, dtype=torch.float64)
    return torch.randn(rows, features, generator=g, dtype=torch.float64) @ mixing + 0.4


def moments(x: Tensor) -> Moments:
    return Moments(x.T @ x / len(x), x.mean(0), len(x))


def brute_force(
    w: Tensor, fit: Tensor, held: Tensor, removed: list[int], kept: list[int], bias: bool
) -> tuple[list[float], float]:
    """Each damping's update fitted on the tokens `fit`, then the mean over the tokens of
    `held` of the squared output change, summed over the rows; and with no update."""
    target = held @ w.T
    errors = []
    for level in GRID:
        h = fit.T @ fit / len(fit)
        delta, shift = least_squares_update(w, h, removed, kept, fit.mean(0) if bias else None,
                                            level)  # fmt: skip
        output = held[:, kept] @ (w[:, kept] + delta).T
        if shift is not None:
            output = output + shift
        errors.append(float((output - target).square().sum(1).mean()))
    untouched = float((held[:, kept] @ w[:, kept].T - target).square().sum(1).mean())
    return errors, untouched


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [12, 40])
def test_held_out_errors_are_those_of_a_brute_force_search_over_tokens(
    bias: bool, rows: int
) -> None:
    w = torch.randn(5, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a, b = tokens(rows, 9, 2), tokens(rows + 3, 9, 3)  # two folds, not alike in size
    removed, kept = [1, 4, 6], [0, 2, 3, 5, 7, 8]
    errors, untouched = held_out_errors(w, [moments(a), moments(b)], removed, kept, bias)
    one, none_one = brute_force(w, a, b, removed, kept, bias)
    two, none_two = brute_force(w, b, a, removed, kept, bias)
    expected = torch.tensor(one, dtype=torch.float64) + torch.tensor(two, dtype=torch.float64)
    torch.testing.assert_close(errors, expected, rtol=1e-9, atol=1e-12)
    assert untouched == pytest.approx(none_one + none_two, rel=1e-9)
    best = min(range(len(GRID)), key=lambda k: float(expected[k]))
    assert choose(errors, untouched) == (GRID[best] if expected[best] < untouched else None)


def test_few_tokens_choose_a_stronger_damping_than_many() -> None:
    # 6 tokens per fold for 9 features fit their noise undamped: the held-out choice damps
    # more there than with 4000
    g = torch.Generator().manual_seed(4)
    mixing = torch.randn(3, 9, generator=g, dtype=torch.float64)  # 3 factors + noise

    def fold(rows: int) -> Moments:
        factors = torch.randn(rows, 3, generator=g, dtype=torch.float64)
        noise = torch.randn(rows, 9, generator=g, dtype=torch.float64)
        return moments(factors @ mixing + 0.3 * noise + 0.4)

    w = torch.randn(5, 9, dtype=torch.float64, generator=g)
    removed, kept = [1, 4, 6], [0, 2, 3, 5, 7, 8]
    chosen = []
    for rows in (6, 4000):
        found = choose(*held_out_errors(w, [fold(rows), fold(rows)], removed, kept, True))
        assert found is not None
        chosen.append(found)
    assert chosen[0] > chosen[1]


def test_choose_leaves_the_weights_where_no_damping_beats_no_update() -> None:
    assert choose(torch.tensor([3.0, 2.0, 5.0]), 2.0, (0.1, 1.0, 10.0)) is None
    assert choose(torch.tensor([3.0, 1.5, 1.5]), 2.0, (0.1, 1.0, 10.0)) == 1.0  # lightest
    assert choose(torch.tensor([math.nan, math.nan]), 2.0, (0.1, 1.0)) is None


def mlp(bias: bool = True) -> nn.Sequential:
    torch.manual_seed(0)  # tanh: every hidden unit carries signal, none is dead
    return nn.Sequential(nn.Linear(6, 16, bias=bias), nn.Tanh(), nn.Linear(16, 3, bias=bias))


def batches(count: int = 6, rows: int = 10) -> list[Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(rows, 6, generator=g) + 0.3 for _ in range(count)]


@pytest.mark.parametrize("bias", [False, True])
def test_auto_picks_the_damping_a_brute_force_search_picks(bias: bool) -> None:
    dense, calibration = mlp(bias), batches()
    auto = copy.deepcopy(dense)
    prunekit.prune_channels(auto, calibration[0], 0.5, criterion="activation",
                            calibration=calibration, compensate=True,
                            damping="auto")  # fmt: skip
    removed = auto[0].weight_mask[:, 0].eq(0).nonzero().flatten().tolist()
    kept = [c for c in range(16) if c not in removed]
    with torch.no_grad():
        hidden = [dense[1](dense[0](b)).double() for b in calibration]
    folds = [torch.cat(hidden[0::2]), torch.cat(hidden[1::2])]
    w = dense[2].weight.detach().double()
    one, none_one = brute_force(w, folds[0], folds[1], removed, kept, bias)
    two, none_two = brute_force(w, folds[1], folds[0], removed, kept, bias)
    total = [p + q for p, q in zip(one, two, strict=True)]
    best = min(range(len(GRID)), key=lambda k: total[k])
    assert total[best] < 0.9 * (none_one + none_two)  # the case updates
    updated = {}
    for level in GRID:
        explicit = copy.deepcopy(dense)
        prunekit.prune_channels(explicit, calibration[0], 0.5, criterion="activation",
                                calibration=calibration, compensate=True,
                                damping=level)  # fmt: skip
        change = explicit[2].weight_orig - auto[2].weight_orig
        updated[level] = float(change.detach().abs().max())
    assert updated[GRID[best]] < 1e-5  # the same damping (up to float32 statistics)
    assert min(v for k, v in updated.items() if k != GRID[best]) > 1e-4  # and no other
    assert not torch.equal(auto[2].weight_orig, dense[2].weight)


def test_by_rows_damps_few_rows_per_feature_strongly_and_many_lightly() -> None:
    assert by_rows(1024, 1536) == DAMP  # fewer rows than features: the strongest
    assert by_rows(4096, 1536) == pytest.approx(0.225)  # 2.7 rows per feature
    assert by_rows(16384, 1536) == pytest.approx(0.6 * 1536 / 16384)
    assert by_rows(32768, 1536) == pytest.approx(0.6 * 1536 / 32768)
    assert by_rows(10**7, 16) == LIGHTEST
    assert by_rows(0, 16) == DAMP
    levels = [by_rows(rows, 64) for rows in (64, 256, 1024, 4096, 16384)]
    assert levels == sorted(levels, reverse=True)  # never lighter with fewer rows


@pytest.mark.parametrize(("count", "rows"), [(6, 10), (40, 100)])
def test_the_default_damping_follows_the_rows_per_feature(count: int, rows: int) -> None:
    # 16 hidden features read by the last layer on count x rows calibration rows: the default
    # is the constant by_rows gives, and differs from the old constant 0.3 where it is lighter
    dense, calibration = mlp(), batches(count, rows)
    implicit, explicit, strong = (copy.deepcopy(dense) for _ in range(3))
    level = by_rows(count * rows, 16)
    for model, damping in ((implicit, None), (explicit, level), (strong, DAMP)):
        given = {} if damping is None else {"damping": damping}
        prunekit.prune_channels(model, calibration[0], 0.5, criterion="activation",
                                calibration=calibration, compensate=True, **given)  # fmt: skip
    torch.testing.assert_close(implicit[2].weight_orig, explicit[2].weight_orig, rtol=0, atol=0)
    assert (level < DAMP) == (not torch.equal(implicit[2].weight_orig, strong[2].weight_orig))


def test_the_default_damping_of_a_convolution_read_as_patches_is_the_lightest() -> None:
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Conv2d(3, 8, 1), nn.Tanh(), nn.Conv2d(8, 4, 3))
    g = torch.Generator().manual_seed(5)
    calibration = [torch.randn(2, 3, 6, 6, generator=g) for _ in range(2)]
    implicit, light, stronger = (copy.deepcopy(dense) for _ in range(3))
    for model, given in ((implicit, {}), (light, {"damping": LIGHTEST}),
                         (stronger, {"damping": 0.1})):  # fmt: skip
        prunekit.prune_channels(model, calibration[0], 0.5, criterion="activation",
                                calibration=calibration, compensate=True, **given)  # fmt: skip
    torch.testing.assert_close(implicit[2].weight_orig, light[2].weight_orig, rtol=0, atol=0)
    assert not torch.equal(implicit[2].weight_orig, stronger[2].weight_orig)
    assert not torch.equal(implicit[2].weight_orig, dense[2].weight)


def test_a_layer_no_damping_helps_is_left_with_a_warning() -> None:
    # the removed input copies a kept one on the even batches and its negative on the odd:
    # fitted on one fold, the update doubles the error on the other; left as it was
    model = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 2, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(3))
        model[1].weight.copy_(torch.tensor([[1.0, 0.5, 0.2], [0.3, 1.0, -0.4]]))
    g = torch.Generator().manual_seed(0)
    calibration = []
    for k in range(4):
        x = torch.randn(64, 3, generator=g)
        x[:, 2] = (1 if k % 2 == 0 else -1) * x[:, 0]
        calibration.append(x)
    before = model[1].weight.detach().clone()
    with pytest.warns(UserWarning, match=r"left 1 as they were: no damping"):
        prunekit.prune_channels(model, calibration[0], criterion=lambda g: torch.tensor(
            [1.0, 1.0, 0.0]), calibration=calibration, compensate=True, amount=0.34,
            damping="auto")  # fmt: skip
    torch.testing.assert_close(model[1].weight_orig, before)


def test_one_batch_cannot_be_held_out_so_the_constant_is_used_with_a_warning() -> None:
    dense, calibration = mlp(), batches(1, rows=40)
    auto, constant = copy.deepcopy(dense), copy.deepcopy(dense)
    with pytest.warns(UserWarning, match=r"one batch cannot be split: used damping='rows'"):
        prunekit.prune_channels(auto, calibration[0], 0.5, criterion="activation",
                                calibration=calibration, compensate=True,
                                damping="auto")  # fmt: skip
    prunekit.prune_channels(constant, calibration[0], 0.5, criterion="activation",
                            calibration=calibration, compensate=True, damping="rows")  # fmt: skip
    torch.testing.assert_close(auto[2].weight_orig, constant[2].weight_orig, rtol=0, atol=0)


@pytest.mark.parametrize("damping", ["auto", 0.3, 1e-3])
def test_compaction_is_exact_after_compensation_of_any_damping(damping: Any) -> None:
    model, calibration = mlp(), batches()
    prunekit.prune_channels(model, calibration[0], 0.5, heads=0.0, criterion="activation",
                            calibration=calibration, compensate=True,
                            damping=damping)  # fmt: skip
    x = torch.cat(calibration)
    with torch.no_grad():
        masked = model(x)
    prunekit.compact(model, calibration[0], latency_runs=0)
    assert model[0].out_features == 8
    with torch.no_grad():
        torch.testing.assert_close(model(x), masked, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"damping": "fast"}, ValueError, r"prune_channels: invalid damping='fast'; expected "
                                          r"'rows' .*'auto'"),
        ({"damping": 0.0}, ValueError, r"invalid damping=0.0; expected 'rows', 'auto' or a finite"),
        ({"damping": -1}, ValueError, r"invalid damping=-1"),
        ({"damping": math.nan}, ValueError, r"invalid damping=nan"),
        ({"damping": math.inf}, ValueError, r"invalid damping=inf"),
        ({"damping": True}, TypeError, r"damping must be 'rows', 'auto' or a number > 0, not bool"),
        ({"damping": [0.3]}, TypeError, r"not list"),
        ({"damping": 0.3, "compensate": False}, ValueError,
         r"damping=0.3 needs compensate=True .*not compensate=False"),
        ({"damping": "auto", "compensate": "reference"}, ValueError,
         r"damping='auto' needs compensate=True"),
    ],
)  # fmt: skip
def test_bad_damping_is_refused_and_nothing_changes(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    model, calibration = mlp(), batches()
    before = fingerprint(model)
    arguments: dict[str, Any] = {"compensate": True, "calibration": calibration, **options}
    with pytest.raises(error, match=match):
        prunekit.prune_channels(model, calibration[0], 0.5, **arguments)
    assert fingerprint(model) == before


def test_without_damping_the_default_is_used() -> None:
    from prunekit.structure.stages import entry as pruning

    dense, calibration = mlp(), batches()
    implicit, explicit = copy.deepcopy(dense), copy.deepcopy(dense)
    prunekit.prune_channels(implicit, calibration[0], 0.5, criterion="activation",
                            calibration=calibration, compensate=True)  # fmt: skip
    prunekit.prune_channels(explicit, calibration[0], 0.5, criterion="activation",
                            calibration=calibration, compensate=True,
                            damping=pruning.DAMPING)  # fmt: skip
    torch.testing.assert_close(implicit[2].weight_orig, explicit[2].weight_orig, rtol=0, atol=0)


@pytest.mark.parametrize("bias", [False, True])
def test_the_damping_is_a_share_of_the_median_diagonal_not_of_the_mean(bias: bool) -> None:
    x = tokens(300, 8, 5)
    x[:3, 2] *= 400.0  # a few rows (an attention sink's) put nearly all the energy in one feature
    h, mean = x.T @ x / len(x), x.mean(0)
    w = torch.randn(5, 8, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    removed, kept = [1, 6], [0, 2, 3, 4, 5, 7]
    delta, shift = least_squares_update(w, h, removed, kept, mean if bias else None, damp=0.1)
    columns = [*kept, 8] if bias else kept
    full = torch.cat([torch.cat([h, mean[:, None]], 1),
                      torch.cat([mean[None], torch.ones(1, 1, dtype=h.dtype)], 1)])  # fmt: skip
    a = (full if bias else h)[columns][:, columns]
    assert float(a.diagonal().mean()) > 50 * float(a.diagonal().median())
    damped = a + 0.1 * a.diagonal().median() * torch.eye(len(columns), dtype=a.dtype)
    right = (full if bias else h)[columns][:, removed] @ w[:, removed].T
    expected = torch.linalg.solve(damped, right).T
    torch.testing.assert_close(delta, expected[:, : len(kept)])
    if bias:
        assert shift is not None
        torch.testing.assert_close(shift, expected[:, -1])


def test_linear_consumers_take_the_median_and_convolutions_the_mean() -> None:
    assert by_median(nn.Linear(4, 3))
    assert not by_median(nn.Conv2d(4, 3, 1))
    assert not by_median(nn.Conv1d(4, 3, 3))
    x = tokens(300, 8, 7)
    x[:3, 2] *= 400.0
    h = x.T @ x / len(x)
    w = torch.randn(5, 8, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    removed, kept = [1, 6], [0, 2, 3, 4, 5, 7]
    by_mean, _ = least_squares_update(w, h, removed, kept, damp=0.1, median=False)
    a = h[kept][:, kept]
    damped = a + 0.1 * a.diagonal().mean() * torch.eye(len(kept), dtype=a.dtype)
    expected = torch.linalg.solve(damped, h[kept][:, removed] @ w[:, removed].T).T
    torch.testing.assert_close(by_mean, expected)
