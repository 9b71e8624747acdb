"""The one-shot engine's work, once planned: rank and mask each target with magnitude,
random or Taylor scores, or with Wanda's and SparseGPT's statistics of each layer's input,
block by block or in one pass.

Memory, sequential mode: the inputs of one block for all calibration batches (as the model
computes them: batches x tokens x hidden), the statistics of that block's Linears only
(Wanda: one norm per input feature; SparseGPT: an in x in float32 Hessian per distinct
input, shared by Linears reading the same tensor) and one such input's SparseGPT work
(the weights reading it, stacked, and one inverse Hessian factor, in float32); with
sequential='layers', also the outputs of the block's sublayers kept from one group's runs
for the next (criteria.grouped). Taylor needs the whole model's backward: activations of
one batch, plus a gradient and a running sum per pruned weight.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

import prunekit.calibrate as cal
from prunekit.calibrate import layer_matrices
from prunekit.calibrate.block_inputs import SEQUENTIAL
from prunekit.core.amount import Amount
from prunekit.core.errors import naming, value_error
from prunekit.core.heap import trim
from prunekit.core.transaction import Transaction
from prunekit.criteria.criterion import Criterion
from prunekit.criteria.grouped import GroupedRuns
from prunekit.criteria.sparsegpt import sparsegpt_prune_shared
from prunekit.criteria.taylor import Taylor, taylor_step
from prunekit.criteria.wanda import Wanda
from prunekit.dropin.calls import custom_from_mask, rank_together, remove
from prunekit.dropin.torch_methods import Pruning
from prunekit.patterns import Unstructured
from prunekit.progress import Progress
from prunekit.whole.oneshot_plan import Plan, TensorRef, alive, current_values, oriented

__all__ = ["execute", "make_permanent", "prune_block", "wanted"]


def execute(model: nn.Module, plan: Plan, bar: Progress) -> None:
    """Prune every target of `plan` (inside the caller's transaction)."""
    ranks = plan.config.entry.criterion
    if ranks is not None:  # l1, random
        criterion = ranks()
        _install_ranked(plan, lambda _: criterion, bar)
    elif plan.method == "taylor":
        saliency = _taylor(model, plan)
        _install_ranked(plan, lambda target: Taylor(saliency.pop(_key(target))), bar)
    else:
        _calibrated(model, plan, bar)


def _key(target: TensorRef) -> tuple[int, str]:
    """The tensor `target` names, by its holder: ``(mha, 'out_proj.weight')`` is the
    ``(mha.out_proj, 'weight')`` a joint ranking hands its criterion."""
    module, name = target
    path, _, leaf = name.rpartition(".")
    return id(module.get_submodule(path) if path else module), leaf


def _install_ranked(plan: Plan, criterion: Callable[[TensorRef], Criterion], bar: Progress) -> None:
    """Prune with a criterion that ranks: per layer, or jointly for scope='global'."""
    if plan.config.scope == "global":
        made = {_key(t): criterion(t) for t in plan.targets}
        joint = _Joint(made)
        kwargs = {"amount": plan.amount, "criterion": joint}
        rank_together(plan.targets, Pruning, None, kwargs, plan.paths, plan.config.owner)
        _settle(plan, plan.targets)
        bar.advance(len(plan.targets))
        return
    for target in plan.targets:
        module, name = target
        ranks = criterion(target)
        pattern = oriented(module, name, plan.pattern)
        with naming(_path(plan, module, name)):
            Pruning.apply(module, name, plan.amount, criterion=ranks, pattern=pattern)
        if isinstance(ranks, Taylor):
            ranks.release()  # the hook keeps the criterion: not its weight-sized scores
        _settle(plan, [target])
        bar.advance()


class _Joint(Criterion):
    """Per-tensor criteria behind one, for a global ranking."""

    by_magnitude = True

    def __init__(self, made: dict[tuple[int, str], Criterion]) -> None:
        self.made = made

    def scores(self, values: Tensor, target: Any = None) -> Tensor:
        assert target is not None
        return self.made[_key(target)]._checked_scores(values, target)


def _taylor(model: nn.Module, plan: Plan) -> dict[tuple[int, str], Tensor]:
    loss = plan.loss or cal.output_loss(plan.config.owner, "method='taylor'")
    totals: list[Tensor | None] = [None] * len(plan.targets)
    params = cal.gradient_targets(plan.targets)

    def step(i: int, values: Tensor, grad: Tensor) -> None:
        totals[i] = taylor_step(values, grad, totals[i])

    failed = None
    try:
        cal.gradients(model, plan.batches, params, loss, step, owner=plan.config.owner)
    except Exception as error:
        if plan.reduce is None:
            raise
        failed = error
    if plan.reduce is None:  # over ranks, another rank's batches may give it one
        for (module, name), total in zip(plan.targets, totals, strict=True):
            if total is None:
                raise value_error(
                    f"{plan.config.owner}: {plan.describe(module, name)} got no gradient "
                    "from the loss on any calibration batch (its output does not reach the "
                    "loss: detached, or computed under torch.no_grad()), so Taylor has "
                    "nothing to rank it by; expected every pruned tensor to take part in "
                    "the loss (exclude it, or prune it with another method)"
                )
    found = {}
    for target, total in zip(plan.targets, totals, strict=True):
        found[_key(target)] = (
            total if total is not None else torch.zeros_like(current_values(*target))
        )
    if plan.reduce is not None:  # sums over the batches of every rank
        cal.agree(plan.reduce, failed)
        named = {str(i): found[_key(t)] for i, t in enumerate(plan.targets)}
        summed = plan.reduce(named, {})
        found = {_key(t): summed[str(i)] for i, t in enumerate(plan.targets)}
    return found


def _calibrated(model: nn.Module, plan: Plan, bar: Progress) -> None:
    """Wanda or SparseGPT: statistics of each layer's input, block by block or in one pass
    (with `plan.reduce`, of every rank's batches). An attention's out_proj is calibrated
    on its own input, the attention calling it meanwhile (layer_matrices.out_proj_called)."""
    with layer_matrices.out_proj_called(plan.targets):
        _calibrate_all(model, plan, bar)


def _calibrate_all(model: nn.Module, plan: Plan, bar: Progress) -> None:
    owners = [m for m, _ in plan.targets]
    readers = [_reader(t) for t in plan.targets]
    found = cal.block_list(model, owners) if plan.config.chosen_sequential else None
    want = wanted(plan)
    reduce, owner = plan.reduce, plan.config.owner
    if plan.config.scope == "global":
        stats = cal.calibrate(
            model, plan.batches, readers, want, owner=owner, reduce=reduce, names=plan.paths
        )
        for module, name in plan.targets:
            _check_seen(plan, stats, module, name)
        norms = {_key(t): _entry_norms(stats, *t) for t in plan.targets}
        _install_ranked(plan, lambda t: Wanda(norms[_key(t)]), bar)
        return
    if found is None:
        stats = cal.calibrate(
            model, plan.batches, readers, want, owner=owner, reduce=reduce, names=plan.paths
        )
        _prune_layers(plan, plan.targets, stats, bar)
        return
    _, blocks = found
    _by_blocks(model, plan, blocks, bar, want)


def _reader(target: TensorRef) -> nn.Module:
    """The module whose input the statistics of `target` are taken from (its own, or an
    attention's out_proj: layer_matrices.reader)."""
    return layer_matrices.reader(*target)


def _by_blocks(
    model: nn.Module, plan: Plan, blocks: nn.ModuleList, bar: Progress, want: cal.Wanted
) -> None:
    """Each block calibrated on the outputs of the pruned blocks before it, then the
    layers outside the blocks (a head) on one pass of the pruned model."""
    reduce, owner = plan.reduce, plan.config.owner
    inside = {id(sub): i for i, block in enumerate(blocks) for sub in block.modules()}
    # Over ranks, an error here is held until the next reduction, where every rank raises.
    pending: BaseException | None = None
    inputs: list[cal.Inputs] = []
    masks: list[Tensor | None] = [None] * len(plan.batches)  # each input's tokens counted
    calls = None
    last = max((inside.get(id(t[0]), -1) for t in plan.targets), default=-1)
    with cal.evaluating(model), torch.no_grad():
        try:
            masks = cal.batch_masks(plan.batches, owner=owner, model=model)
            inputs = cal.capture_block_inputs(model, blocks[0], plan.batches, owner=owner)
            # each block's own arguments (mask, rotary), up to the last pruned one
            calls = cal.block_calls(
                model, blocks, plan.batches, wanted=last + 1, owner=owner, hint=SEQUENTIAL
            )
        except Exception as error:
            if reduce is None:
                raise
            pending = error
        for i, block in enumerate(blocks[: last + 1]):  # none after the last pruned one
            here = [t for t in plan.targets if inside.get(id(t[0])) == i]
            more = i < last
            if here and plan.config.chosen_sequential == "layers":  # refused with `reduce`
                inputs = _by_groups(plan, block, inputs, here, want, bar, more, SEQUENTIAL, masks)
                inputs = cal.called_as(inputs, calls, i + 1) if more else inputs
                continue
            if here:
                mods = [_reader(t) for t in here]
                stats = cal.block_statistics(
                    block,
                    inputs,
                    mods,
                    want,
                    owner=owner,
                    reduce=reduce,
                    failed=pending,
                    names=plan.paths,
                    masks=masks,
                )
                _prune_layers(plan, here, stats, bar)
                del stats
            if more and pending is None:
                try:
                    inputs = cal.called_as(
                        cal.next_inputs(block, inputs, owner=owner, hint=SEQUENTIAL), calls, i + 1
                    )
                except Exception as error:
                    if reduce is None:
                        raise
                    pending = error
        del inputs
    if reduce is not None:
        cal.agree(reduce, pending)
    rest = [t for t in plan.targets if id(t[0]) not in inside]
    if rest:  # layers outside the blocks (a head): one pass of the pruned model
        mods = [_reader(t) for t in rest]
        stats = cal.calibrate(
            model, plan.batches, mods, want, owner=owner, reduce=reduce, names=plan.paths
        )
        _prune_layers(plan, rest, stats, bar)


def wanted(plan: Plan) -> cal.Wanted:
    """The statistics `plan`'s calibrated method gathers of each layer's input."""
    return cal.Wanted(
        norms=plan.method == "wanda", hessian=plan.method == "sparsegpt", patches=True
    )


def prune_block(
    plan: Plan,
    block: nn.Module,
    targets: list[TensorRef],
    inputs: list[cal.Inputs],
    bar: Progress,
    more: bool,
) -> list[cal.Inputs]:
    """Prune `targets` (tensors of `block`) from `block`'s `inputs` as the sequential
    in-memory driver does (one process, no ranks): the same statistics, criteria and
    order, so the same masks. Returns the pruned block's outputs, the next block's inputs,
    if there is `more` to calibrate (else none). The inputs are those of `plan.batches`,
    in order, whose masked tokens take no part (``cal.batch_masks``).

    Raises:
        AssertionError: `inputs` not one per batch of `plan` (a bug of the caller: which
            input's tokens a batch's mask names could not be told).
    """
    if len(inputs) != len(plan.batches):  # raised under python -O too
        raise AssertionError(
            f"prune_block: {len(inputs)} block inputs for {len(plan.batches)} batches; "
            "expected one per batch of the plan"
        )
    want = wanted(plan)
    masks = cal.batch_masks(plan.batches, owner=plan.config.owner, model=plan.model)
    with layer_matrices.out_proj_called(targets):
        if targets and plan.config.chosen_sequential == "layers":
            return _by_groups(plan, block, inputs, targets, want, bar, more, masks=masks)
        if targets:
            stats = cal.block_statistics(
                block,
                inputs,
                [_reader(t) for t in targets],
                want,
                owner=plan.config.owner,
                names=plan.paths,
                masks=masks,
            )
            _prune_layers(plan, targets, stats, bar)
            del stats
        return cal.next_inputs(block, inputs, owner=plan.config.owner) if more else []


def _by_groups(
    plan: Plan,
    block: nn.Module,
    inputs: list[cal.Inputs],
    targets: list[TensorRef],
    wanted: cal.Wanted,
    bar: Progress,
    more: bool,
    hint: str = "",
    masks: Sequence[Tensor | None] | None = None,
) -> list[cal.Inputs]:
    """The targets of one block, one group of layers at a time in the order the block
    calls them (those reading one input together: query, key and value; then the
    attention's output; gate and up; down), each calibrated on the outputs of the
    groups pruned before it (criteria.grouped). Returns the block's outputs, the next
    block's inputs, if there is `more` to calibrate (else none). `hint`: what a block's
    refusal ends with (``SEQUENTIAL`` for the in-memory call, which takes it)."""
    left = list(targets)
    trim()  # the runs of the block before: their pages, not kept beside this block's
    readers = [_reader(t) for t in targets]
    with GroupedRuns(
        block,
        inputs,
        readers,
        wanted,
        names=plan.paths,
        owner=plan.config.owner,
        hint=hint,
        masks=masks,
    ) as runs:
        while left:
            stats, group = runs.next_group([_reader(t) for t in left])
            if not group:
                _check_seen(plan, stats, *left[0])  # raises: it never ran
            members = {id(m) for m in group}
            _prune_layers(plan, [t for t in left if id(_reader(t)) in members], stats, bar)
            left = [t for t in left if id(_reader(t)) not in members]
        if more:
            return runs.outputs()
        runs.check_calls()  # the last block: no run for outputs goes to its end
        return []


def _check_seen(plan: Plan, stats: cal.InputStatistics, module: nn.Module, name: str) -> None:
    if not stats.seen(layer_matrices.reader(module, name)):
        raise value_error(
            f"{plan.config.owner}: {plan.describe(module, name)} never ran on the calibration "
            "data; expected every pruned layer to be used by the model's forward"
        )


def _prune_layers(
    plan: Plan, targets: Sequence[TensorRef], stats: cal.InputStatistics, bar: Progress
) -> None:
    for module, name in targets:
        _check_seen(plan, stats, module, name)
    if plan.method == "sparsegpt":
        read = [(_reader(t), t) for t in targets]
        for sharing in stats.sharing(read):  # layers reading one input: one Hessian
            hessian = stats.hessian(sharing[0][0])
            shared = [t for _, t in sharing]
            trim()  # the pages freed before (runs, sweeps, writes), not kept beside this one
            _sparsegpt_layers(plan, shared, hessian)
            del hessian
            bar.advance(len(shared))
        trim()  # the last sweep's and writes' pages, not kept beside the next runs
        return
    for module, name in targets:
        with naming(_path(plan, module, name)):
            Pruning.apply(
                module,
                name,
                plan.amount,
                criterion=Wanda(_entry_norms(stats, module, name)),
                pattern=oriented(module, name, plan.pattern),
            )
        _settle(plan, [(module, name)])
        bar.advance()


def _path(plan: Plan, module: nn.Module, name: str) -> str:
    """``module.<name>``'s path in the model, quoted, as errors name it: 'a.weight'."""
    path = plan.paths.get(module, "")
    return repr(f"{path}.{name}" if path else name)


def _entry_norms(stats: cal.InputStatistics, module: nn.Module, name: str) -> Tensor:
    """Wanda's norms for ``module.<name>``: one per input feature of a Linear, else the
    norm of what each entry multiplies (criteria.layers)."""
    norms = stats.norms(layer_matrices.reader(module, name))
    if isinstance(module, nn.Linear):
        return norms
    shape = current_values(module, name).shape
    return layer_matrices.entry_norms(module, norms.reshape(-1, norms.shape[-1]), shape)


def _sparsegpt_layers(plan: Plan, targets: Sequence[TensorRef], hessian: Tensor) -> None:
    """SparseGPT on the layers' matrices (criteria.layers), one per group; layers that
    read one input (`hessian` theirs) are swept together."""
    values = [current_values(module, name) for module, name in targets]
    weights = [layer_matrices.matrices(m, v) for (m, _), v in zip(targets, values, strict=True)]
    lives = [
        None if a is None else layer_matrices.matrices(m, a)
        for (m, _), a in zip(targets, (alive(m, n) for m, n in targets), strict=True)
    ]
    hessians = hessian.reshape(-1, *hessian.shape[-2:])
    amounts = [Amount(plan.amount, "SparseGPT")] * hessians.shape[0]
    if hessians.shape[0] > 1 and type(plan.pattern) is Unstructured:
        (first,) = weights  # a grouped convolution: read by no other layer
        amounts = _group_counts(plan.amount, first, lives[0])
    found: list[list[tuple[Tensor, Tensor]]] = [[] for _ in targets]
    for group in range(hessians.shape[0]):
        results = sparsegpt_prune_shared(
            [w[group] for w in weights],
            hessians[group],
            amounts[group],
            plan.pattern,
            [None if live is None else live[group] for live in lives],
            plan.sparsegpt,
            names=[plan.describe(module, name) for module, name in targets],
            spend_hessian=True,  # the statistics' own, read by no one after this group
        )
        for each, result in zip(found, results, strict=True):
            each.append(result)
    for (module, name), value, each in zip(targets, values, found, strict=True):
        keep = layer_matrices.from_matrices(module, _stacked([k for k, _ in each]), value.shape)
        updated = layer_matrices.from_matrices(module, _stacked([u for _, u in each]), value.shape)
        param = cal.parameter(module, name)
        plan.write_ahead([param])  # undo keeps no copy of the weights in memory
        with torch.no_grad():  # pruned entries keep their values (merged in `updated`'s own memory)
            param.copy_(torch.where(keep, updated, param, out=updated))
        custom_from_mask(module, name, keep.to(dtype=param.dtype))
        _settle(plan, [(module, name)])


def _stacked(parts: list[Tensor]) -> Tensor:
    """`parts` stacked; one part (a Linear's one matrix) as a view, not copied."""
    return parts[0].unsqueeze(0) if len(parts) == 1 else torch.stack(parts)


def _settle(plan: Plan, targets: Sequence[TensorRef]) -> None:
    """Without `plan.keep_masks`: the pruning of each of `targets` made permanent now, in
    place (the values written ahead first), so that no layer keeps its mask and its
    original values beside the pruned ones while the call goes on."""
    if not plan.keep_masks:
        make_permanent(targets, plan.journal)


def make_permanent(targets: Sequence[TensorRef], journal: Transaction | None) -> None:
    """Make the pruning of each of `targets` permanent (prunekit.remove: mask x orig written
    into the Parameter, in place).

    Args:
        targets: (module, name) pairs of pruned tensors.
        journal: the call's transaction, which each tensor's values are written ahead to
            first (and which puts them back if the call fails); None: no undo.

    Raises:
        ValueError: a target is not pruned.
    """
    for module, name in targets:
        if journal is not None:
            journal.write_ahead([cal.parameter(module, name)])
        remove(module, name)


def _group_counts(amount: float, matrices: Tensor, live: Tensor | None) -> list[Amount]:
    """A fraction of the entries of a layer of several matrices (groups, rows, columns), as
    counts per group that add up to the layer's count (round(amount x entries competing),
    as any unstructured pruning's): spread by cumulative rounding, where each group's own
    rounding would miss it by up to half an entry per group."""
    if live is None:
        sizes = [matrices[0].numel()] * matrices.shape[0]
    else:
        sizes = [int(n) for n in live.reshape(live.shape[0], -1).sum(dim=1)]
    whole = sum(sizes)
    total = Amount(amount, "SparseGPT").count(whole)
    upto = [0, *itertools.accumulate(sizes)]
    rounded = [(2 * total * u + whole) // (2 * whole) if whole else 0 for u in upto]
    return [Amount(b - a, "SparseGPT") for a, b in itertools.pairwise(rounded)]
