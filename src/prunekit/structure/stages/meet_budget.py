"""The budget half of the allocate stage: the units to mask so that a ``Budget`` is met.

Each unit's score is divided by its group's mean, then by its cost relative to the mean unit
of its kind (``ledger``); every group offers its removals in steps that keep its constraints,
and the steps of lowest value for their cost go first, all groups at once, until the target
is met (see ``prunekit.structure.budget``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import Any, NoReturn

from torch import Tensor, nn

from prunekit.core.errors import value_error
from prunekit.structure.budget import (
    AUTO,
    AUTO_FLOOR,
    COUNTED,
    KINDS,
    Budget,
    BudgetReport,
    BudgetRow,
)
from prunekit.structure.families.experts import width_step
from prunekit.structure.graph.graph import ChannelGroup
from prunekit.structure.probe import Probe
from prunekit.structure.pruned import PrunedGroup
from prunekit.structure.stages.ledger import (
    Ledger,
    TensorCost,
    costed,
    costed_parameter,
    entry_weights,
    in_skipped_blocks,
    tensor_key,
    unique_parameters,
    unit_costs,
    untouched,
)
from prunekit.structure.stages.shares import relative_scores


def meet(
    model: nn.Module, example_inputs: Any, groups: list[ChannelGroup], scores: list[Tensor],
    budget: Budget, round_to: int | None, probe: Probe | None = None,
) -> BudgetReport:  # fmt: skip
    """The units of `groups` to mask so that `budget` is met (nothing is changed; a latency
    budget times the model through `probe`, which leaves it as it was).

    Args:
        model: the model the groups are of.
        example_inputs: its example inputs (MACs are counted on them).
        groups: the candidate groups.
        scores: one score per unit of each group.
        budget: the target.
        round_to: the step of the channel and hidden widths kept (None: the model's own).
        probe: times the model without given units (a latency budget only).

    Returns:
        The units to mask, with what each group kept and the share achieved.

    Raises:
        ValueError: the model has nothing to count, or the budget cannot be met within the
            groups' constraints.
    """
    _check_floor_globs(budget, groups)
    weights, total, depth = _counted(model, example_inputs, groups, budget)
    tensors = {
        tensor_key(s): TensorCost(tuple(costed_parameter(s).shape), weights.get(tensor_key(s), 0.0))
        for g in groups for s in costed(g)
    }  # fmt: skip
    auto = budget.floor == AUTO
    floors = [0.0 if auto else budget.floor_of(g.name) for g in groups]
    by_units = budget.measure == "units"
    unit_cost = [[1.0] * g.size if by_units else unit_costs(g, tensors) for g in groups]
    rates: dict[str, float] = {}
    if budget.measure == "latency":
        assert probe is not None, "a latency budget needs a probe"
        chains = _chains(groups, scores, unit_cost, round_to, floors)
        total, rates = _rates(groups, chains, tensors, probe)
        unit_cost = [
            [c * rates[g.kind] for c in cs] for g, cs in zip(groups, unit_cost, strict=True)
        ]
        depth = 0.0  # skipped blocks no longer run: the time measured is without them
    goal = budget.share * total
    found = None
    if auto:
        found = AUTO_FLOOR * _highest_floor(groups, scores, unit_cost, round_to, tensors,
                                            by_units, rates, depth, goal)  # fmt: skip
        floors = [found] * len(groups)
    pooled = budget.measure == "latency"
    levels = _levels(groups, scores, budget.sensitivity)
    chains = _chains(groups, scores, unit_cost, round_to, floors, pooled=pooled, levels=levels)
    taken, removed = _take(groups, chains, tensors, by_units, depth, rates, goal)
    if taken is None:
        _unreachable(budget, total, removed, round_to)
    pruned = [PrunedGroup(g, tuple(sorted(u))) for g, u in zip(groups, taken, strict=True) if u]
    rows = [BudgetRow(g.name, g.kind, g.size, g.size - len(u))
            for g, u in zip(groups, taken, strict=True)]  # fmt: skip
    return BudgetReport(pruned, budget, total, removed, rows, depth, rates, found)


def _highest_floor(
    groups: list[ChannelGroup], scores: list[Tensor], costs: list[list[float]],
    round_to: int | None, tensors: dict[int, TensorCost], by_units: bool,
    rates: dict[str, float], depth: float, goal: float,
) -> float:  # fmt: skip
    """The highest floor, the same for every group, at which `goal` can still be removed
    (to 1e-4, by bisection: what a floor allows grows as it falls); 0 where none can."""

    def reachable(floor: float) -> bool:
        chains = _chains(groups, scores, costs, round_to, [floor] * len(groups))
        ledger = Ledger(untouched(tensors), units=by_units)
        ledger.removed = depth
        for g, chain in zip(groups, chains, strict=True):
            for _, units in chain:
                ledger.remove(g, units, rates.get(g.kind, 1.0))
        return ledger.removed >= goal * (1 - 1e-12)

    low, high = 0.0, 1.0
    if not reachable(low):
        return 0.0
    while high - low > 1e-4:
        middle = (low + high) / 2
        low, high = (middle, high) if reachable(middle) else (low, middle)
    return low


def _levels(groups: list[ChannelGroup], scores: list[Tensor], sensitivity: float) -> list[float]:
    """Per group, (its mean score / its kind's mean score)^sensitivity: what its units'
    scores relative to their group's mean are multiplied by (``Budget.sensitivity``)."""
    if not sensitivity:
        return [1.0] * len(groups)
    kind_means: dict[str, float] = {}
    for kind in dict.fromkeys(g.kind for g in groups):
        mine = [s for g, s in zip(groups, scores, strict=True) if g.kind == kind and len(s)]
        count = sum(len(s) for s in mine)
        kind_means[kind] = sum(float(s.sum()) for s in mine) / count if count else 0.0
    levels = []
    for g, s in zip(groups, scores, strict=True):
        mean, of_kind = (float(s.mean()) if len(s) else 0.0), kind_means[g.kind]
        levels.append((mean / of_kind) ** sensitivity if mean > 0 and of_kind > 0 else 1.0)
    return levels


def _counted(
    model: nn.Module, example_inputs: Any, groups: list[ChannelGroup], budget: Budget
) -> tuple[dict[int, float], float, float]:
    """What one entry of each parameter counts for (by its id), the model's total, and how
    much of it the skipped blocks hold."""
    weights: dict[int, float] = {}
    if budget.measure == "units":  # each candidate unit counts one; skipped blocks hold none
        total, depth = float(sum(g.size for g in groups)), 0.0
    else:
        weights = entry_weights(model, example_inputs, budget)
        total = sum(p.numel() * weights.get(id(p), 0.0) for p in unique_parameters(model))
        gone = in_skipped_blocks(model)
        depth = sum(p.numel() * weights.pop(id(p), 0.0) for p in gone)  # not saved again
    if total <= 0:
        raise value_error(
            f"prune_channels: budget={budget!r}, but {type(model).__name__} has no "
            f"{COUNTED[budget.measure]} to count (see Budget); expected a model that has some"
        )
    return weights, total, depth


_Chains = list[list[tuple[float, tuple[int, ...]]]]
"""Per group, the steps it may lose in order, each (priority, units): see ``_chains``."""

_Step = tuple[ChannelGroup, tuple[int, ...], float]
"""A step as the ledger takes it: its group, its units and its kind's rate."""


def _take(
    groups: list[ChannelGroup], chains: _Chains, tensors: dict[int, TensorCost], by_units: bool,
    depth: float, rates: dict[str, float], goal: float,
) -> tuple[list[list[int]] | None, float]:  # fmt: skip
    """The units each group loses and what they remove (with `depth`, the skipped blocks),
    or (None, the most all steps remove) where that falls short of `goal`: the steps
    ``_in_order`` takes, less those ``_put_back`` finds needless."""
    ledger = Ledger(untouched(tensors), units=by_units)
    ledger.removed = depth

    def step(k: int, i: int) -> _Step:
        return groups[k], chains[k][i][1], rates.get(groups[k].kind, 1.0)

    order = _in_order(ledger, chains, step, goal)
    if order is None:
        return None, ledger.removed
    order = _put_back(ledger, order, step, goal)
    counted = Ledger(untouched(tensors), units=by_units)  # the steps kept, counted afresh
    counted.removed = depth
    taken: list[list[int]] = [[] for _ in groups]
    for k, i in order:
        counted.remove(*step(k, i))
        taken[k] += chains[k][i][1]
    return taken, counted.removed


def _in_order(
    ledger: Ledger, chains: _Chains, step: Callable[[int, int], _Step], goal: float
) -> list[tuple[int, int]] | None:
    """Remove steps from `ledger`, lowest priority first, until `goal` is met; the steps
    taken as (group, step) in the order taken, or None where all of them fall short.

    A step that would pass `goal` by more than the smallest step left that would meet it
    alone removes is passed over, with its group's later steps (the others go on); so the
    last step passes `goal` by no more than that."""
    least = goal * (1 - 1e-12)

    def gain(k: int, i: int) -> float:
        before = ledger.removed
        ledger.remove(*step(k, i))
        gained = ledger.removed - before
        ledger.restore(*step(k, i))
        ledger.removed = before
        return gained

    heap = [(chain[0][0], k, 0) for k, chain in enumerate(chains) if chain]
    heapq.heapify(heap)
    order: list[tuple[int, int]] = []
    while ledger.removed < least:
        if not heap:
            return None
        _, k, i = heapq.heappop(heap)
        over = ledger.removed + gain(k, i) - goal
        if over > 0:
            meeting = [g for _, j, s in heap if (g := gain(j, s)) >= goal - ledger.removed]
            if meeting and min(meeting) < over * (1 - 1e-12):
                continue  # passed over with its group's later steps
        ledger.remove(*step(k, i))
        order.append((k, i))
        if i + 1 < len(chains[k]):
            heapq.heappush(heap, (chains[k][i + 1][0], k, i + 1))
    return order


def _put_back(
    ledger: Ledger, order: list[tuple[int, int]], step: Callable[[int, int], _Step], goal: float
) -> list[tuple[int, int]]:
    """`order` (the steps taken, in `ledger`) without those `goal` stays met without: put
    back the last taken (of highest priority) first, a group's later step before its
    earlier ones, and none of a group once one of its steps must stay. A large step that
    had to come last so does not leave all the smaller ones before it on top."""
    least = goal * (1 - 1e-12)
    kept = list(order)
    staying: set[int] = set()
    for k, i in reversed(order):
        if k in staying:
            continue
        before = ledger.removed
        ledger.restore(*step(k, i))
        if ledger.removed >= least:
            kept.remove((k, i))
            continue
        ledger.remove(*step(k, i))
        ledger.removed = before
        staying.add(k)
    return kept


def _rates(
    groups: list[ChannelGroup], chains: _Chains,
    tensors: dict[int, TensorCost], probe: Probe,
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
        ledger = Ledger(untouched(tensors))
        for p in cut:
            ledger.remove(p.group, p.units)
        timed = probe(cut)
        saved = timed.before_ms * (1 - 1 / timed.ratio) if timed.ratio > 0 else 0.0
        times.append(timed.before_ms)
        rates[kind] = max(saved, 0.0) / ledger.removed if ledger.removed > 0 else 0.0
    return (sorted(times)[len(times) // 2] if times else 0.0), rates


def _check_floor_globs(budget: Budget, groups: list[ChannelGroup]) -> None:
    """Refuse a floor given per glob whose glob matches no candidate group: a typo would
    silently keep no floor at all."""
    if not isinstance(budget.floor, tuple):
        return
    names = [g.name for g in groups]
    for glob, _ in budget.floor:
        if not any(fnmatchcase(name, glob) for name in names):
            shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
            raise value_error(
                f"prune_channels: Budget(floor={dict(budget.floor)!r}) glob {glob!r} matches no "
                f"candidate group (of kinds {list(budget.kinds)}); expected globs over the "
                f"group names BudgetReport.rows shows: {shown or 'none (no group of them)'}"
            )


def _unreachable(budget: Budget, total: float, most: float, round_to: int | None) -> NoReturn:
    share = most / total if total else 0.0
    rounding = f", a multiple of round_to={round_to} channels" if (round_to or 1) > 1 else ""
    least = f" and floor={budget.floor!r} of its units" if budget.floor not in (0, AUTO) else ""
    raise value_error(
        f"prune_channels: budget={budget!r} cannot be met: the groups of kinds "
        f"{list(budget.kinds)} can remove at most {share:.2%} of the {COUNTED[budget.measure]} "
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
    levels: list[float] | None = None,
) -> _Chains:
    """Per group, the removals it allows in order, each (priority, units): lowest relative
    score per relative cost first, in steps that keep its constraints (at least its share
    in `floors` of its units kept). Costs are relative to the mean unit of their kind, or
    with `pooled` of all kinds (milliseconds compare); relative scores are multiplied by
    their group's entry of `levels` (1 where None)."""
    mean_cost: dict[str, float] = {}
    every = [c for cs in costs for c in cs if c > 0]
    for kind in KINDS:
        mine = [c for g, cs in zip(groups, costs, strict=True) if g.kind == kind for c in cs]
        mine = every if pooled else mine
        mean_cost[kind] = sum(mine) / len(mine) if mine else 1.0
    chains = []
    floors = floors if floors is not None else [0.0] * len(groups)
    levels = levels if levels is not None else [1.0] * len(groups)
    for g, s, cs, floor, level in zip(groups, scores, costs, floors, levels, strict=True):
        relative = (relative_scores(s) * level).tolist()
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
