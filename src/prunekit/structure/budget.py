"""Budgets: one target for the whole model, met by a non-uniform choice of units to remove.

A ``Budget`` asks for a share of the model's parameters (non-embedding ones by default), of
its multiply-accumulates, of its measured CPU latency or of the units of its candidate
groups (``units=``: every channel or head counts one) to go. The allocate stage meets it
(``prunekit.structure.stages.meet_budget``, counting through ``stages.ledger``) from
the units of every candidate group at once: each unit's score is divided by its group's mean
(so scores compare across layers and criteria scales; every group's units average 1), then
by its cost relative to the average unit of its kind (the parameters or MACs that removing
it alone saves), and the units of lowest value for their cost go first, until the target is
met: in steps that keep the constraints below, where a step that would pass the target by
more than the smallest step left that would meet it alone removes is passed over (with its
group's later steps), and the steps taken are then put back, the last taken first, wherever
the target stays met without them (so a large step that had to come last leaves no smaller
ones on top). Removals are counted exactly as ``compact`` will make them (a weight that loses rows
and columns to two groups loses their product once). Constraints hold throughout: a group
keeps at least one unit (and at least `floor` of its units), channel and hidden widths a
multiple of `round_to`, and grouped-query heads leave the same count in every key/value
group.

Units. ``Budget(units=...)`` counts units, not what they hold: a unit of any group costs
one, so the units of lowest relative score go first, all groups ranked together (what
``scope='global'`` does, within the budget's constraints). Without a `floor` a group whose
scores are spread widely (a narrow residual width of a CNN, say) can lose most of its units
to the wide groups' average ones; ``floor=0.5`` keeps half of every group, and
``floor={"*proj*": 0.8, "*": 0.3}`` 80 % of the groups whose name matches ``*proj*`` and
30 % of the others. ``floor="auto"`` follows the share asked: every group keeps at least
``AUTO_FLOOR`` of the share of its units that a uniform cut meeting the budget would leave
it (the highest floor at which the budget can still be met), so no layer is cut far beyond
the average, and a larger share lowers the floor with it.

Depth and width in one budget: blocks that ``prune_blocks`` (or ``skip_blocks``) skipped
count as removed, both in what goes and in the total, and their groups are no candidates
(their tensors go whole with the block); the width meets the rest of the target. So one
target is met by a two-stage call: ``prune_blocks``, then ``prune_channels(...,
budget=...)``, then ``remove_blocks`` and ``compact``.

Latency. ``Budget(latency=...)`` counts milliseconds of one forward on the example inputs.
Before allocating, each kind is probed once (``prunekit.structure.probe``): about half of the
units of every group of that kind (in score order) are removed for real, the model is
compacted and timed against itself as it was (`runs` alternated pairs), and put back. The
time saved over the MACs removed gives that kind's milliseconds per MAC; a unit then costs
its MACs times its kind's rate (so a head, whose attention products no weight counts, costs
what its probe measured), units compete across kinds on score per millisecond, and the
target is the share of the model's measured time. The model is assumed linear in each
kind's MACs between none and the probe's cut; blocks already skipped are neither counted nor
removed (they no longer run, so the time measured is without them).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from prunekit.core.checks import as_float, check_number
from prunekit.core.errors import shown, type_error, value_error
from prunekit.structure.pruned import PrunedGroup

KINDS = ("channels", "heads", "hidden")
AUTO = "auto"
AUTO_FLOOR = 0.9
"""``floor="auto"``: the share of the uniform cut's width that every group keeps at least.
On SmolLM2-135M (a budget of its parameters over MLP widths and query heads, round_to 64,
five text domains) the floors that gave the best worst domain, 0.65 at 20 %, 0.5-0.55 at
35 % and 0.35 at 50 %, keep the widths that 0.9 of the highest floor the budget allows
(0.71, 0.58, 0.375) keeps (docs/benchmarks.md)."""
MEASURES = ("params", "macs", "latency", "units")
"""What a Budget can count, one of them per Budget."""


@dataclass(frozen=True)
class Budget:
    """One target for ``prune_channels(..., budget=...)``: exactly one of `params`, `macs`,
    `latency` or `units`.

    Args:
        params: the share of the model's parameters to remove, in (0, 1). Parameters held by
            an ``nn.Embedding`` (and a head tied to one) are left out of the count, both of
            what goes and of the total, unless `embeddings` is True.
        macs: the share of the multiply-accumulates of one forward on the example inputs to
            remove, in (0, 1): those of the convolutions and linear layers (Hugging Face's
            Conv1D too); attention's own matrix products are not counted, nor the
            projections of nn.MultiheadAttention (they run inside its one function).
        latency: the share of the measured CPU time of one forward on the example inputs to
            remove, in (0, 1): each kind is probed once, compacted and timed (see the
            module's docstring), which takes a few compactions and 2 x `runs` forwards per
            kind; a copy of the weights it cuts is in memory meanwhile.
        kinds: the kinds of groups that may lose units: 'channels' (conv and linear outputs,
            MLP widths), 'heads', 'hidden' (the residual width; it narrows a base model's
            output, so it is only pruned when listed).
        embeddings: count the embedding parameters too (`params` only).
        runs: alternated pairs of forwards (the model as it is, then compacted) timed per
            kind for `latency` (the median of their ratios counts); an int >= 1.
        units: the share of the units of the candidate groups (those of `kinds`, less the
            excluded ones) to remove, in (0, 1); each channel or head counts one, whatever
            it holds.
        floor: the least share of its units that every group keeps, in [0, 1): a group of
            n units keeps at least ceil(floor x n) of them (rounded up to a multiple of
            `round_to`; per key/value group for grouped-query heads); 0 keeps one. Or a
            mapping from globs over group names (as ``BudgetReport.rows`` names them) to
            such shares: a group takes the share of the first glob that matches its name,
            0 where none does (``"*"`` sets the rest); kept as a tuple of pairs
            (``prune_channels`` refuses a glob that matches no candidate group). Or
            ``"auto"``: ``AUTO_FLOOR`` (0.9) of the highest floor for all groups at which
            the budget can be met, found when it is (``BudgetReport.floor`` says which).
        sensitivity: how much a group's level of scores counts, in [0, 1]. Each unit's
            score is divided by group_mean^(1 - sensitivity) x kind_mean^sensitivity (the
            means of its group's scores and of all units of its kind): 0 (the default)
            compares units within their group only, so every group's units average 1; 1
            compares the scores as they are across the groups of a kind, so a layer whose
            units all score high (its removals leave more error) keeps more of them.

    Raises:
        ValueError: a share outside (0, 1), not exactly one of `params`, `macs`, `latency`
            and `units`, an unknown or repeated kind, `embeddings=True` without `params`,
            `runs` below 1, a `floor` share outside [0, 1), an empty mapping or another
            string than 'auto', a `sensitivity` outside [0, 1].
        TypeError: a share, `floor` (or one of its globs), `embeddings`, `runs` or
            `sensitivity` of the wrong type.
    """

    params: float | None = None
    macs: float | None = None
    kinds: tuple[str, ...] = ("channels", "heads")
    embeddings: bool = False
    latency: float | None = None
    runs: int = 5
    units: float | None = None
    floor: float | str | Mapping[str, float] | tuple[tuple[str, float], ...] = 0.0
    sensitivity: float = 0.0

    def __post_init__(self) -> None:
        for name in MEASURES:
            value = getattr(self, name)
            if value is None:
                continue
            wanted = f"a float in (0, 1): the share of the model's {COUNTED[name]} to remove"
            check_number(value, name, "Budget", wanted, lambda v: 0.0 < v < 1.0)
            object.__setattr__(self, name, float(value))
        given = [n for n in MEASURES if getattr(self, n) is not None]
        if len(given) != 1:
            raise value_error(
                f"Budget: params={self.params!r}, macs={self.macs!r}, latency={self.latency!r}, "
                f"units={self.units!r}; expected exactly one of them, such as "
                "Budget(params=0.2)"
            )
        object.__setattr__(self, "floor", _checked_floor(self.floor))
        if not isinstance(self.embeddings, bool):
            raise type_error(f"Budget: invalid embeddings={self.embeddings!r}; expected a bool")
        if self.embeddings and self.params is None:
            raise value_error(
                "Budget: embeddings=True counts embedding parameters, so it goes with params=; "
                f"got {given[0]}={getattr(self, given[0])!r}"
            )
        wanted = "an int >= 1: the alternated pairs of forwards timed per kind (latency= only)"
        check_number(self.runs, "runs", "Budget", wanted, lambda v: v >= 1, integral=True)
        object.__setattr__(self, "runs", int(self.runs))
        wanted = "a float in [0, 1]: how much a group's level of scores counts"
        check_number(self.sensitivity, "sensitivity", "Budget", wanted, lambda v: 0 <= v <= 1)
        object.__setattr__(self, "sensitivity", float(self.sensitivity))
        kinds = self.kinds
        if isinstance(kinds, str) or not isinstance(kinds, tuple | list):
            raise type_error(
                f"Budget: invalid kinds={kinds!r}; expected a tuple of kinds among {list(KINDS)}"
            )
        if not kinds or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
            raise value_error(
                f"Budget: invalid kinds={kinds!r}; expected distinct kinds among {list(KINDS)}, "
                "at least one"
            )
        object.__setattr__(self, "kinds", tuple(kinds))

    def floor_of(self, name: str) -> float:
        """The least share of its units that the group called `name` keeps.

        Args:
            name: a group's name (``ChannelGroup.name``), matched against the globs of a
                ``floor`` given per name.

        Returns:
            The share, in [0, 1]: the one ``floor`` number, or the first glob's that
            matches `name` (0 when none does).

        Raises:
            ValueError: ``floor="auto"``, which depends on the model (``BudgetReport.floor``
                holds what it was).
        """
        if self.floor == AUTO:
            raise value_error(
                f"Budget.floor_of({name!r}): floor='auto' is found when the budget is met, "
                "from the model's groups; expected a numeric floor, or BudgetReport.floor"
            )
        if not isinstance(self.floor, tuple):
            return float(self.floor)  # type: ignore[arg-type]  # checked: a number
        return next((float(v) for k, v in self.floor if fnmatchcase(name, k)), 0.0)

    @property
    def measure(self) -> str:
        """What the target counts: 'params', 'macs', 'latency' or 'units'."""
        return next(n for n in MEASURES if getattr(self, n) is not None)

    @property
    def share(self) -> float:
        """The share of it to remove."""
        return float(getattr(self, self.measure))


def _checked_floor(floor: Any) -> float | str | tuple[tuple[str, float], ...]:
    """`floor` as Budget keeps it: a share in [0, 1), 'auto', or (glob, share) pairs."""
    wanted = (
        "expected a float in [0, 1) (the least share of its units that every group keeps), "
        "'auto' or a mapping from globs over group names to such floats"
    )
    if isinstance(floor, str):
        if floor != AUTO:
            raise value_error(f"Budget: invalid floor={floor!r}; {wanted}")
        return floor
    pairs = list(floor.items()) if isinstance(floor, Mapping) else None
    if isinstance(floor, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in floor):
        pairs = list(floor)
    if pairs is None:
        _check_share(floor, f"floor={shown(floor)}", wanted)
        return float(floor)
    if not pairs:
        raise value_error(f"Budget: invalid floor={shown(floor)}; {wanted}, not an empty one")
    for glob, share in pairs:
        if not isinstance(glob, str):
            raise type_error(
                f"Budget: invalid floor={shown(floor)}: glob {shown(glob)} is no str; {wanted}"
            )
        _check_share(share, f"floor={shown(floor)}: {glob!r} -> {shown(share)}", wanted)
    return tuple((glob, float(share)) for glob, share in pairs)


def _check_share(share: Any, what: str, wanted: str) -> None:
    if isinstance(share, bool) or not isinstance(share, numbers.Real):
        raise type_error(f"Budget: invalid {what}; {wanted}")
    if not 0.0 <= as_float(share) < 1.0:  # an int too large for a float: its infinity
        raise value_error(f"Budget: invalid {what}; {wanted}")


COUNTED = {"params": "parameters", "macs": "multiply-accumulates",
         "latency": "milliseconds of one forward",
         "units": "units of the candidate groups"}  # fmt: skip


@dataclass(frozen=True)
class BudgetRow:
    """What one group kept: its name, kind and units before and after."""

    name: str
    kind: str
    before: int
    after: int


class BudgetReport(list[PrunedGroup]):
    """The groups pruned to meet a budget (a list of PrunedGroup, as ``prune_channels``
    returns without one), with what each kept and the share achieved; ``str()`` is a table.

    `total`: the parameters (or MACs) counted; `removed`: how many of them the masked units
    and the skipped blocks make (once compacted and removed), `depth` of them the blocks';
    `achieved` = removed / total, at least `target`, and above it by no more than the
    smallest step that could meet it (see the module's docstring). For a latency budget,
    `total` is the measured milliseconds, `removed` the estimate from the probes, and
    `rates` each kind's milliseconds saved per MAC removed (empty otherwise).

    Args:
        pruned: the groups pruned, as ``prune_channels`` returns them; the report is this
            list.
        budget: the budget met.
        total: the parameters, MACs or milliseconds counted over the model.
        removed: how many of them the masked units and skipped blocks remove once compacted.
        rows: what each candidate group kept.
        depth: how many of `removed` the skipped blocks make (0 without depth).
        rates: for a latency budget, each kind's milliseconds saved per MAC removed.
        floor: the floor every group kept where ``floor="auto"`` found it (None otherwise).

    Attributes:
        budget: the budget met.
        total: as given.
        removed: as given.
        rows: what each candidate group kept (name, kind, units before and after).
        depth: as given.
        rates: as given (empty but for a latency budget).
        floor: as given.
    """

    def __init__(
        self, pruned: list[PrunedGroup], budget: Budget, total: float, removed: float,
        rows: list[BudgetRow], depth: float = 0.0, rates: dict[str, float] | None = None,
        floor: float | None = None,
    ) -> None:  # fmt: skip
        super().__init__(pruned)
        self.budget = budget
        self.total = total
        self.removed = removed
        self.rows = tuple(rows)
        self.depth = depth
        self.rates = dict(rates or {})
        self.floor = floor

    @property
    def target(self) -> float:
        return self.budget.share

    @property
    def achieved(self) -> float:
        return self.removed / self.total if self.total else 0.0

    def __str__(self) -> str:
        what = COUNTED[self.budget.measure]
        if self.budget.measure == "params" and not self.budget.embeddings:
            what = "non-embedding " + what
        names = [r.name if len(r.name) <= 60 else r.name[:57] + "..." for r in self.rows]
        width = max([len("group")] + [len(n) for n in names])
        digits = 2 if self.budget.measure == "latency" else 0
        lines = [
            f"budget {self.target:.1%} of {self.total:,.{digits}f} {what}: removed "
            f"{self.removed:,.{digits}f} ({self.achieved:.2%})"
            + (f", of which {self.depth:,.0f} in skipped blocks" if self.depth else "")
            + (f"; floor 'auto': {self.floor:.3f}" if self.floor is not None else ""),
            f"{'group':<{width}}  {'kind':<8}  {'units':>6}  {'kept':>6}",
        ]
        lines += [f"{n:<{width}}  {r.kind:<8}  {r.before:>6}  {r.after:>6}"
                  for n, r in zip(names, self.rows, strict=True)]  # fmt: skip
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"BudgetReport({self.budget!r}, achieved={self.achieved:.4f}, groups={len(self.rows)})"
        )
