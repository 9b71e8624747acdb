"""recover's budget of CPU time: it ends the run, the schedule follows it, it is checked."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit as prune
from prunekit.schedule.recovery import _Plan


class _Clocks:
    """recover's clocks, made up: each answer of the teacher below takes 1 s of wall time
    and 0.1 s of CPU time, and nothing else takes any."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def perf_counter(self) -> float:
        return self.wall

    def process_time(self) -> float:
        return self.cpu


class _Waiting(nn.Module):
    def __init__(self, clocks: _Clocks) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 4)
        self.clocks = clocks

    def forward(self, x: Tensor) -> Tensor:
        self.clocks.wall += 1.0
        self.clocks.cpu += 0.1
        out: Tensor = self.layer(x)
        return out


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> _Clocks:
    """recover's clocks replaced by made-up ones."""
    import prunekit.schedule.recovery as recovery

    made_up = _Clocks()
    monkeypatch.setattr(recovery, "time", made_up)
    return made_up


def test_a_cpu_budget_ends_the_run_and_waiting_does_not_spend_it(clocks: _Clocks) -> None:
    torch.manual_seed(0)
    student = nn.Linear(3, 4)
    distiller = prune.Distiller(_Waiting(clocks))
    done = prune.recover(student, distiller, [torch.randn(2, 3)], cpu_seconds=0.5)
    # 0.1 CPU s a step: the fifth reaches the budget (to rounding, the fifth or sixth),
    # while the wall clock, 1 s a step, ran ten times as far
    assert done.steps in (5, 6), done
    assert done.cpu_seconds == pytest.approx(0.1 * done.steps)
    assert done.seconds == pytest.approx(1.0 * done.steps)
    # a wall budget of the same size stops after the first step
    clocks.wall = clocks.cpu = 0.0
    walled = prune.recover(nn.Linear(3, 4), distiller, [torch.randn(2, 3)], seconds=0.5)
    assert walled.steps == 1, walled


@pytest.mark.parametrize(("seconds", "cpu_seconds"), [(3.0, 60.0), (100.0, 0.3)])
def test_with_a_wall_budget_as_well_the_first_to_end_stops_it(
    clocks: _Clocks, seconds: float, cpu_seconds: float
) -> None:
    distiller = prune.Distiller(_Waiting(clocks))
    done = prune.recover(
        nn.Linear(3, 4), distiller, [torch.randn(2, 3)], seconds=seconds, cpu_seconds=cpu_seconds
    )
    assert done.steps == 3, done  # 3 s of wall time, or 0.3 s of CPU time
    assert done.seconds < seconds + 1 and done.cpu_seconds < cpu_seconds + 0.1, done


def test_the_rate_follows_the_share_of_cpu_time_used() -> None:
    plan = _Plan(seconds=None, steps=None, lr=1.0, warmup=0, cpu_seconds=10.0)
    assert plan.used(3, 1000.0, 5.0) == pytest.approx(0.5)  # wall time does not count
    assert plan.rate(3, 1000.0, 5.0) == pytest.approx(0.5)
    assert plan.rate(3, 0.0, 10.0) == pytest.approx(0.0)
    both = _Plan(seconds=10.0, steps=100, lr=1.0, warmup=0, cpu_seconds=20.0)
    assert both.used(10, 1.0, 15.0) == pytest.approx(0.75)  # the furthest on of the three
    assert both.used(10, 9.0, 15.0) == pytest.approx(0.9)
    assert both.used(80, 1.0, 1.0) == pytest.approx(0.8)


_M = nn.Linear(2, 2)
_D = prune.Distiller(nn.Linear(2, 2))
_B = [torch.zeros(1, 2)]


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (0.0, ValueError, r"recover: invalid cpu_seconds=0.0; expected a finite float > 0"),
        (-1.0, ValueError, r"recover: invalid cpu_seconds=-1.0"),
        (math.inf, ValueError, r"recover: invalid cpu_seconds=inf"),
        (math.nan, ValueError, r"recover: invalid cpu_seconds=nan"),
        (True, TypeError, r"recover: invalid cpu_seconds=True of type bool"),
        ("60", TypeError, r"recover: invalid cpu_seconds='60' of type str"),
    ],
)
def test_a_bad_cpu_budget_is_refused(value: Any, error: type, words: str) -> None:
    before = {n: p.detach().clone() for n, p in _M.named_parameters()}
    with pytest.raises(error, match=words):
        prune.recover(_M, _D, _B, cpu_seconds=value)
    for name, p in _M.named_parameters():
        assert torch.equal(p, before[name])


def test_no_budget_at_all_names_all_three() -> None:
    with pytest.raises(ValueError, match=r"recover: neither seconds nor steps given, nor "
                       r"cpu_seconds; expected a budget of wall time"):  # fmt: skip
        prune.recover(_M, _D, _B)
