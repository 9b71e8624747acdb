"""The share half of the allocate stage: the units to mask when each kind of group loses a
share of its units (`amount`, `heads`, `hidden`, `experts`), group by group or all groups
of a kind ranked together.

A group keeps at least one unit (per key/value group for grouped-query heads) and a number
of units that is a multiple of its step (``round_to``, or what the model's kernels need); a
mixture-of-experts block keeps at least the experts its router picks per token. A share
that rounds to nothing in a group (scope 'layer') or in all its kind (scope 'global') is
said once per call, in a warning naming the first such group and the rule; what is removed
stays as it is.
"""

from __future__ import annotations

import heapq
import itertools
import math

import torch
from torch import Tensor

from prunekit.core.errors import warn_caller
from prunekit.structure.families.experts import check_expert_counts, experts_limit, width_step
from prunekit.structure.graph.graph import ChannelGroup
from prunekit.structure.pruned import PrunedGroup


def by_shares(
    groups: list[ChannelGroup],
    scores: list[Tensor],
    amounts: dict[str, float],
    scope: str,
    round_to: int | None,
) -> list[PrunedGroup]:
    """The units to mask: `amounts[kind]` of the units of each group of that kind (in
    `scope`), lowest scores first.

    Args:
        groups: the candidate groups.
        scores: one score per unit of each group.
        amounts: the share of each kind to mask.
        scope: 'layer' or 'global'.
        round_to: the step of the widths kept (None: the model's own).

    Returns:
        The groups that lose units, kind by kind in the order of `amounts`.

    Raises:
        ValueError: a mixture-of-experts block would keep fewer experts than its router
            picks per token.
    """
    chosen: list[PrunedGroup] = []
    silent: list[tuple[str, bool]] = []
    for kind, share in amounts.items():
        mine = [k for k, g in enumerate(groups) if g.kind == kind]
        if not share or not mine:
            continue
        kept = [groups[k] for k in mine]
        ranked = [scores[k] for k in mine]
        steps = [width_step(g, round_to) for g in kept]
        found = _choose(kept, ranked, float(share), scope, steps)
        if kind == "experts":
            order = _ranked(ranked) if scope == "global" else None
            masked = [(g, _masked(g, found)) for g in kept]
            check_expert_counts(masked, share, experts_limit(kept, order), scope)
        chosen += found
        silent += _for_nothing(kept, found, kind, float(share), scope, steps, round_to)
    if silent:
        more = len(silent) - 1
        rest = f"; so do {more} more group{'s' * (more > 1)}" if more else ""
        line, stepped = silent[0]
        smaller = " or a smaller round_to" if stepped else ""
        warn_caller(f"prune_channels: {line}{rest}; a larger share{smaller} removes some")
    return chosen


PARAMETERS = {"channels": "amount", "heads": "heads", "hidden": "hidden", "experts": "experts"}
UNITS = {"channels": "channels", "heads": "heads", "hidden": "hidden channels",
         "experts": "experts"}  # fmt: skip


def _for_nothing(
    groups: list[ChannelGroup], found: list[PrunedGroup], kind: str, share: float, scope: str,
    steps: list[int], round_to: int | None,
) -> list[tuple[str, bool]]:  # fmt: skip
    """What a share of `kind` removed nothing from for its rounding alone, one line per
    group (of 'layer' scope, or with key/value blocks), or one for the kind ('global'),
    each with whether the step of the kept widths is why (not the share's 0 units)."""
    said = f"{PARAMETERS.get(kind, kind)}={share!r} removes nothing from"
    what = UNITS.get(kind, kind)
    gone = {id(p.group) for p in found if p.units}
    lines = []
    for g in groups:
        if g.blocks and id(g) not in gone and len(g.blocks[0]) > 1:
            lines.append((f"{said} {g.name}: {share!r} of {len(g.blocks[0])} query heads "
                          "per key/value group rounds to 0", False))  # fmt: skip
    plain = [(g, step) for g, step in zip(groups, steps, strict=True) if not g.blocks]
    if scope == "global":
        total = sum(g.size for g, _ in plain)
        if plain and total > len(plain) and not any(id(g) in gone for g, _ in plain):
            step = min(step for _, step in plain)
            rule = _rule(share, total, step, round_to, all(step >= g.size for g, _ in plain))
            lines.append((f"{said} the {len(plain)} groups of {what}: {share!r} of their "
                          f"{total} {what} {rule}", round(share * total) > 0))  # fmt: skip
        return lines
    for g, step in plain:
        if id(g) not in gone and g.size > 1:
            rule = _rule(share, g.size, step, round_to, step >= g.size)
            lines.append((f"{said} {g.name}: {share!r} of {g.size} {what} {rule}",
                          round(share * g.size) > 0))  # fmt: skip
    return lines


def _rule(share: float, size: int, step: int, round_to: int | None, wide: bool) -> str:
    """Why `share` of `size` units rounds to nothing: to 0 units, or under the step (`wide`:
    at or above the width of every group concerned)."""
    if round(share * size) == 0:
        return "rounds to 0"
    rule = f"round_to={round_to}" if round_to is not None else (
        f"the step of {step} its kernels need (round_to=None)")  # fmt: skip
    return f"rounds down to 0 under {rule}" + (" (at or above its width)" if wide else "")


def _choose(groups: list[ChannelGroup], scores: list[Tensor], amount: float, scope: str,
            steps: list[int]) -> list[PrunedGroup]:  # fmt: skip
    """The units to mask in each group: the lowest scores (per block where it has blocks),
    the kept ones a multiple of the group's step."""
    plain = [k for k, g in enumerate(groups) if not g.blocks]
    found = _counts([groups[k] for k in plain], [scores[k] for k in plain], amount, scope,
                    [steps[k] for k in plain])  # fmt: skip
    counts = dict(zip(plain, found, strict=True))
    chosen = []
    for k, (g, s) in enumerate(zip(groups, scores, strict=True)):
        if g.blocks:
            units: list[int] = []
            for block in g.blocks:
                n = _rounded(len(block), round(amount * len(block)), 1)
                order = torch.argsort(s[list(block)], stable=True)[:n].tolist()
                units += [block[i] for i in order]
        else:
            units = torch.argsort(s, stable=True)[: counts[k]].tolist()
        if units:
            chosen.append(PrunedGroup(g, tuple(sorted(units))))
    return chosen


def _masked(group: ChannelGroup, chosen: list[PrunedGroup]) -> int:
    """How many units of `group` are in `chosen` (0 where it is not)."""
    return next((len(p.units) for p in chosen if p.group is group), 0)


def _counts(groups: list[ChannelGroup], scores: list[Tensor], amount: float, scope: str,
            steps: list[int]) -> list[int]:  # fmt: skip
    """Units to mask per group."""
    if scope == "layer":
        counts = [round(amount * g.size) for g in groups]
        return [_rounded(g.size, n, k) for g, n, k in zip(groups, counts, steps, strict=True)]
    return _global_counts(groups, scores, round(amount * sum(g.size for g in groups)), steps)


def _global_counts(
    groups: list[ChannelGroup], scores: list[Tensor], target: int, steps: list[int]
) -> list[int]:
    """Units to mask per group when all groups rank together: at most `target` in all, as
    near it as the steps allow. Each group loses whole steps, its lowest units first (a
    step: the units between two kept widths that are multiples of its step, at least one
    kept); steps go in the order of their units' mean relative score (scores divided by
    their group's mean), ties to the earlier group, and a step that would pass `target` is
    passed over with the rest of its group's. Where that stops short of the nearest total
    the steps allow (steps of unequal sizes: widths that are no multiple of their step),
    the parts are moved to that total, each group's as near its part in order as it allows
    (_nearest). With steps of one unit this is the `target` lowest units of the joint
    ranking, a group keeping one unit at least."""
    chains = [_steps(relative_scores(s), g.size, step)
              for g, s, step in zip(groups, scores, steps, strict=True)]  # fmt: skip
    counts = [0] * len(groups)
    queue = [(chain[0][0], k, 0) for k, chain in enumerate(chains) if chain]  # (mean, group, step)
    heapq.heapify(queue)
    left, passed = target, False
    while queue and left > 0:
        _, k, i = heapq.heappop(queue)
        size = chains[k][i][1]
        if size > left:  # passed over, and the group's later steps with it
            passed = True
            continue
        counts[k] += size
        left -= size
        if i + 1 < len(chains[k]):
            heapq.heappush(queue, (chains[k][i + 1][0], k, i + 1))
    if not passed:  # every step taken in order up to the target: none nearer
        return counts
    return _nearest([[size for _, size in chain] for chain in chains], counts, target)


def _steps(relative: Tensor, size: int, step: int) -> list[tuple[float, int]]:
    """The steps a group of `size` units gives up in turn, lowest units first: per step,
    the mean of its units' `relative` scores and how many units it holds (from the width
    to the largest multiple of `step` below it, then `step` at a time; one unit kept)."""
    ordered = sorted(relative.tolist())
    found, gone = [], 0
    for keep in range((size - 1) // step * step, 0, -step):  # the widths it may keep
        units = size - keep - gone
        found.append((sum(ordered[gone : gone + units]) / units, units))
        gone += units
    return found


def relative_scores(scores: Tensor) -> Tensor:
    """A group's scores divided by their mean (as they are where it is not positive), so
    that groups of scores on other scales rank together (shares and budgets alike).

    Args:
        scores: one score per unit of a group.

    Returns:
        The scores relative to their mean.
    """
    mean = float(scores.mean()) if len(scores) else 0.0
    return scores / mean if mean > 0 else scores


def _nearest(chains: list[list[int]], counts: list[int], target: int) -> list[int]:
    """The parts of the largest total up to `target` that whole steps allow, each group's
    as near its part in `counts` as that total allows (each group loses a prefix of its
    `chains` entry: the sizes of its steps in order). The totals each prefix of the groups
    reaches are the bits of one int, in units of the steps' greatest common divisor."""
    unit = math.gcd(*(size for chain in chains for size in chain)) or 1
    options = [[r // unit for r in [0, *itertools.accumulate(chain)]] for chain in chains]
    top = target // unit
    mask = (1 << (top + 1)) - 1
    reach = [1]  # reach[k]: the totals groups 0..k-1 reach
    for choices in options:
        bits = 0
        for r in choices:
            bits |= reach[-1] << r
        reach.append(bits & mask)
    best = reach[-1].bit_length() - 1
    if best * unit <= sum(counts):
        return counts
    found, left = [0] * len(chains), best
    for k in range(len(chains) - 1, -1, -1):
        fits = [r for r in options[k] if r <= left and reach[k] >> (left - r) & 1]
        found[k] = min(fits, key=lambda r: (abs(r * unit - counts[k]), r))
        left -= found[k]
    return [r * unit for r in found]


def _ranked(scores: list[Tensor]) -> list[int]:
    """The units of all groups ranked together, lowest first (scores divided by their
    group's mean), as the index of each unit's group."""
    ranked: list[tuple[float, int]] = []
    for k, s in enumerate(scores):
        ranked.extend((float(v), k) for v in relative_scores(s))
    ranked.sort()
    return [k for _, k in ranked]


def _rounded(size: int, count: int, round_to: int) -> int:
    """At most `count` units masked such that the kept ones are >= 1 and a multiple of round_to."""
    keep = max(size - count, 1)
    keep = min(size, math.ceil(keep / round_to) * round_to)
    return size - keep
