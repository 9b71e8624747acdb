"""Compensation: when units of channel groups are removed, update the layers that read them
so that each one's output on calibration data stays what it was.

For a consumer ``y = W x (+ b)`` whose input columns R go and K stay, the least-squares
update of the kept columns from the input's second moment H = mean of x x^T is

    W_K <- W_K + W_R H[R, K] H[K, K]^-1

which is also the structured optimal-brain-surgeon update for removing whole columns (the
Hessian of the layer's squared error is H). A consumer with a bias solves the same problem
with a constant input column added (the mean of x beside H): the bias then absorbs the mean
contribution of what went, and the columns fit what varies. A convolution other than a
pointwise one is read as patches (``prunekit.calibrate.layer_matrices``): per group of
channels, x is what one output position reads, a removed channel takes its column at every
kernel position with it, and H (kernel positions x channels per group, squared) is that group's. A
depthwise convolution is never a consumer: its channels go with those it reads, and the
pointwise convolution after it is the consumer. A consumer without a bias keeps
having none (adding one would change the model's structure and its saved form). The solve
is in float64, damped (``prunekit.structure.compensation.damping``: by default from the
rows per feature the statistics hold) x the median of the diagonal (a convolution's: the
mean; ``damping.by_median``), through a Cholesky factor. With tokens='equal', H and the
mean weigh each row of the input by its size (``prunekit.calibrate.statistics.row_weights``),
so that the update fits each token's error relative to it: a few tokens of outsized
activations (attention sinks) then do not decide it.

Statistics come from the calibration machinery of ``prunekit.calibrate`` and are
taken in forward order on the model as pruned so far: each consumer sees the outputs of the
already masked and compensated layers before it, with only its own groups' producers
opened (their masks lifted) so that the removed inputs are still there to be measured. Where
the consumers and their groups lie in one sequence of blocks (a transformer's layers), the
model runs once up to the first block and then block by block; else the whole model runs
once per consumer. Peak memory beyond the model: one consumer's H (float32, and a float64
copy during the solve; one per group of a grouped convolution), the blocks' inputs for every
batch, and a copy of each compensated weight (taken by the caller's transaction,
``written`` says which, to undo a failed call).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

import prunekit.calibrate as cal
from prunekit.calibrate import layer_matrices
from prunekit.core.errors import value_error, warn_caller
from prunekit.core.naming import mask_name, stored_parameter
from prunekit.criteria.grouped import GroupedRuns
from prunekit.structure.compensation.damping import (
    DAMP,
    ROWS,
    Moments,
    Tuning,
    by_median,
    held_out_errors,
    least_squares_update,
    pooled,
)
from prunekit.structure.families.experts import is_experts
from prunekit.structure.graph.graph import ChannelGroup, Slice

__all__ = ["DAMP", "compensate_groups", "least_squares_update"]


@dataclass
class _Consumer:
    """A layer reading removed units: its weight slices and the groups they belong to."""

    module: nn.Module
    name: str
    dim: int
    removed: set[int] = field(default_factory=set)
    groups: list[ChannelGroup] = field(default_factory=list)


def _compensable(s: Slice) -> bool:
    """A weight that maps its input linearly: a Linear or HF Conv1D (2-D), or a convolution
    read along its input channels (any kernel, stride, padding or grouping; see
    ``_by_patches``)."""
    weight = getattr(s.module, s.name, None)
    if s.role != "in" or s.name != "weight" or not isinstance(weight, Tensor):
        return False
    if isinstance(s.module, nn.modules.conv._ConvNd):
        return not s.module.transposed and s.dim == 1
    return weight.dim() == 2 and (
        isinstance(s.module, nn.Linear) or type(s.module).__name__ == "Conv1D"
    )


def _by_patches(module: nn.Module) -> bool:
    """Whether `module` is a convolution other than a pointwise one (kernel 1, stride 1, no
    padding, one group: a Linear over the channels at every position), so that its input
    is seen as patches (``prunekit.calibrate.layer_matrices``): one matrix per group of channels,
    whose columns are (kernel position, input channel) pairs."""
    if not isinstance(module, nn.modules.conv._ConvNd):
        return False
    return not (
        module.groups == 1
        and all(k == 1 for k in module.kernel_size)
        and all(k == 1 for k in module.stride)
        and (isinstance(module.padding, str) or not any(module.padding))
    )


def refuse_uncompensable(
    chosen: Sequence[tuple[ChannelGroup, Sequence[int]]], compensate: bool | str
) -> None:
    """Refuse `compensate` for units that a reader which cannot be updated consumes, rather
    than leave that reader as it was without a word: the fused experts of a
    mixture-of-experts block, whose down projection reads, per expert, only the tokens
    routed to it (statistics the update does not gather).

    Raises:
        ValueError: naming the experts module, the tensor and what to do instead.
    """
    for group, units in chosen:
        if group.kind == "hidden" or not units:
            continue  # hidden widths are never compensated (see consumers)
        for s in group.slices:
            if s.role == "in" and not s.is_buffer and is_experts(s.module):
                raise value_error(
                    f"prune_channels: compensate={compensate!r} cannot update "
                    f"{s.module_name} ({s.name}): each of its fused experts reads only the "
                    "tokens routed to it, which the least-squares update does not gather; "
                    "expected compensate=False, or exclude= the experts (e.g. "
                    f"exclude=[{s.module_name!r}]) to compensate the rest"
                )


def consumers(chosen: Sequence[tuple[ChannelGroup, Sequence[int]]]) -> list[_Consumer]:
    """The compensable consumers of the removed units of each (group, units), hidden widths
    left out (their norms change what every consumer sees)."""
    found: dict[int, _Consumer] = {}
    for group, units in chosen:
        if group.kind == "hidden":
            continue
        for s in group.slices:
            if not _compensable(s):
                continue
            one = found.setdefault(id(s.module), _Consumer(s.module, s.name, s.dim))
            one.removed.update(p for u in units for p in s.indices[u])
            if all(g is not group for g in one.groups):
                one.groups.append(group)
    return list(found.values())


class Openings:
    """The masks of the producers of chosen units as they were before masking, so that a
    consumer's statistics can be taken with the removed units still computed."""

    def __init__(self, model: nn.Module, chosen: Sequence[tuple[ChannelGroup, Sequence[int]]]):
        self.units = {id(g): tuple(u) for g, u in chosen}
        self.before: dict[tuple[int, str], Tensor | None] = {}
        for group, _ in chosen:
            for s in group.slices:
                if not s.is_buffer:
                    found = getattr(s.module, mask_name(s.name), None)
                    self.before[(id(s.module), s.name)] = (
                        found.detach().clone() if isinstance(found, Tensor) else None
                    )

    def weight(self, module: nn.Module, name: str) -> Tensor:
        """The weight the model computed with before the masks of this call (float64)."""
        orig = _stored(module, name)
        mask = self.before.get((id(module), name))
        values = orig.detach().to(torch.float64)
        return values if mask is None else values * mask.to(torch.float64)

    def open(self, groups: Sequence[ChannelGroup]) -> list[tuple[Tensor, Tensor]]:
        """Lift the new masks of the groups' producing slices; returns what `close` needs."""
        saved: list[tuple[Tensor, Tensor]] = []
        for group in groups:
            units = self.units[id(group)]
            for s in group.slices:
                if s.role == "in" or s.is_buffer:
                    continue
                mask = getattr(s.module, mask_name(s.name), None)
                if not isinstance(mask, Tensor):
                    continue
                saved.append((mask, mask.clone()))
                positions = torch.tensor([p for u in units for p in s.indices[u]])
                before = self.before.get((id(s.module), s.name))
                source = torch.ones_like(mask) if before is None else before
                mask.index_copy_(s.dim, positions, source.index_select(s.dim, positions))
        return saved

    @staticmethod
    def close(saved: list[tuple[Tensor, Tensor]]) -> None:
        for mask, values in reversed(saved):
            mask.copy_(values)


def _stored(module: nn.Module, name: str) -> nn.Parameter:
    """The Parameter holding `name`'s values (``<name>_orig`` where it is masked)."""
    found = stored_parameter(module, name)
    assert found is not None
    return found


def compensate_groups(
    model: nn.Module,
    chosen: Sequence[tuple[ChannelGroup, Sequence[int]]],
    openings: Openings,
    batches: Sequence[Any],
    damping: float | str = ROWS,
    tokens: str = "energy",
    *,
    owner: str,
) -> list[str]:
    """Update every compensable consumer of the `chosen` units, the masks being installed
    (see the module's docstring), in place: the tensors ``written`` lists, which the caller
    keeps to undo a failure. `damping`: the solve's damping relative to the median (or mean)
    diagonal, 'rows' (from each consumer's rows per feature) or 'auto', chosen per consumer on
    held-out batches (``damping``; with one batch, 'rows'). `tokens`: how the fit weighs the
    rows (tokens) of each input, 'energy' (each by its squared error, so rows of large
    activations weigh most) or 'equal' (each by its error relative to its size:
    ``prunekit.calibrate.statistics.row_weights``; the held-out choice of 'auto' too).
    An error of a batch names `owner`, the entry point calibrating. The tokens a batch's
    ``attention_mask`` (a mapping's, or a tuple's item `model`'s forward names so) masks out
    take no part in any moment (``cal.batch_masks``).
    Returns the names of the consumers updated, in the order they were."""
    found = consumers(chosen)
    if not found:
        return []
    names = {id(m): n for n, m in model.named_modules()}
    producers = {id(p): p for c in found for p in _producers(c)}
    modules = [*(c.module for c in found), *producers.values()]
    order = _forward_order(model, modules, batches[0], owner)
    warn_unrun(found, order, names, "compensate=True")
    found = sorted((c for c in found if id(c.module) in order), key=lambda c: order[id(c.module)])
    blocks = _blocks(model, found, chosen)
    tuning = Tuning(damping, len(batches))
    wanted = cal.Wanted(norms=False, hessian=True, means=True, equal=tokens == "equal")
    done: list[str] = []
    with cal.evaluating(model), torch.no_grad():
        if blocks is None:
            for one in found:
                measures = [_whole_model(model, part, numbers, owner)
                            for part, numbers in tuning.folds(batches)]  # fmt: skip
                if _measured_update(one, openings, measures, names[id(one.module)], tuning,
                                    wanted):  # fmt: skip
                    done.append(names[id(one.module)])
            tuning.warn(names)
            return done
        sequence, where = blocks
        masks = cal.batch_masks(batches, owner=owner, model=model)  # each input's tokens counted
        inputs = cal.capture_block_inputs(model, sequence[0], batches, owner=owner)
        own = cal.block_calls(model, sequence, batches, owner=owner)  # a block's own mask, rotary
        last = max(where[id(c.module)] for c in found)
        for index, block in enumerate(sequence):
            here = [c for c in found if where[id(c.module)] == index]
            if _replayable(here, order):
                inputs = _block(block, here, inputs, openings, names, tuning, wanted, done,
                                index < last, owner, masks)  # fmt: skip
                inputs = cal.called_as(inputs, own, index + 1) if index < last else inputs
                continue
            for one in here:  # each consumer on runs of the block of its own
                measures = [functools.partial(cal.block_statistics, block, part, numbers=numbers,
                                              owner=owner, masks=[masks[n] for n in numbers])
                            for part, numbers in tuning.folds(inputs)]  # fmt: skip
                if _measured_update(one, openings, measures, names[id(one.module)], tuning,
                                    wanted):  # fmt: skip
                    done.append(names[id(one.module)])
            if index < last:
                inputs = cal.called_as(cal.next_inputs(block, inputs, owner=owner), own, index + 1)
            if index == last:
                break
    tuning.warn(names)
    return done


def _block(
    block: nn.Module,
    here: Sequence[_Consumer],
    inputs: list[cal.Inputs],
    openings: Openings,
    names: dict[int, str],
    tuning: Tuning,
    wanted: cal.Wanted,
    done: list[str],
    more: bool,
    owner: str,
    masks: Sequence[Tensor | None],
) -> list[cal.Inputs]:
    """Update the consumers `here` of `block` in forward order, each measured on the
    outputs of those updated before it, and return the block's outputs (the next block's
    inputs) if there are `more` blocks to go (`masks`: each input's tokens that count):
    each sublayer of the block runs once per input.
    A run for one consumer stops at its input; the next run takes the outputs of the calls
    the run before finished from memory (criteria.grouped: every submodule with weights is
    kept), and the last run gives the outputs. A call kept while an earlier consumer's
    producers were opened holds values of removed units, which reach only the consumers of
    those units, whose weights are masked there: what they compute is the same."""
    if not here:
        return cal.next_inputs(block, inputs, owner=owner) if more else []
    weighted = [m for m in block.modules() if m is not block and bool(m._parameters)]
    folds = tuning.folds(inputs)
    with contextlib.ExitStack() as stack:
        paths = {m: names[id(m)] for m in weighted if id(m) in names}  # as errors name them
        runs = [stack.enter_context(GroupedRuns(block, part, weighted, wanted, numbers, paths,
                                                owner=owner, masks=[masks[n] for n in numbers]))
                for part, numbers in folds]  # fmt: skip
        for one in here:
            measures = [functools.partial(_grouped, r) for r in runs]
            if _measured_update(one, openings, measures, names[id(one.module)], tuning, wanted):
                done.append(names[id(one.module)])
        if not more:
            return []
        outputs = [r.outputs() for r in runs]
    found: list[cal.Inputs] = list(inputs)
    for (_, numbers), out in zip(folds, outputs, strict=True):
        for number, item in zip(numbers, out, strict=True):
            found[number] = item
    return found


def _producers(one: _Consumer) -> list[nn.Module]:
    """The modules whose masks `Openings.open` lifts for `one` (its groups' producers)."""
    return [s.module for g in one.groups for s in g.slices if s.role != "in" and not s.is_buffer]


def _replayable(here: Sequence[_Consumer], order: dict[int, int]) -> bool:
    """Whether the consumers `here` (of one block, in forward order) can be measured on
    one block's grouped runs: each one's producers all first run after the consumer before
    it, so that no call kept before that consumer holds their output computed while they
    were masked."""
    for before, one in itertools.pairwise(here):
        if any(order.get(id(p), -1) <= order[id(before.module)] for p in _producers(one)):
            return False
    return True


def _grouped(
    runs: GroupedRuns, modules: Sequence[nn.Module], wanted: cal.Wanted
) -> cal.InputStatistics:
    """`Measure` by the next grouped run of a block (the one module of `modules`)."""
    runs.wanted = wanted
    stats, _ = runs.next_group(modules)
    return stats


# Input statistics of some modules, taken one way or another (the whole model over the
# calibration batches, or one block over its inputs).
Measure = Callable[[Sequence[nn.Module], cal.Wanted], cal.InputStatistics]


def _whole_model(
    model: nn.Module, batches: Sequence[Any], numbers: Sequence[int], owner: str
) -> Measure:
    """`Measure` by one pass of the whole `model` over `batches` (`numbers`: their indices
    in the calibration; `owner`: the entry point an error names)."""

    def measure(modules: Sequence[nn.Module], wanted: cal.Wanted) -> cal.InputStatistics:
        return cal.calibrate(model, batches, modules, wanted, owner=owner, numbers=numbers)

    return measure


def _measured_update(
    one: _Consumer,
    openings: Openings,
    measures: Sequence[Measure],
    name: str,
    tuning: Tuning,
    wanted: cal.Wanted,
) -> bool:
    """Take `one`'s input statistics through each fold's `measure(modules, wanted)` (as
    patches where ``_by_patches``) with its groups' producers opened, then update it (see
    ``_update``); `name`: its path."""
    patches = _by_patches(one.module)
    opened = openings.open(one.groups)
    wanted = dataclasses.replace(wanted, patches=patches)
    try:
        found = [measure([one.module], wanted) for measure in measures]
    finally:
        openings.close(opened)
    folds = [_moments(stats, one.module) for stats in found if stats.seen(one.module)]
    if not folds:
        return False
    for fold in folds:
        check_finite([fold.hessian, fold.mean], name, True)
    whole = folds[0] if len(folds) == 1 else pooled(folds)
    tuning.note(one.module, whole.rows, whole.hessian.shape[-1])
    if patches:
        return _update_patches(one, folds, whole, openings, tuning)
    return _update(one, folds, whole, openings, tuning)


def _moments(stats: cal.InputStatistics, module: nn.Module) -> Moments:
    return Moments(stats.hessian(module), stats.means(module), stats.rows(module))


def check_finite(moments: Sequence[Tensor], name: str, compensate: bool | str) -> None:
    """Refuse the input statistics of the consumer `name` where they hold a NaN or an inf
    (no damping makes a solve of them finite)."""
    for moment in moments:
        if not bool(torch.isfinite(moment).all()):
            kind = "NaN" if bool(moment.isnan().any()) else "inf"
            raise value_error(
                f"prune_channels: compensate={compensate!r}: the input of {name} on the "
                f"calibration batches is not finite (its statistics hold {kind}: the batches "
                f"or what the model computes from them hold NaN or inf, or their squares "
                f"overflow {moment.dtype}); expected calibration batches on which the model "
                f"computes finite inputs for {name}"
            )


def _update(
    one: _Consumer, folds: Sequence[Moments], whole: Moments, openings: Openings, tuning: Tuning
) -> bool:
    """Apply the least-squares update to one consumer; False where its input did not fit
    or where the held-out choice left it."""
    weight = openings.weight(one.module, one.name).movedim(one.dim, -1)
    n = weight.shape[-1]
    if whole.hessian.shape[0] != n:
        return False
    mask = getattr(one.module, mask_name(one.name), None)
    alive = (
        torch.ones(n, dtype=torch.bool)
        if not isinstance(mask, Tensor)
        else mask.movedim(one.dim, -1).reshape(-1, n).ne(0).any(0)
    )
    kept = [c for c in range(n) if bool(alive[c]) and c not in one.removed]
    bias = stored_parameter(one.module, "bias")
    rows = weight.reshape(-1, n)
    removed = sorted(one.removed)
    errors, untouched = None, 0.0
    if tuning.auto and len(folds) > 1 and kept and removed:
        errors, untouched = held_out_errors(rows, folds, removed, kept, bias is not None,
                                            median=by_median(one.module))  # fmt: skip
    level = tuning.damping(one.module, errors, untouched, whole.rows, n)
    if level is None:
        return False
    mean = whole.mean if bias is not None else None
    delta, shift = least_squares_update(rows, whole.hessian, removed, kept, mean, level,
                                        by_median(one.module))  # fmt: skip
    stored = _stored(one.module, one.name)
    with torch.no_grad():  # in place on the Parameter: its version moves, so cached
        target = stored.movedim(one.dim, -1).view(-1, n)  # masked products are recomputed
        target[:, kept] += delta.to(target.dtype)
        if bias is not None and shift is not None:
            bias.add_(shift.to(bias.dtype))
    return True


def _update_patches(
    one: _Consumer, folds: Sequence[Moments], whole: Moments, openings: Openings, tuning: Tuning
) -> bool:
    """The least-squares update of a convolution read as patches (``_by_patches``): in each
    group of channels, an input channel that goes removes its column at every kernel
    position, and the kept columns (with the bias, shared by the group's outputs) are
    refitted on that group's own input patches. The indices of a grouped convolution's
    slice are its channels within a group; the same ones go in every group. One damping
    serves all groups (chosen on their summed held-out error where 'auto')."""
    conv = one.module
    groups, columns = layer_matrices.width(conv)
    weight = openings.weight(conv, one.name)
    rows = layer_matrices.matrices(conv, weight)  # (groups, outputs per group, columns)
    mask = getattr(conv, mask_name(one.name), None)
    alive = (
        torch.ones(groups, columns, dtype=torch.bool)
        if not isinstance(mask, Tensor)
        else layer_matrices.matrices(conv, mask).ne(0).any(1)
    )
    per = weight.shape[1]  # input channels per group: a column is position x per + channel
    gone = sorted({p * per + c for p in range(columns // per) for c in one.removed})
    bias = stored_parameter(conv, "bias")
    kept = [[c for c in range(columns) if bool(alive[g, c]) and c not in gone]
            for g in range(groups)]  # fmt: skip
    parts = [_per_group(m, groups, columns) for m in (whole, *folds)]
    errors, untouched = None, 0.0
    if tuning.auto and len(folds) > 1 and gone and all(kept):
        for g in range(groups):
            found, none = held_out_errors(rows[g], [p[g] for p in parts[1:]], gone, kept[g],
                                          bias is not None, median=False)  # fmt: skip
            errors = found if errors is None else errors + found
            untouched += none
    level = tuning.damping(conv, errors, untouched, whole.rows, columns, patches=True)
    if level is None:
        return False
    change = torch.zeros_like(rows)
    shifts = torch.zeros(rows.shape[:2], dtype=torch.float64)
    for g in range(groups):
        mean = parts[0][g].mean if bias is not None else None
        delta, shift = least_squares_update(rows[g], parts[0][g].hessian, gone, kept[g], mean,
                                            level, median=False)  # fmt: skip
        change[g][:, kept[g]] = delta
        if shift is not None:
            shifts[g] = shift
    stored = _stored(conv, one.name)
    with torch.no_grad():
        stored.add_(layer_matrices.from_matrices(conv, change, stored.shape).to(stored.dtype))
        if bias is not None:
            bias.add_(shifts.reshape(-1).to(bias.dtype))
    return True


def _per_group(moments: Moments, groups: int, columns: int) -> list[Moments]:
    """A convolution's patch moments, one `Moments` per group of channels."""
    hessians = moments.hessian.reshape(groups, columns, columns)
    means = moments.mean.reshape(groups, columns)
    return [Moments(hessians[g], means[g], moments.rows) for g in range(groups)]


def warn_unrun(
    found: Sequence[_Consumer], order: dict[int, int], names: dict[int, str], what: str
) -> None:
    """Warn, naming them, of the consumers of removed units that did not run on the first
    calibration batch (`order`): their inputs lost units, but no update can be fitted for
    them (the example inputs ran them; the calibration batches take another path)."""
    unrun = [names.get(id(c.module), "?") for c in found if id(c.module) not in order]
    if unrun:
        warn_caller(
            f"prune_channels: {what} left {', '.join(map(repr, unrun))} as it was: it reads "
            "removed units (the example inputs ran it) but never ran on the first calibration "
            "batch, so no update could be fitted; expected calibration batches that run every "
            "layer reading the removed units"
        )


def _forward_order(
    model: nn.Module, modules: Sequence[nn.Module], batch: Any, owner: str
) -> dict[int, int]:
    """The order in which `modules` first run in the model's forward on `batch` (an error
    names `owner`, the entry point calibrating)."""
    order: dict[int, int] = {}

    def hook(module: nn.Module, args: Any) -> None:
        order.setdefault(id(module), len(order))

    handles = [m.register_forward_pre_hook(hook) for m in modules]
    try:
        with cal.evaluating(model), torch.no_grad():
            try:
                cal.run_batch(model, batch)
            except Exception as error:
                raise cal.batch_error(0, error, owner=owner)  # noqa: B904 (its cause is set)
    finally:
        for handle in handles:
            handle.remove()
    return order


def _blocks(
    model: nn.Module,
    found: Sequence[_Consumer],
    chosen: Sequence[tuple[ChannelGroup, Sequence[int]]],
) -> tuple[nn.ModuleList, dict[int, int]] | None:
    """The model's block sequence and the block of every module of the chosen groups, when
    each group lies within one block (else None: the whole model runs per consumer)."""
    listed = cal.block_list(model, [c.module for c in found])
    if listed is None:
        return None
    sequence = listed[1]
    where: dict[int, int] = {}
    for index, block in enumerate(sequence):
        for module in block.modules():
            where[id(module)] = index
    for group, _ in chosen:
        if group.kind == "hidden":
            continue
        places = {where.get(id(s.module)) for s in group.slices}
        if len(places) != 1 or None in places:
            return None
    if any(id(c.module) not in where for c in found):
        return None
    return sequence, where


def written(chosen: Sequence[tuple[ChannelGroup, Sequence[int]]]) -> list[Tensor]:
    """The tensors ``compensate_groups`` may change in place for `chosen`: each consumer's
    stored weight and its bias."""
    found: list[Tensor] = []
    for one in consumers(chosen):
        found.append(_stored(one.module, one.name))
        bias = stored_parameter(one.module, "bias")
        if bias is not None:
            found.append(bias)
    return found
