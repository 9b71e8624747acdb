"""``prune_channels``: mask the least important units of each channel group.

Masks go on every parameter slice of a chosen unit through ``prunekit.custom_from_mask``, so
the model trains, reports, saves and unprunes as any pruned model; ``compact`` removes them.
"""

from __future__ import annotations

import copy
import fnmatch
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.errors import value_error
from prunekit.core.transaction import transaction
from prunekit.criteria.calibration import batch_list
from prunekit.functional import custom_from_mask
from prunekit.structure.budget import Budget, allocate, check_budget
from prunekit.structure.compensation.compensate import (
    Openings,
    compensate_groups,
    refuse_uncompensable,
    written,
)
from prunekit.structure.compensation.damping import DAMP, check_damping
from prunekit.structure.compensation.refit import refit_groups
from prunekit.structure.compensation.refit import written as refitted
from prunekit.structure.families.experts import (
    check_expert_counts,
    experts_limit,
    install_router_mask,
    width_step,
)
from prunekit.structure.graph.graph import ChannelGroup, channel_groups, check_gqa, check_model
from prunekit.structure.handlers.norms import install_kept_norm
from prunekit.structure.probe import latency_probe
from prunekit.structure.pruned import PrunedGroup
from prunekit.structure.scoring.criteria import GroupCriterion, group_criterion, score_groups
from prunekit.whole.registry import check_scope
from prunekit.whole.vocabulary import renamed

DAMPING: float | str = DAMP
"""What `damping` is where not given: the constant 0.3. 'auto' (the held-out choice per layer)
did not lift the worst text domain in ``benchmarks/domains_llm.py`` (docs/benchmarks.md)."""


def prune_channels(
    model: nn.Module,
    example_inputs: Any,
    amount: float = 0.0,
    *,
    criterion: str | GroupCriterion | Callable[[ChannelGroup], Tensor] = "l2",
    scope: str = "layer",
    exclude: Iterable[nn.Module | str] = (),
    round_to: int | None = None,
    heads: float = 0.0,
    hidden: float = 0.0,
    experts: float = 0.0,
    gqa: str = "query",
    calibration: Iterable[Any] | None = None,
    loss: Callable[[Any, Any], Tensor] | None = None,
    budget: Budget | None = None,
    compensate: bool | str = False,
    ignore: Iterable[nn.Module | str] | None = None,
    damping: float | str | None = None,
) -> list[PrunedGroup]:
    """Mask `amount` of the channels of every prunable group of `model` (whole units).

    Masks go on every parameter slice of a chosen unit, so the masked model computes what
    ``compact`` makes of it: the norms of a masked hidden width normalize over its kept
    channels, a masked expert's router logit is -inf. Units already masked score 0, so
    pruning again to the same amount changes nothing. A group keeps at least one unit (one
    query head per key/value group). If anything fails, the model is left as it was.

    Args:
        model: the torch module to prune in place.
        example_inputs: what one forward takes (a tensor, a tuple of positional arguments or
            a dict of keyword arguments), traced into channel groups as ``channel_groups``
            traces it.
        amount: the share of the units of each group of kind ``'channels'`` (conv and
            linear outputs, MLP widths) to mask, in [0, 1).
        criterion: what ranks the units: ``'l1'``, ``'l2'`` (the default), ``'bn_scale'``,
            ``'taylor'``, ``'activation'``, ``'obs'``, ``'fluctuation'`` (the last two rank
            by the error that removal leaves), ``'frequency'`` or ``'reap'`` (routed
            experts), a ``GroupCriterion``, or a callable ``criterion(group)`` returning one
            score per unit (higher: kept longer).
        scope: ``'layer'``: each group loses round(amount x its units); ``'global'``: the
            units of all the groups of a kind are ranked together (scores divided by their
            group's mean), and that share of all of them goes (heads with key/value groups
            are always counted per module).
        exclude: modules, or their names (globs allowed; a block stands for its layers),
            whose output channels stay (those of a norm or a depthwise conv are its input
            channels too); their input channels still follow their producers.
        round_to: channel and hidden groups keep a multiple of this many units. None: of
            what the model's own kernels need where they constrain a width (the widths a
            mixture-of-experts block's fused experts span: multiples of 16 bytes, 4 float32
            channels, which grouped_mm needs), else of 1.
        heads: the share of the heads of each attention module (kind ``'heads'``) to mask.
        hidden: the share of the widths that LayerNorm/RMSNorm normalize over (kind
            ``'hidden'``: the embedding width through every residual); a hidden width that
            reaches the model's output makes that output narrower once compacted.
        experts: the share of the routed experts of each mixture-of-experts block (kind
            ``'experts'``; shared experts are no such unit).
        gqa: the head unit of an attention with grouped-query heads, as in
            ``channel_groups``: ``'query'`` or ``'group'``.
        calibration: batches for the criteria that learn from data (``'activation'``,
            ``'taylor'``, ``'obs'``, ...) and for `compensate`, as ``prune_model`` takes
            them.
        loss: for ``'taylor'``, ``loss(output, batch)`` whose gradients rank the units;
            None: ``output.loss``.
        budget: one target for the whole model instead of `amount`, `heads` and `hidden`
            (a share of the parameters, MACs, measured latency or units), met by removing
            the units of lowest score for their cost across all the groups of its kinds.
        compensate: False (the default); True: the layers that read removed channels or
            heads get the least-squares update of their kept input columns (and bias) that
            keeps their output on the `calibration` batches (needed then), in forward order
            on the model as masked so far; ``'reference'``: those layers and every Linear or
            convolution that runs after the first of them are refitted towards the outputs
            they had before the call, which also corrects the error the layers before them
            left (it holds a copy of the model and runs it up to each layer for each batch:
            meant for CNNs).
        ignore: the old name of `exclude` (a FutureWarning).
        damping: with ``compensate=True`` only: the damping of the least-squares solve, a
            number > 0 relative to the mean diagonal of the input's second moment (None:
            ``DAMPING``, 0.3), or ``'auto'``: per layer, the damping of a log-scale grid
            whose update, fitted on alternate calibration batches, best keeps the layer's
            output on the others, then fitted on all of them (a layer where no damping beats
            leaving it is left, with a warning).

    Returns:
        The groups pruned, each with its masked units; with a `budget`, a ``BudgetReport``:
        the same list with what each group kept and the share achieved.

    Raises:
        TypeError: `model` is no torch module, or an argument of the wrong type.
        ValueError: an amount, scope, criterion, budget or name out of range or matching
            nothing, or `compensate` without `calibration`.
    """
    check_model(model, "prune_channels")
    amounts = {"channels": amount, "heads": heads, "hidden": hidden, "experts": experts}
    _check(amounts, scope, round_to)
    if budget is not None:
        check_budget(budget, amounts, scope)
    check_gqa(gqa, "prune_channels")
    batches = _compensation_batches(compensate, calibration)
    level = _damping(damping, compensate)
    excluded, what = _listed(exclude), "exclude"
    if ignore is not None:  # the old name
        old = _listed(ignore)
        excluded = renamed("prune_channels", "exclude", excluded, "ignore", old, bool(excluded))
        what = "ignore"
    skipped = _ignored(model, excluded, what)
    with transaction(model) as recorded:  # the traced and calibrating forwards write buffers
        found = channel_groups(model, example_inputs, gqa=gqa)
        _check_found(model, found, amounts)
        groups = [g for g in found if g.prunable]
        held = {id(p) for m in model.modules() if id(m) in skipped
                for p in m._parameters.values() if p is not None}  # fmt: skip
        groups = [g for g in groups if not _made_by(g, skipped, held)]
        groups = [g for g in groups if (g.kind in budget.kinds if budget else amounts.get(g.kind))]
        if batches is not None:  # for the criterion too where it takes them
            calibration = batches if _wants_batches(criterion) else None
        ranked = score_groups(model, groups, criterion, calibration, loss)
        scored = {id(g): s for g, s in zip(groups, ranked, strict=True)}
        chosen: list[PrunedGroup] = []
        if budget is not None:
            probe = None
            if budget.measure == "latency":
                probe = latency_probe(model, example_inputs, budget.runs, _install)
            chosen = allocate(model, example_inputs, groups, ranked, budget, round_to, probe)
        for kind, share in amounts.items():  # all 0 with a budget
            mine = [g for g in groups if g.kind == kind]
            if not share or not mine:
                continue
            scores = [scored[id(g)] for g in mine]
            steps = [width_step(g, round_to) for g in mine]
            found_now = _choose(mine, scores, float(share), scope, steps)
            if kind == "experts":
                order = _ranked(scores) if scope == "global" else None
                masked = [(g, _masked(g, found_now)) for g in mine]
                check_expert_counts(masked, share, experts_limit(mine, order), scope)
            chosen += found_now
        pairs = [(p.group, p.units) for p in chosen]
        openings = None
        reference = None
        if batches is not None:
            refuse_uncompensable(pairs, compensate)
            if compensate == "reference":
                recorded.keep(refitted(model))  # the refit updates them in place
                reference = copy.deepcopy(model)
            else:
                recorded.keep(written(pairs))  # compensation updates them in place
            openings = Openings(model, pairs)
        _install(model, chosen)
        if openings is not None and batches is not None:
            if reference is not None:
                refit_groups(model, reference, pairs, openings, batches)
            else:
                compensate_groups(model, pairs, openings, batches, level)
    return chosen


def _compensation_batches(compensate: Any, calibration: Any) -> list[Any] | None:
    """The calibration batches as a list when `compensate` (which needs them), else None."""
    if not (isinstance(compensate, bool) or compensate == "reference"):
        raise (ValueError if isinstance(compensate, str) else TypeError)(
            f"prune_channels: invalid compensate={compensate!r}; expected True (update the "
            "layers that read removed units from calibration data), 'reference' (the same, "
            "towards the outputs of the model as it was before the call) or False"
        )
    if not compensate:
        return None
    if calibration is None:
        raise ValueError(
            f"prune_channels: compensate={compensate!r} needs calibration data; expected "
            "calibration= an iterable of batches the model's forward takes"
        )
    return batch_list(calibration, "prune_channels")


def _damping(damping: object, compensate: object) -> float | str:
    """The damping compensation uses: `damping` checked, or the default where None."""
    if damping is None:
        return DAMPING
    if compensate is not True:
        raise value_error(
            f"prune_channels: damping={damping!r} needs compensate=True (it damps that "
            f"least-squares update), not compensate={compensate!r}; expected compensate=True "
            "or no damping"
        )
    return check_damping(damping, "prune_channels")


def _wants_batches(criterion: Any) -> bool:
    """Whether the criterion takes calibration batches (required or optional)."""
    found = group_criterion(criterion)
    return isinstance(found, GroupCriterion) and found.calibrated is not False


def _choose(groups: list[ChannelGroup], scores: list[Tensor], amount: float, scope: str,
            steps: list[int]) -> list[PrunedGroup]:  # fmt: skip
    """The units to mask in each group: the lowest scores (per block where it has blocks),
    the kept ones a multiple of the group's step."""
    plain = [k for k, g in enumerate(groups) if not g.blocks]
    found = _counts([groups[k] for k in plain], [scores[k] for k in plain], amount, scope,
                    [steps[k] for k in plain])  # fmt: skip
    counts = dict(zip(plain, found, strict=True))
    chosen = []
    for k, (g, s) in enumerate(zip(groups, scores, strict=False)):
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
    return next((len(p.units) for p in chosen if p.group is group), 0)


def _made_by(g: ChannelGroup, modules: set[int], params: set[int]) -> bool:
    """Whether one of `modules` (or a module holding one of their `params`: a tied weight)
    outputs the group's channels: it holds a slice of the group other than a consumer's
    input columns (the rows that make them, a depthwise conv's, a bias, a norm's)."""
    outputs = [s for s in g.slices if s.role != "in"]
    return any(
        id(s.module) in modules or id(s.module._parameters.get(s.name)) in params for s in outputs
    )


_WHAT = {
    "channels": ("amount", "channels of each group"),
    "heads": ("heads", "heads of each attention module"),
    "hidden": ("hidden", "channels of the hidden width"),
    "experts": ("experts", "routed experts of each mixture-of-experts block"),
}


def _check(amounts: dict[str, Any], scope: Any, round_to: Any) -> None:
    for kind, value in amounts.items():
        name, what = _WHAT[kind]
        number = isinstance(value, float) or (name != "amount" and isinstance(value, int))
        if isinstance(value, bool) or not number or not 0.0 <= value < 1.0:
            raise ValueError(
                f"prune_channels: invalid {name}={value!r}; expected a float in [0, 1): the "
                f"fraction of the {what} to mask"
            )
    check_scope(scope, "prune_channels")
    if round_to is not None and (
        isinstance(round_to, bool) or not isinstance(round_to, int) or round_to < 1
    ):
        raise ValueError(
            f"prune_channels: invalid round_to={round_to!r}; expected an int >= 1, or None "
            "(what the model's kernels need)"
        )


def _check_found(model: nn.Module, found: list[ChannelGroup], amounts: dict[str, Any]) -> None:
    """heads= or hidden= on a model where the graph found no such width at all."""
    for kind in ("heads", "hidden", "experts"):
        if amounts[kind] and not any(g.kind == kind for g in found):
            what = {"heads": "attention module it knows (nn.MultiheadAttention, BERT, GPT-2, "
                    "Hugging Face decoders, ViT)", "hidden": "width that a LayerNorm/RMSNorm "
                    "normalizes", "experts": "mixture-of-experts block with a router it "
                    "knows (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE)"}[kind]  # fmt: skip
            raise ValueError(
                f"prune_channels: {kind}={amounts[kind]!r}, but {type(model).__name__} has no "
                f"{what}; expected {kind}=0.0 for this model"
            )


def _listed(names: Iterable[nn.Module | str] | str) -> list[nn.Module | str]:
    """Modules or globs as a list; a str is one glob."""
    return [names] if isinstance(names, str) else list(names)


def _ignored(model: nn.Module, ignore: Iterable[nn.Module | str], what: str) -> set[int]:
    """The ids of the modules `ignore` (the argument `what`) names, and of their submodules
    (a block's output channels are made by its layers)."""
    names = dict(model.named_modules())
    found: set[int] = set()
    for item in ignore:
        if isinstance(item, nn.Module):
            if not any(m is item for m in names.values()):
                raise ValueError(f"prune_channels: {what} holds {type(item).__name__} not in model")
            found.add(id(item))
        elif isinstance(item, str):
            matched = [m for n, m in names.items() if fnmatch.fnmatchcase(n, item)]
            if not matched:
                raise ValueError(
                    f"prune_channels: {what}={item!r} names no module of the model; expected "
                    f"names such as {list(names)[1:4]} (globs allowed)"
                )
            found.update(id(m) for m in matched)
        else:
            raise TypeError(
                f"prune_channels: {what} holds {item!r}; expected modules or module names"
            )
    return {id(sub) for m in names.values() if id(m) in found for sub in m.modules()}


def _counts(groups: list[ChannelGroup], scores: list[Tensor], amount: float, scope: str,
            steps: list[int]) -> list[int]:  # fmt: skip
    """Units to mask per group."""
    if scope == "layer":
        counts = [round(amount * g.size) for g in groups]
    else:
        counts = [0] * len(groups)
        order = _ranked(scores)
        for k in order[: round(amount * len(order))]:
            counts[k] += 1
    return [_rounded(g.size, n, k) for g, n, k in zip(groups, counts, steps, strict=True)]


def _ranked(scores: list[Tensor]) -> list[int]:
    """The units of all groups ranked together, lowest first (scores divided by their
    group's mean), as the index of each unit's group."""
    ranked: list[tuple[float, int]] = []
    for k, s in enumerate(scores):
        mean = float(s.mean()) if len(s) else 0.0
        normal = s / mean if mean > 0 else s
        ranked.extend((float(v), k) for v in normal)
    ranked.sort()
    return [k for _, k in ranked]


def _rounded(size: int, count: int, round_to: int) -> int:
    """At most `count` units masked such that the kept ones are >= 1 and a multiple of round_to."""
    keep = max(size - count, 1)
    keep = min(size, math.ceil(keep / round_to) * round_to)
    return size - keep


def _install(model: nn.Module, chosen: list[PrunedGroup]) -> None:
    masks: dict[tuple[int, str], tuple[nn.Module, str, Tensor]] = {}
    norms: dict[int, nn.Module] = {}
    routers: dict[int, nn.Module] = {}
    for pruned in chosen:
        for s in pruned.group.slices:
            if s.op == "normalize":
                norms[id(s.module)] = s.module
            if s.op == "route":
                routers[id(s.module)] = s.module
            if s.is_buffer:
                continue
            key = (id(s.module), s.name)
            if key not in masks:
                value = getattr(s.module, s.name)
                masks[key] = (s.module, s.name, torch.ones_like(value))
            positions = [p for u in pruned.units for p in s.indices[u]]
            mask = masks[key][2]
            mask.index_fill_(s.dim, torch.tensor(positions, device=mask.device), 0)
    for module in norms.values():
        install_kept_norm(module)
    for module in routers.values():
        install_router_mask(module)
    for module, name, mask in list(masks.values()):
        for holder, held in _tied(model, module, name):
            if (id(holder), held) not in masks:
                masks[(id(holder), held)] = (holder, held, mask)
    for module, name, mask in masks.values():
        custom_from_mask(module, name, mask)


def _tied(model: nn.Module, module: nn.Module, name: str) -> list[tuple[nn.Module, str]]:
    """Other modules holding the same Parameter (a language model head tied to the
    embedding): they get the same mask, so the tie stays one Parameter."""
    param = module._parameters.get(name)
    if param is None:
        return []
    return [(m, k) for m in model.modules() for k, p in m._parameters.items()
            if p is param and m is not module]  # fmt: skip
