"""``prune_channels``: mask the least important units of each channel group.

Masks go on every parameter slice of a chosen unit through ``prunekit.custom_from_mask``, so
the model trains, reports, saves and unprunes as any pruned model; ``compact`` removes them.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import prunekit
from prunekit.structure.criteria import GroupCriterion, score_groups
from prunekit.structure.graph import ChannelGroup, channel_groups, check_model
from prunekit.structure.snapshot import Snapshot


@dataclass(frozen=True)
class PrunedGroup:
    """A group and the units of it that are now masked (indices into its units)."""

    group: ChannelGroup
    units: tuple[int, ...]


def prune_channels(
    model: nn.Module,
    example_inputs: Any,
    amount: float,
    *,
    criterion: str | GroupCriterion | Callable[[ChannelGroup], Tensor] = "l2",
    scope: str = "layer",
    ignore: Iterable[nn.Module | str] = (),
    round_to: int = 1,
    calibration: Iterable[Any] | None = None,
    loss: Callable[[Any, Any], Tensor] | None = None,
) -> list[PrunedGroup]:
    """Mask `amount` of the channels of every prunable group of `model` (whole units).

    `scope='layer'`: each group loses round(amount x its units); 'global': the units of all
    groups are ranked together (scores divided by their group's mean), and `amount` of all
    units go. Units already masked score 0, so pruning again to the same amount changes
    nothing. A group keeps at least one unit, and a number of units that is a multiple of
    `round_to`. `ignore`: modules (or their names, globs allowed) whose output channels stay;
    their input channels still follow their producers. `calibration`: batches for the
    criteria that learn from data ('activation'; 'taylor' with `loss(output, batch)`, default
    ``output.loss``), as prune_model takes them. Returns the groups pruned.
    """
    check_model(model, "prune_channels")
    _check(amount, scope, round_to)
    groups = [g for g in channel_groups(model, example_inputs) if g.prunable]
    skipped = _ignored(model, ignore)
    groups = [g for g in groups if not any(id(s.module) in skipped for s in _makers(g))]
    scores = score_groups(model, groups, criterion, calibration, loss)
    counts = _counts(groups, scores, amount, scope, round_to)
    chosen = [
        PrunedGroup(g, tuple(sorted(torch.argsort(s, stable=True)[:n].tolist())))
        for g, s, n in zip(groups, scores, counts, strict=False)
        if n > 0
    ]  # fmt: skip
    snapshot = Snapshot(model)
    try:
        _install(chosen)
    except BaseException:
        snapshot.restore()
        raise
    return chosen


def _makers(g: ChannelGroup) -> list[Any]:
    return [s for s in g.slices if s.role == "out"]


def _check(amount: Any, scope: Any, round_to: Any) -> None:
    if isinstance(amount, bool) or not isinstance(amount, float) or not 0.0 <= amount < 1.0:
        raise ValueError(
            f"prune_channels: invalid amount={amount!r}; expected a float in [0, 1): the "
            "fraction of each group's channels to mask"
        )
    if scope not in ("layer", "global"):
        raise ValueError(f"prune_channels: invalid scope={scope!r}; expected 'layer' or 'global'")
    if isinstance(round_to, bool) or not isinstance(round_to, int) or round_to < 1:
        raise ValueError(f"prune_channels: invalid round_to={round_to!r}; expected an int >= 1")


def _ignored(model: nn.Module, ignore: Iterable[nn.Module | str]) -> set[int]:
    names = dict(model.named_modules())
    found: set[int] = set()
    for item in ignore:
        if isinstance(item, nn.Module):
            if not any(m is item for m in names.values()):
                raise ValueError(f"prune_channels: ignore holds {type(item).__name__} not in model")
            found.add(id(item))
        elif isinstance(item, str):
            matched = [m for n, m in names.items() if fnmatch.fnmatchcase(n, item)]
            if not matched:
                raise ValueError(
                    f"prune_channels: ignore={item!r} names no module of the model; expected "
                    f"names such as {list(names)[1:4]} (globs allowed)"
                )
            found.update(id(m) for m in matched)
        else:
            raise TypeError(
                f"prune_channels: ignore holds {item!r}; expected modules or module names"
            )
    return found


def _counts(groups: list[ChannelGroup], scores: list[Tensor], amount: float, scope: str,
            round_to: int) -> list[int]:  # fmt: skip
    """Units to mask per group."""
    if scope == "layer":
        counts = [round(amount * g.size) for g in groups]
    else:
        counts = [0] * len(groups)
        ranked: list[tuple[float, int]] = []
        for k, s in enumerate(scores):
            mean = float(s.mean()) if len(s) else 0.0
            normal = s / mean if mean > 0 else s
            ranked.extend((float(v), k) for v in normal)
        ranked.sort()
        for _, k in ranked[: round(amount * len(ranked))]:
            counts[k] += 1
    return [_rounded(g.size, n, round_to) for g, n in zip(groups, counts, strict=False)]


def _rounded(size: int, count: int, round_to: int) -> int:
    """At most `count` units masked such that the kept ones are >= 1 and a multiple of round_to."""
    keep = max(size - count, 1)
    keep = min(size, math.ceil(keep / round_to) * round_to)
    return size - keep


def _install(chosen: list[PrunedGroup]) -> None:
    masks: dict[tuple[int, str], tuple[nn.Module, str, Tensor]] = {}
    for pruned in chosen:
        for s in pruned.group.slices:
            if s.is_buffer:
                continue
            key = (id(s.module), s.name)
            if key not in masks:
                value = getattr(s.module, s.name)
                masks[key] = (s.module, s.name, torch.ones_like(value))
            positions = [p for u in pruned.units for p in s.indices[u]]
            mask = masks[key][2]
            mask.index_fill_(s.dim, torch.tensor(positions, device=mask.device), 0)
    for module, name, mask in masks.values():
        prunekit.custom_from_mask(module, name, mask)
