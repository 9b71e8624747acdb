"""GradualConfig: the checked set-up of one GradualPruner, frozen.

Its own dataclass, not whole.Config: a gradual pruning has a schedule (final and initial
amount, start, end and period of the updates, the schedule's shape), takes a
prunekit.Criterion instance as its method, and seeds its own generator, where whole.Config
holds one amount, the registry's method names and the calibration's settings. The names
they share (method, pattern, scope, include, exclude) mean the same in both, checked by
the same vocabulary (whole.registry, whole.oneshot_plan.parse_pattern, whole.targets.globs).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from prunekit.core.checks import check_seed
from prunekit.core.errors import type_error, value_error, warn_caller
from prunekit.criteria.criterion import Criterion
from prunekit.criteria.magnitude import Magnitude
from prunekit.patterns.channels import Channels
from prunekit.patterns.nm import NM
from prunekit.patterns.pattern import Pattern
from prunekit.schedule.schedules import Timetable
from prunekit.whole.oneshot_plan import PATTERNS as PATTERN_NAMES
from prunekit.whole.oneshot_plan import parse_pattern
from prunekit.whole.registry import ALIASES, check_scope, find, names
from prunekit.whole.targets import ALL, TargetOptions, globs

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # typing_extensions: a dependency of torch
    from typing_extensions import Unpack

__all__ = ["CRITERIA", "GradualConfig", "GradualOptions", "Unpack"]

OWNER = "GradualPruner"

CRITERIA: dict[str, Callable[[], Criterion]] = {
    name: made
    for name in names(("l1", "random"), aliases=True)
    if (found := find(name)) is not None and (made := found.criterion) is not None
}
"""Criteria by the names `method` takes: the registry's methods that rank entries by a
criterion of their values ('l1', alias 'magnitude'; 'random')."""


@dataclass(frozen=True)
class GradualConfig:
    """What a GradualPruner prunes, how and when; checked when made.

    Attributes:
        final_amount: the sparsity reached at `end_step` (a fraction in [0, 1]).
        start_step: the first update step (0: when the pruner is made).
        end_step: the last update step.
        every: the steps between two updates.
        schedule: 'cubic', 'linear', 'constant' or a callable step -> sparsity.
        initial_amount: the sparsity of the first update (built-in schedules only).
        method: 'l1', 'random', 'ln' (whole output channels by their L2 norm) or a
            prunekit.Criterion; the old name 'magnitude' becomes 'l1' (a FutureWarning).
        pattern: 'unstructured', 'row', 'N:M' or a prunekit.Pattern; the old
            'channels' becomes method 'ln' (a FutureWarning).
        scope: 'layer' (each tensor) or 'global' (entries ranked across tensors).
        include: globs of the parameter names to prune (``('*',)``: every weight).
        exclude: globs of the parameter names to leave out.
        seed: seeds the pruner's own generator (None: ``torch.initial_seed()``).
        timetable: the update steps and their sparsities (made from the above).
        criterion: what ranks the entries (made from `method`).
        units: what is pruned (made from `pattern`).

    Raises:
        TypeError, ValueError: when made, for an argument of the wrong type or value,
            naming GradualPruner, the argument and the value; for an N:M pattern with a
            built-in schedule that reaches, at an update step, a sparsity other than 0
            and the pattern's one (naming the step and both sparsities).
    """

    final_amount: float
    start_step: int
    end_step: int
    every: int = 1
    schedule: str | Callable[[int], float] = "cubic"
    initial_amount: float = 0.0
    method: str | Criterion = "l1"
    pattern: str | Pattern = "unstructured"
    scope: str = "layer"
    include: tuple[str, ...] = ALL
    exclude: tuple[str, ...] = ()
    seed: int | None = None
    timetable: Timetable = field(init=False, repr=False, compare=False)
    criterion: Criterion = field(init=False, repr=False, compare=False)
    units: Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        timetable = Timetable.checked(
            self.final_amount,
            self.initial_amount,
            self.start_step,
            self.end_step,
            self.every,
            self.schedule,
            OWNER,
        )
        method, pattern = _spelled(self.method, self.pattern)
        criterion, units = _ranking(method, pattern)
        check_scope(self.scope, OWNER)
        if self.scope == "global" and units.PRUNING_TYPE != "unstructured":
            raise value_error(
                f"{OWNER}: pattern={units!r} prunes channels of each tensor, so "
                "scope must be 'layer'; scope='global' ranks entries across tensors"
            )
        check_seed(self.seed, OWNER)
        _check_nm_timetable(units, timetable)
        for name, value in (
            ("method", method),
            ("pattern", pattern),
            ("include", globs(self.include, "include", OWNER)),
            ("exclude", globs(self.exclude, "exclude", OWNER)),
            ("timetable", timetable),
            ("criterion", criterion),
            ("units", units),
            ("seed", None if self.seed is None else int(self.seed)),  # torch.Generator's
        ):
            object.__setattr__(self, name, value)


class GradualOptions(TargetOptions, total=False):
    """GradualPruner's keywords besides `config`: the fields of GradualConfig (the
    schedule's steps `start_step` and `end_step` are needed)."""

    start_step: int
    end_step: int
    every: int
    schedule: str | Callable[[int], float]
    initial_amount: float
    method: str | Criterion
    pattern: str | Pattern
    seed: int | None


def config_of(
    final_amount: float | None, config: GradualConfig | None, options: GradualOptions
) -> GradualConfig:
    """The GradualConfig of a GradualPruner: `config`, or the one `final_amount` and the
    keywords `options` make.

    Raises:
        TypeError: `config` with other arguments or not a GradualConfig; without it, no
            `final_amount`, `start_step` or `end_step`.
        TypeError, ValueError: a bad argument (see GradualConfig).
    """
    unknown = [key for key in options if key not in GradualOptions.__annotations__]
    if unknown:
        raise type_error(
            f"{OWNER}: unexpected keyword {unknown[0]}=; expected one of "
            f"{', '.join(GradualOptions.__annotations__)}, config=, example_inputs="
        )
    if config is not None:
        if final_amount is not None or options:
            given = [*(["final_amount"] if final_amount is not None else []), *options]
            raise type_error(
                f"{OWNER}: config= is given with {', '.join(given)}; expected config= alone "
                "(its fields say everything) or the arguments alone"
            )
        if not isinstance(config, GradualConfig):
            raise type_error(
                f"{OWNER}: invalid config of type {type(config).__name__}; expected a "
                "prunekit.schedule.GradualConfig"
            )
        return config
    missing = [k for k in ("start_step", "end_step") if k not in options]
    if final_amount is None:
        missing.insert(0, "final_amount")
    if missing:
        raise type_error(
            f"{OWNER}: missing {' and '.join(missing)}; expected e.g. GradualPruner(model, "
            "0.8, start_step=0, end_step=1000) or config=GradualConfig(...)"
        )
    assert final_amount is not None
    return GradualConfig(
        final_amount,
        options["start_step"],
        options["end_step"],
        every=options.get("every", 1),
        schedule=options.get("schedule", "cubic"),
        initial_amount=options.get("initial_amount", 0.0),
        method=options.get("method", "l1"),
        pattern=options.get("pattern", "unstructured"),
        scope=options.get("scope", "layer"),
        include=globs(options.get("include", ALL), "include", OWNER),
        exclude=globs(options.get("exclude", ()), "exclude", OWNER),
        seed=options.get("seed"),
    )


def _check_nm_timetable(units: Pattern, timetable: Timetable) -> None:
    """Refuse a built-in schedule that reaches, at an update step, a sparsity other than
    0 and the one an N:M pattern prunes (a callable's values are known only when called:
    the update refuses those). Updates never lower the sparsity, and once at the final one
    they stay: the steps are walked until then."""
    if not isinstance(units, NM) or timetable.by_step is not None:
        return
    reached, step = 0.0, timetable.start_step
    while True:
        reached = max(reached, timetable.amount_at(step, OWNER))
        if reached != 0 and not math.isclose(reached, units.fraction, rel_tol=0, abs_tol=1e-9):
            raise value_error(
                f"{OWNER}: pattern={units!r} prunes {units.fraction:g} of every group of "
                f"{units.m}, but the schedule gives {reached:g} at update step {step}; expected "
                f"a schedule that gives {units.fraction:g} alone (schedule='constant', "
                f"final_amount={units.fraction:g}), or 0 before it"
            )
        if reached >= timetable.final_amount or step >= timetable.end_step:
            return
        step = min(step + timetable.every, timetable.end_step)


def _spelled(method: object, pattern: object) -> tuple[object, object]:
    """`method` and `pattern` in today's spelling: the old ones ('magnitude', pattern
    'channels') still work, each with a FutureWarning naming the new one."""
    if isinstance(method, str) and method in ALIASES:
        warn_caller(
            f"{OWNER}: method={method!r} is named {ALIASES[method]!r} in every prunekit entry "
            f"point; write method={ALIASES[method]!r}. The old name will be removed in a "
            "future version.",
            FutureWarning,
        )
        method = ALIASES[method]
    if isinstance(pattern, str) and pattern == "channels":
        pattern = _old_channels(method)
        if method == "l1":
            method = "ln"
    return method, pattern


def _ranking(method: object, pattern: object) -> tuple[Criterion, Pattern]:
    """The criterion and pattern `method` and `pattern` name, in the vocabulary of every
    whole-model entry point (whole.Config's): methods of the registry ('l1', 'random',
    'ln'), patterns of whole.oneshot_plan.parse_pattern ('unstructured', 'row', 'N:M'), or
    instances."""
    if isinstance(method, str) and method == "ln":
        if not (isinstance(pattern, str) and pattern == "unstructured"):
            raise value_error(
                f"{OWNER}: method='ln' prunes whole output channels, so it takes no "
                f"pattern={pattern!r}; expected pattern='unstructured' (the default)"
            )
        return Magnitude(), Channels(dim=0, norm=2)
    if isinstance(method, Criterion):
        criterion = method
    elif isinstance(method, str) and method in CRITERIA and method not in ALIASES:
        criterion = CRITERIA[method]()
    else:
        raise value_error(
            f"{OWNER}: invalid method={method!r}; expected one of 'l1', 'random', 'ln' (whole "
            "output channels by their L2 norm) or a prunekit.Criterion instance"
        )
    if not isinstance(pattern, Pattern) and not isinstance(pattern, str):
        raise value_error(
            f"{OWNER}: invalid pattern={pattern!r}; expected {PATTERN_NAMES} or a "
            "prunekit.Pattern instance"
        )
    return criterion, parse_pattern(pattern, OWNER)


def _old_channels(method: object) -> str | Pattern:
    """What pattern='channels' becomes, with the FutureWarning saying how to write it."""
    channels = method in ("l1", "ln") if isinstance(method, str) else False
    instead = "method='ln'" if channels else "pattern=prunekit.Channels(dim=0, norm=2)"
    warn_caller(
        f"{OWNER}: pattern='channels' (output channels by their L2 norm) is written "
        f"{instead} in every prunekit entry point; write {instead}. The old spelling will be "
        "removed in a future version.",
        FutureWarning,
    )
    return "unstructured" if channels else Channels(dim=0, norm=2)
