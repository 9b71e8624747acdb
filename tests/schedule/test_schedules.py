"""The schedules follow their formulas, and the cubic one torch.ao.pruning's CubicSL."""

from __future__ import annotations

import math

import pytest
from torch import nn
from torch.ao.pruning.scheduler.cubic_scheduler import CubicSL

import prunekit as prune
from prunekit.schedule.schedules import Timetable


def timetable(schedule: object = "cubic", **kw: object) -> Timetable:
    args: dict[str, object] = dict(
        final_amount=0.9, initial_amount=0.1, start_step=10, end_step=110, every=10
    )
    args.update(kw)
    return Timetable.checked(schedule=schedule, owner="test", **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("start, end, s_i, s_f", [(10, 110, 0.1, 0.9), (0, 7, 0.0, 0.95)])
def test_cubic_is_zhu_and_gupta(start: int, end: int, s_i: float, s_f: float) -> None:
    t = timetable(initial_amount=s_i, final_amount=s_f, start_step=start, end_step=end)
    for step in range(end + 20):
        if step < start:
            want = 0.0
        else:
            done = min(step, end) - start
            want = s_f + (s_i - s_f) * (1 - done / (end - start)) ** 3
        assert t.amount_at(step) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("dt, n", [(10, 10), (1, 37), (5, 3)])
def test_cubic_matches_cubicsl(dt: int, n: int) -> None:
    """CubicSL(init_sl, init_t, delta_t, total_t, initially_zero=True): s_f reached at
    init_t + delta_t * total_t, which is our end_step."""
    start, s_i, s_f = 4, 0.2, 0.8
    t = timetable(initial_amount=s_i, final_amount=s_f, start_step=start, end_step=start + dt * n)
    for step in range(start + dt * n + 15):
        theirs = CubicSL.sparsity_compute_fn(s_i, s_f, step, start, dt, n, initially_zero=True)
        assert t.amount_at(step) == pytest.approx(theirs, abs=1e-12), step


def test_cubicsl_through_its_scheduler() -> None:
    """The sparsity torch.ao.pruning's WeightNormSparsifier gets from CubicSL, epoch by
    epoch, is ours at the same steps."""
    from torch.ao.pruning import WeightNormSparsifier

    model = nn.Sequential(nn.Linear(4, 4))
    sparsifier = WeightNormSparsifier(sparsity_level=0.75)
    sparsifier.prepare(model, config=[{"tensor_fqn": "0.weight"}])
    scheduler = CubicSL(
        sparsifier, init_sl=0.0, init_t=2, delta_t=3, total_t=4, initially_zero=True
    )
    ours = timetable(initial_amount=0.0, final_amount=0.75, start_step=2, end_step=14)
    for epoch in range(1, 20):
        sparsifier.step()
        scheduler.step()
        assert scheduler.get_last_sl()[0] == pytest.approx(ours.amount_at(epoch)), epoch


def test_linear_and_constant() -> None:
    lin = timetable("linear", initial_amount=0.2, final_amount=0.6, start_step=0, end_step=4)
    assert [lin.amount_at(s) for s in range(6)] == pytest.approx([0.2, 0.3, 0.4, 0.5, 0.6, 0.6])
    const = timetable("constant", start_step=3, end_step=9)
    assert [const.amount_at(s) for s in range(12)] == [0.0] * 3 + [0.9] * 9
    assert prune.schedule.cubic(0.5) == 1 - 0.5**3
    assert prune.schedule.linear(0.25) == 0.25 and prune.schedule.constant(0.0) == 1.0


@pytest.mark.parametrize("schedule", ["cubic", "linear", "constant"])
def test_the_last_update_reaches_final_amount_exactly(schedule: str) -> None:
    """s_i + (s_f - s_i) need not be s_f in floats (0.03 + 0.27 is 0.30000000000000004):
    the end step must give final_amount itself, never a hair above it, which prunes one
    entry more than final_amount does (round(4.500000000000001) = 5 of 15, not 4)."""
    for s_i, s_f in [(0.03, 0.3), (0.03, 0.29), (0.1, 0.7), (0.07, 1.0)]:
        t = timetable(schedule, initial_amount=s_i, final_amount=s_f, start_step=1, end_step=3)
        assert [t.amount_at(s) for s in (3, 4)] == [s_f, s_f]
        assert all(t.amount_at(s) <= s_f for s in range(6))
    model = nn.Linear(15, 1, bias=False)
    pruner = prune.GradualPruner(
        model, 0.3, initial_amount=0.03, start_step=1, end_step=3, schedule=schedule
    )
    for _ in range(3):
        pruner.step()
    assert pruner.amount == 0.3
    assert int((model.weight_mask == 0).sum()) == round(0.3 * 15) == 4


def test_callable_schedule_gives_the_sparsity() -> None:
    t = timetable(
        lambda step: 1 - 0.8**step,
        initial_amount=0.0,
        final_amount=0.5,
        start_step=1,
        end_step=3,
        every=1,
    )
    assert [t.amount_at(s) for s in range(5)] == pytest.approx([0, 0.2, 0.36, 0.488, 0.488])
    bad = timetable(lambda step: 0.7, initial_amount=0.0, final_amount=0.5)
    with pytest.raises(ValueError, match=r"returned 0.7 at step 10; expected a float in \[0, "):
        bad.amount_at(10)


def test_update_steps() -> None:
    t = timetable(start_step=3, end_step=12, every=4)
    assert [s for s in range(20) if t.is_update(s)] == [3, 7, 11, 12]
    one_shot = timetable(start_step=5, end_step=5)
    assert [s for s in range(10) if one_shot.is_update(s)] == [5]
    assert one_shot.amount_at(5) == 0.9 and one_shot.amount_at(4) == 0.0


@pytest.mark.parametrize(
    "kw, error, words",
    [
        ({"final_amount": 1.5}, ValueError, "final_amount=1.5; expected a float in [0, 1]"),
        ({"final_amount": math.nan}, ValueError, "final_amount=nan"),
        ({"final_amount": 50}, TypeError, "final_amount=50; expected a float in [0, 1]"),
        ({"final_amount": "0.5"}, TypeError, "final_amount='0.5' of type str"),
        ({"initial_amount": 0.95}, ValueError, "initial_amount=0.95 is above final_amount"),
        ({"start_step": -1}, ValueError, "start_step=-1; expected an int >= 0"),
        ({"start_step": 1.0}, TypeError, "start_step=1.0 of type float"),
        ({"end_step": 5}, ValueError, "end_step=5 is before start_step=10"),
        ({"every": 0}, ValueError, "every=0; expected an int >= 1"),
        ({"every": True}, TypeError, "every=True"),
        ({"schedule": "exp"}, ValueError, "schedule='exp'; expected one of 'cubic', 'linear'"),
        ({"schedule": 3}, TypeError, "schedule=3 of type int"),
        ({"schedule": lambda s: 0.1}, ValueError, "initial_amount=0.1 is for the built-in"),
    ],
)
def test_bad_arguments(kw: dict[str, object], error: type[Exception], words: str) -> None:
    schedule = kw.pop("schedule", "cubic")
    with pytest.raises(error, match=r"^test: ") as caught:
        timetable(schedule, **kw)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    "step, error, words",
    [
        ("x", TypeError, "step='x' of type str; expected an int >= 0"),
        (2.5, TypeError, "step=2.5 of type float; expected an int >= 0"),
        (None, TypeError, "step=None of type NoneType"),
        (-1, ValueError, "step=-1; expected an int >= 0"),
    ],
)
def test_amount_at_a_step_that_is_not_a_count(
    step: object, error: type[Exception], words: str
) -> None:
    pruner = prune.GradualPruner(nn.Linear(4, 4), final_amount=0.5, start_step=0, end_step=10)
    with pytest.raises(error, match=r"^GradualPruner: invalid ") as caught:
        pruner.amount_at(step)  # type: ignore[arg-type]
    assert words in str(caught.value)
    assert pruner.amount_at(10) == 0.5
