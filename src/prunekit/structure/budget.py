"""Budgets: one target for the whole model, met by a non-uniform choice of units to remove.

A ``Budget`` asks for a share of the model's parameters (non-embedding ones by default), of
its multiply-accumulates, of its measured CPU latency or of the units of its candidate
groups (``units=``: every channel or head counts one) to go. ``allocate`` meets it from
the units of every candidate group at once: each unit's score is divided by its group's mean
(so scores compare across layers and criteria scales; every group's units average 1), then
by its cost relative to the average unit of its kind (the parameters or MACs that removing
it alone saves), and the units of lowest value for their cost go first, until the target is
met. Removals are counted exactly as ``compact`` will make them (a weight that loses rows
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
30 % of the others.

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

import heapq
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from torch import Tensor, nn

from prunekit.core.checks import check_number
from prunekit.core.errors import type_error, value_error
from prunekit.core.naming import stored_parameter
from prunekit.structure.depth.blocks import is_skipped
from prunekit.structure.families.experts import width_step
from prunekit.structure.graph.graph import ChannelGroup, Slice, split_inputs
from prunekit.structure.measure import macs_per_entry
from prunekit.structure.probe import Probe
from prunekit.structure.pruned import PrunedGroup

KINDS = ("channels", "heads", "hidden")
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
            0 where none does (``"*"`` sets the rest); kept as a tuple of pairs.

    Raises:
        ValueError: a share outside (0, 1), not exactly one of `params`, `macs`, `latency`
            and `units`, an unknown or repeated kind, `embeddings=True` without `params`,
            `runs` below 1, a `floor` share outside [0, 1) or an empty mapping.
        TypeError: a share, `floor` (or one of its globs), `embeddings` or `runs` of the
            wrong type.
    """

    params: float | None = None
    macs: float | None = None
    kinds: tuple[str, ...] = ("channels", "heads")
    embeddings: bool = False
    latency: float | None = None
    runs: int = 5
    units: float | None = None
    floor: float | Mapping[str, float] | tuple[tuple[str, float], ...] = 0.0

    def __post_init__(self) -> None:
        for name in MEASURES:
            value = getattr(self, name)
            if value is None:
                continue
            wanted = f"a float in (0, 1): the share of the model's {_WHAT[name]} to remove"
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
        """
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


def _checked_floor(floor: Any) -> float | tuple[tuple[str, float], ...]:
    """`floor` as Budget keeps it: a share in [0, 1), or (glob, share) pairs."""
    wanted = (
        "expected a float in [0, 1) (the least share of its units that every group keeps) "
        "or a mapping from globs over group names to such floats"
    )
    pairs = list(floor.items()) if isinstance(floor, Mapping) else None
    if isinstance(floor, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in floor):
        pairs = list(floor)
    if pairs is None:
        _check_share(floor, f"floor={floor!r}", wanted)
        return float(floor)
    if not pairs:
        raise value_error(f"Budget: invalid floor={floor!r}; {wanted}, not an empty one")
    for glob, share in pairs:
        if not isinstance(glob, str):
            raise type_error(f"Budget: invalid floor={floor!r}: glob {glob!r} is no str; {wanted}")
        _check_share(share, f"floor={floor!r}: {glob!r} -> {share!r}", wanted)
    return tuple((glob, float(share)) for glob, share in pairs)


def _check_share(share: Any, what: str, wanted: str) -> None:
    if isinstance(share, bool) or not isinstance(share, numbers.Real):
        raise type_error(f"Budget: invalid {what}; {wanted}")
    if not 0.0 <= float(share) < 1.0:
        raise value_error(f"Budget: invalid {what}; {wanted}")


_WHAT = {"params": "parameters", "macs": "multiply-accumulates",
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
    `achieved` = removed / total, at least `target`. For a latency budget, `total` is the
    measured milliseconds, `removed` the estimate from the probes, and `rates` each kind's
    milliseconds saved per MAC removed (empty otherwise).

    Args:
        pruned: the groups pruned, as ``prune_channels`` returns them; the report is this
            list.
        budget: the budget met.
        total: the parameters, MACs or milliseconds counted over the model.
        removed: how many of them the masked units and skipped blocks remove once compacted.
        rows: what each candidate group kept.
        depth: how many of `removed` the skipped blocks make (0 without depth).
        rates: for a latency budget, each kind's milliseconds saved per MAC removed.

    Attributes:
        budget: the budget met.
        total: as given.
        removed: as given.
        rows: what each candidate group kept (name, kind, units before and after).
        depth: as given.
        rates: as given (empty but for a latency budget).
    """

    def __init__(
        self, pruned: list[PrunedGroup], budget: Budget, total: float, removed: float,
        rows: list[BudgetRow], depth: float = 0.0, rates: dict[str, float] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(pruned)
        self.budget = budget
        self.total = total
        self.removed = removed
        self.rows = tuple(rows)
        self.depth = depth
        self.rates = dict(rates or {})

    @property
    def target(self) -> float:
        return self.budget.share

    @property
    def achieved(self) -> float:
        return self.removed / self.total if self.total else 0.0

    def __str__(self) -> str:
        what = _WHAT[self.budget.measure]
        if self.budget.measure == "params" and not self.budget.embeddings:
            what = "non-embedding " + what
        names = [r.name if len(r.name) <= 60 else r.name[:57] + "..." for r in self.rows]
        width = max([len("group")] + [len(n) for n in names])
        digits = 2 if self.budget.measure == "latency" else 0
        lines = [
            f"budget {self.target:.1%} of {self.total:,.{digits}f} {what}: removed "
            f"{self.removed:,.{digits}f} ({self.achieved:.2%})"
            + (f", of which {self.depth:,.0f} in skipped blocks" if self.depth else ""),
            f"{'group':<{width}}  {'kind':<8}  {'units':>6}  {'kept':>6}",
        ]
        lines += [f"{n:<{width}}  {r.kind:<8}  {r.before:>6}  {r.after:>6}"
                  for n, r in zip(names, self.rows, strict=True)]  # fmt: skip
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"BudgetReport({self.budget!r}, achieved={self.achieved:.4f}, groups={len(self.rows)})"
        )


@dataclass
class _Tensor:
    """A parameter's shape, what one of its entries costs, and the positions removed."""

    shape: tuple[int, ...]
    weight: float
    removed: dict[int, set[int]] = field(default_factory=dict)

    def cost(self) -> float:
        kept = math.prod(n - len(self.removed.get(d, ())) for d, n in enumerate(self.shape))
        return self.weight * (math.prod(self.shape) - kept)


class _Ledger:
    """What the units chosen so far remove, counted per tensor as compact slices them."""

    def __init__(self, tensors: dict[int, _Tensor], units: bool = False) -> None:
        self.tensors = tensors
        self.units = units
        self.removed = 0.0

    def remove(self, group: ChannelGroup, units: tuple[int, ...], rate: float = 1.0) -> None:
        """Count `units` of `group` as removed, what they save times `rate` (with `units`
        set at construction, the units themselves)."""
        if self.units:
            self.removed += rate * len(units)
            return
        for s in _costed(group):
            t = self.tensors.get(_key(s))
            if t is None:
                continue
            before = t.cost()
            t.removed.setdefault(s.dim, set()).update(p for u in units for p in s.indices[u])
            self.removed += rate * (t.cost() - before)


def check_budget(budget: Any, amounts: dict[str, Any], scope: str) -> None:
    """`budget` is a Budget and replaces `amount`/`heads`/`hidden`/`experts` and `scope`."""
    if not isinstance(budget, Budget):
        raise type_error(
            f"prune_channels: invalid budget={budget!r}; expected a prunekit.Budget such as "
            "Budget(params=0.2), or None"
        )
    given = {k: v for k, v in amounts.items() if v}
    if given:
        names = {"channels": "amount", "heads": "heads", "hidden": "hidden", "experts": "experts"}
        shown = ", ".join(f"{names[k]}={v!r}" for k, v in given.items())
        raise value_error(
            f"prune_channels: budget={budget!r} chooses the share of every kind itself; got "
            f"{shown} too; expected amount, heads, hidden and experts left at 0 (the kinds go "
            "in Budget(kinds=...))"
        )
    if scope != "layer":
        raise value_error(
            f"prune_channels: budget={budget!r} ranks all groups together already; expected "
            f"scope='layer' (the default), got scope={scope!r}"
        )


def allocate(
    model: nn.Module, example_inputs: Any, groups: list[ChannelGroup], scores: list[Tensor],
    budget: Budget, round_to: int | None, probe: Probe | None = None,
) -> BudgetReport:  # fmt: skip
    """The units of `groups` to mask so that `budget` is met (nothing is changed; a latency
    budget times the model through `probe`, which leaves it as it was).

    Raises:
        ValueError: the budget cannot be met within the groups' constraints.
    """
    by_units = budget.measure == "units"
    if by_units:  # every candidate unit counts one; skipped blocks hold no candidate group
        weights: dict[int, float] = {}
        total, depth = float(sum(g.size for g in groups)), 0.0
    else:
        weights = _weights(model, example_inputs, budget)
        total = sum(p.numel() * weights.get(id(p), 0.0) for p in _unique_parameters(model))
        gone = _in_skipped_blocks(model)
        depth = sum(p.numel() * weights.pop(id(p), 0.0) for p in gone)  # not saved again
    if total <= 0:
        raise value_error(
            f"prune_channels: budget={budget!r}, but {type(model).__name__} has no "
            f"{_WHAT[budget.measure]} to count (see Budget); expected a model that has some"
        )
    tensors = {
        _key(s): _Tensor(tuple(_parameter(s).shape), weights.get(_key(s), 0.0))
        for g in groups for s in _costed(g)
    }  # fmt: skip
    floors = [budget.floor_of(g.name) for g in groups]
    unit_cost = [[1.0] * g.size if by_units else _unit_costs(g, tensors) for g in groups]
    rates: dict[str, float] = {}
    if budget.measure == "latency":
        assert probe is not None, "a latency budget needs a probe"
        chains = _chains(groups, scores, unit_cost, round_to, floors)
        total, rates = _rates(groups, chains, tensors, probe)
        unit_cost = [
            [c * rates[g.kind] for c in cs] for g, cs in zip(groups, unit_cost, strict=True)
        ]
        depth = 0.0  # skipped blocks no longer run: the time measured is without them
    pooled = budget.measure == "latency"
    chains = _chains(groups, scores, unit_cost, round_to, floors, pooled=pooled)
    heap = [(chain[0][0], k, 0) for k, chain in enumerate(chains) if chain]
    heapq.heapify(heap)
    ledger = _Ledger(tensors, units=by_units)
    ledger.removed = depth
    taken: list[list[int]] = [[] for _ in groups]
    goal = budget.share * total
    while ledger.removed < goal * (1 - 1e-12):
        if not heap:
            _unreachable(budget, total, ledger.removed, round_to)
        _, k, step = heapq.heappop(heap)
        units = chains[k][step][1]
        ledger.remove(groups[k], units, rates.get(groups[k].kind, 1.0))
        taken[k] += units
        if step + 1 < len(chains[k]):
            heapq.heappush(heap, (chains[k][step + 1][0], k, step + 1))
    pruned = [PrunedGroup(g, tuple(sorted(u))) for g, u in zip(groups, taken, strict=True) if u]
    rows = [BudgetRow(g.name, g.kind, g.size, g.size - len(u))
            for g, u in zip(groups, taken, strict=True)]  # fmt: skip
    return BudgetReport(pruned, budget, total, ledger.removed, rows, depth, rates)


def _rates(
    groups: list[ChannelGroup], chains: list[list[tuple[float, tuple[int, ...]]]],
    tensors: dict[int, _Tensor], probe: Probe,
) -> tuple[float, dict[str, float]]:  # fmt: skip
    """The model's measured milliseconds and, per kind, the milliseconds saved per MAC: each
    kind's probe removes the first half of every group's steps (at least one)."""
    rates: dict[str, float] = {}
    times: list[float] = []
    for kind in dict.fromkeys(g.kind for g in groups):
        cut = [
            PrunedGroup(g, tuple(sorted(u for _, units in chain[: max(1, len(chain) // 2)]
                                        for u in units)))
            for g, chain in zip(groups, chains, strict=True) if g.kind == kind and chain
        ]  # fmt: skip
        if not cut:
            rates[kind] = 0.0
            continue
        ledger = _Ledger({k: _Tensor(t.shape, t.weight) for k, t in tensors.items()})
        for p in cut:
            ledger.remove(p.group, p.units)
        timed = probe(cut)
        saved = timed.before_ms * (1 - 1 / timed.ratio) if timed.ratio > 0 else 0.0
        times.append(timed.before_ms)
        rates[kind] = max(saved, 0.0) / ledger.removed if ledger.removed > 0 else 0.0
    return (sorted(times)[len(times) // 2] if times else 0.0), rates


def _in_skipped_blocks(model: nn.Module) -> list[nn.Parameter]:
    """The parameters that go with the skipped blocks: held by no module outside them."""
    inside: set[int] = set()
    found: dict[int, nn.Parameter] = {}
    for block in model.modules():
        if is_skipped(block):
            for m in block.modules():
                inside.add(id(m))
                found.update((id(p), p) for p in m._parameters.values() if p is not None)
    for m in model.modules():
        if id(m) not in inside:
            for p in m._parameters.values():
                found.pop(id(p), None)
    return list(found.values())


def _unreachable(budget: Budget, total: float, most: float, round_to: int | None) -> None:
    share = most / total if total else 0.0
    rounding = f", a multiple of round_to={round_to} channels" if (round_to or 1) > 1 else ""
    least = f" and floor={budget.floor!r} of its units" if budget.floor else ""
    raise value_error(
        f"prune_channels: budget={budget!r} cannot be met: the groups of kinds "
        f"{list(budget.kinds)} can remove at most {share:.2%} of the {_WHAT[budget.measure]} "
        f"counted (each group keeps at least one unit{least}{rounding}); expected a smaller "
        "share, a lower floor, or more kinds in Budget(kinds=...)"
    )


def _chains(
    groups: list[ChannelGroup],
    scores: list[Tensor],
    costs: list[list[float]],
    round_to: int | None,
    floors: list[float] | None = None,
    pooled: bool = False,
) -> list[list[tuple[float, tuple[int, ...]]]]:
    """Per group, the removals it allows in order, each (priority, units): lowest relative
    score per relative cost first, in steps that keep its constraints (at least its share
    in `floors` of its units kept). Costs are relative to the mean unit of their kind, or
    with `pooled` of all kinds (milliseconds compare)."""
    mean_cost: dict[str, float] = {}
    every = [c for cs in costs for c in cs if c > 0]
    for kind in KINDS:
        mine = [c for g, cs in zip(groups, costs, strict=True) if g.kind == kind for c in cs]
        mine = every if pooled else mine
        mean_cost[kind] = sum(mine) / len(mine) if mine else 1.0
    chains = []
    floors = floors if floors is not None else [0.0] * len(groups)
    for g, s, cs, floor in zip(groups, scores, costs, floors, strict=True):
        mean = float(s.mean()) if len(s) else 0.0
        relative = (s / mean if mean > 0 else s).tolist()
        value = [
            r / (c / mean_cost[g.kind]) if c > 0 else math.inf
            for r, c in zip(relative, cs, strict=True)
        ]
        steps = _steps(g, value, width_step(g, round_to), floor)
        chain = [(sum(value[u] for u in units) / len(units), units) for units in steps]
        chains.append([(p, units) for p, units in chain if p < math.inf])
    return chains


def _steps(
    group: ChannelGroup, value: list[float], round_to: int, floor: float = 0.0
) -> list[tuple[int, ...]]:
    """The successive sets of units a group may lose, lowest value first, down to what
    `floor` keeps."""
    if group.blocks:  # the same count from every key/value group, the floor left in each
        ordered = [sorted(b, key=lambda u: (value[u], u)) for b in group.blocks]
        depth = min(len(b) - _least(len(b), floor) for b in ordered)
        return [tuple(b[i] for b in ordered) for i in range(depth)]
    order = sorted(range(group.size), key=lambda u: (value[u], u))
    least = _least(group.size, floor)
    keeps = [m * round_to for m in range((group.size - 1) // round_to, 0, -1)]
    keeps = [k for k in keeps if k >= least]
    steps, gone = [], 0
    for keep in keeps:
        steps.append(tuple(order[gone : group.size - keep]))
        gone = group.size - keep
    return steps


def _least(size: int, floor: float) -> int:
    """The fewest units a group of `size` keeps: ceil(floor x size), at least one (a product
    that lands a hair above a whole number is taken as that number)."""
    return max(1, math.ceil(floor * size - 1e-9))


def _unit_costs(group: ChannelGroup, tensors: dict[int, _Tensor]) -> list[float]:
    """What removing each unit alone would save."""
    costs = [0.0] * group.size
    for s in _costed(group):
        t = tensors[_key(s)]
        per_position = t.weight * math.prod(t.shape) / t.shape[s.dim]
        for u, positions in enumerate(s.indices):
            costs[u] += per_position * len(positions)
    return costs


def _weights(model: nn.Module, example_inputs: Any, budget: Budget) -> dict[int, float]:
    """What one entry of each parameter counts for, by the Parameter's id."""
    if budget.measure in ("macs", "latency"):  # a latency budget weighs MACs by its rates
        args, kwargs = split_inputs(example_inputs, "prune_channels")
        modes = [(m, m.training) for m in model.modules()]
        model.eval()  # counting must not move a BatchNorm's running statistics
        try:
            counted = macs_per_entry(model, args, kwargs)
        finally:
            for m, mode in modes:
                m.training = mode
        return {k: float(v) for k, v in counted.items()}
    embedded: set[int] = set()
    if not budget.embeddings:
        for m in model.modules():
            if isinstance(m, nn.Embedding | nn.EmbeddingBag):
                embedded.update(id(p) for p in m._parameters.values() if p is not None)
    return {id(p): 0.0 if id(p) in embedded else 1.0 for p in _unique_parameters(model)}


def _unique_parameters(model: nn.Module) -> list[nn.Parameter]:
    return list({id(p): p for p in model.parameters()}.values())


def _costed(group: ChannelGroup) -> list[Slice]:
    held = [(s, stored_parameter(s.module, s.name)) for s in group.slices if not s.is_buffer]
    return [s for s, param in held if param is not None]


def _parameter(s: Slice) -> nn.Parameter:
    """The Parameter of a costed slice (its ``_orig`` when pruned)."""
    found = stored_parameter(s.module, s.name)
    assert found is not None, s.qualified
    return found


def _key(s: Slice) -> int:
    return id(stored_parameter(s.module, s.name))
