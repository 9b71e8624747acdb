"""The sparsity schedules of gradual pruning: how much is pruned at each training step.

A built-in schedule is a shape ``f(progress)`` in [0, 1], the fraction of the way from
`initial_amount` to `final_amount` once `progress` = (step - start) / (end - start) of
the pruning period is done: at an update step t in [start, end] the sparsity is

    s(t) = s_i + (s_f - s_i) * f((t - start) / (end - start))

- ``cubic``: f(p) = 1 - (1 - p)**3, i.e. s(t) = s_f + (s_i - s_f) * (1 - p)**3, the
  schedule of Zhu & Gupta (2017), "To prune, or not to prune" (torch.ao.pruning's CubicSL
  with ``initially_zero=True``): fast at first, while there are many redundant weights,
  then slower;
- ``linear``: f(p) = p;
- ``constant``: f(p) = 1, the final sparsity from the start on (one-shot, then held).

A callable schedule is given the step itself and returns the sparsity at it.
Before `start` nothing is pruned; after `end` the sparsity stays where it is.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prunekit.core.errors import type_error, value_error

__all__ = ["SCHEDULES", "Timetable", "constant", "cubic", "linear"]

FRACTION_RULE = "a float in [0, 1] (a fraction of the units: entries, or channels)"


def cubic(progress: float) -> float:
    """1 - (1 - p)**3: the share of the way to the final sparsity at progress p."""
    return 1.0 - (1.0 - progress) ** 3


def linear(progress: float) -> float:
    """p: equal increments."""
    return progress


def constant(progress: float) -> float:
    """1: the final sparsity from the first update on."""
    return 1.0


SCHEDULES: dict[str, Callable[[float], float]] = {
    "cubic": cubic,
    "linear": linear,
    "constant": constant,
}
"""The built-in schedule shapes by name."""


@dataclass(frozen=True)
class Timetable:
    """When the masks are updated and to which sparsity.

    Updates happen at `start_step`, then every `every` steps, and at `end_step` (also
    when end - start is not a multiple of every), never after it.
    """

    final_amount: float
    initial_amount: float
    start_step: int
    end_step: int
    every: int
    shape: Callable[[float], float] | None  # None: `by_step` gives the amount itself
    by_step: Callable[[int], float] | None = None

    @classmethod
    def checked(
        cls,
        final_amount: Any,
        initial_amount: Any,
        start_step: Any,
        end_step: Any,
        every: Any,
        schedule: Any,
        owner: str,
    ) -> Timetable:
        """A timetable from a user's arguments, each checked with an error naming it."""
        final = _fraction(final_amount, "final_amount", owner)
        initial = _fraction(initial_amount, "initial_amount", owner)
        if initial > final:
            raise value_error(
                f"{owner}: initial_amount={initial!r} is above final_amount={final!r}; "
                "expected initial_amount <= final_amount (pruning only adds zeros)"
            )
        start = _step(start_step, "start_step", owner, low=0)
        end = _step(end_step, "end_step", owner, low=0)
        if end < start:
            raise value_error(
                f"{owner}: end_step={end} is before start_step={start}; "
                "expected start_step <= end_step"
            )
        period = _step(every, "every", owner, low=1)
        if isinstance(schedule, str):
            if schedule not in SCHEDULES:
                raise value_error(
                    f"{owner}: invalid schedule={schedule!r}; expected one of "
                    f"{', '.join(map(repr, SCHEDULES))} or a callable step -> sparsity"
                )
            return cls(final, initial, start, end, period, SCHEDULES[schedule])
        if not callable(schedule):
            raise type_error(
                f"{owner}: invalid schedule={schedule!r} of type {type(schedule).__name__}; "
                f"expected one of {', '.join(map(repr, SCHEDULES))} or a callable "
                "step -> sparsity"
            )
        if initial != 0:
            raise value_error(
                f"{owner}: initial_amount={initial!r} is for the built-in schedules; a "
                "callable schedule gives the sparsity itself (expected initial_amount=0)"
            )
        return cls(final, initial, start, end, period, None, schedule)

    def is_update(self, step: int) -> bool:
        """Whether the masks are recomputed at `step`."""
        if not self.start_step <= step <= self.end_step:
            return False
        return step == self.end_step or (step - self.start_step) % self.every == 0

    def amount_at(self, step: int, owner: str = "schedule") -> float:
        """The scheduled sparsity at `step` (0 before start_step), by the formula."""
        step = _step(step, "step", owner, 0)
        if step < self.start_step:
            return 0.0
        step = min(step, self.end_step)
        if self.by_step is not None:
            return self._called(step, owner)
        assert self.shape is not None
        span = self.end_step - self.start_step
        progress = 1.0 if span == 0 else (step - self.start_step) / span
        share = self.shape(progress)
        if share >= 1.0:  # s_i + (s_f - s_i) can round above s_f: the target itself
            return self.final_amount
        amount = self.initial_amount + (self.final_amount - self.initial_amount) * share
        return min(amount, self.final_amount)

    def _called(self, step: int, owner: str) -> float:
        assert self.by_step is not None
        value = self.by_step(step)
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not 0.0 <= float(value) <= self.final_amount
        ):
            raise value_error(
                f"{owner}: the schedule returned {value!r} at step {step}; expected a "
                f"float in [0, final_amount={self.final_amount}]"
            )
        return float(value)


def _fraction(value: Any, what: str, owner: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise type_error(
            f"{owner}: invalid {what}={value!r} of type {type(value).__name__}; "
            f"expected {FRACTION_RULE}"
        )
    result = float(value)
    if isinstance(value, numbers.Integral) and result not in (0.0, 1.0):
        raise type_error(
            f"{owner}: invalid {what}={value!r}; expected {FRACTION_RULE}: a schedule "
            "reaches fractions, not counts"
        )
    if math.isnan(result) or not 0.0 <= result <= 1.0:
        raise value_error(f"{owner}: invalid {what}={value!r}; expected {FRACTION_RULE}")
    return result


def _step(value: Any, what: str, owner: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise type_error(
            f"{owner}: invalid {what}={value!r} of type {type(value).__name__}; "
            f"expected an int >= {low}"
        )
    if value < low:
        raise value_error(f"{owner}: invalid {what}={value!r}; expected an int >= {low}")
    return int(value)
