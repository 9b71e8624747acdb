"""The calibration driver: the statistics a set of modules wants, gathered over a whole model
or one block at a time, reduced over ranks where asked."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.calibrate.batches import batch_error, evaluating, run_batch
from prunekit.calibrate.block_inputs import Inputs, own_hidden
from prunekit.calibrate.reduce import Reduce
from prunekit.calibrate.statistics import InputStatistics, Stop, batch_masks


@dataclass(frozen=True)
class Wanted:
    """Which statistics of their inputs the modules gather (see InputStatistics)."""

    norms: bool
    hessian: bool
    means: bool = False
    patches: bool = False
    equal: bool = False  # rows weighed by their size (InputStatistics' `equal`)

    def gather(
        self,
        modules: Sequence[nn.Module],
        *,
        early: bool = False,
        names: Mapping[nn.Module, str] | None = None,
    ) -> InputStatistics:
        """Statistics of these kinds for `modules`, gathered while the returned context is
        entered (`early`, `names`: see InputStatistics)."""
        return InputStatistics(
            modules,
            norms=self.norms,
            hessian=self.hessian,
            means=self.means,
            patches=self.patches,
            early=early,
            equal=self.equal,
            names=names,
        )


def calibrate(
    model: nn.Module,
    batches: Sequence[Any],
    modules: Sequence[nn.Module],
    wanted: Wanted,
    *,
    owner: str,
    reduce: Reduce | None = None,
    numbers: Sequence[int] | None = None,
    names: Mapping[nn.Module, str] | None = None,
) -> InputStatistics:
    """One pass of the whole model over `batches`, the `wanted` statistics for `modules`
    (with `reduce`: of every rank's batches). After the first batch, each run ends once
    every module has taken its input (InputStatistics' `early`). `numbers`: each batch's
    index in the caller's calibration (an error names it), where a subset is run. `names`:
    each module's path, which an error names (default: its path in `model`). An error of a
    batch names `owner`, the entry point calibrating. The tokens a mapping batch's
    ``attention_mask`` (a mapping's, or a tuple's by the forward's names) masks out take no
    part (``batch_masks``)."""
    if names is None:
        names = {m: path for path, m in model.named_modules()}
    try:
        masks = batch_masks(batches, numbers, owner, model=model)
    except ValueError as error:  # every rank must learn of it in the reduction
        if reduce is None:
            raise
        return _finish(wanted.gather(modules, names=names), reduce, error)
    gather = wanted.gather(modules, early=True, names=names)
    with evaluating(model), torch.no_grad(), gather as stats:
        run = lambda batch: run_batch(model, batch)  # noqa: E731
        failed = _run_each(stats, batches, run, owner, reduce, numbers, masks)
    return _finish(stats, reduce, failed)


def block_statistics(
    block: nn.Module,
    inputs: Sequence[Inputs],
    modules: Sequence[nn.Module],
    wanted: Wanted,
    *,
    owner: str,
    reduce: Reduce | None = None,
    failed: BaseException | None = None,
    numbers: Sequence[int] | None = None,
    names: Mapping[nn.Module, str] | None = None,
    masks: Sequence[Tensor | None] | None = None,
) -> InputStatistics:
    """The `wanted` statistics for `modules` (inside `block`) from running `block` on
    `inputs` (with `reduce`: of every rank's inputs). `failed`, an error this rank met
    before (the block is not run then), is raised here once every rank has learnt of it.
    After the first input, each run ends once every module has taken its input. `numbers`:
    each input's batch index in the calibration (an error names it), where a subset runs.
    `names`: each module's path in the whole model, which an error names (else its class).
    An error of an input names `owner`, the entry point calibrating. `masks`: each input's
    tokens that count (``batch_masks`` of its batches), None: all."""
    with wanted.gather(modules, early=True, names=names) as stats:
        if failed is None:

            def run(call: Inputs) -> object:
                # a copy of the hidden states: the inputs are run again for the outputs
                args, kwargs = own_hidden(call)
                return block(*args, **kwargs)

            failed = _run_each(stats, inputs, run, owner, reduce, numbers, masks)
    return _finish(stats, reduce, failed)


def _run_each(
    stats: InputStatistics, items: Iterable[Any], run: Callable[[Any], object], owner: str,
    reduce: Reduce | None, numbers: Sequence[int] | None = None,
    masks: Sequence[Tensor | None] | None = None,
) -> BaseException | None:  # fmt: skip
    """Run each item as a batch of `stats` (its tokens that count: its entry of `masks`).
    An error names `owner` and its batch (its entry of `numbers` where given); with
    `reduce` it is returned (every rank must learn of it in the reduction) instead of
    raised."""
    try:
        for index, item in enumerate(items):
            stats.new_batch(None if masks is None else masks[index])
            try:
                run(item)
            except Stop:
                pass  # every module took its input: the rest of the run is not needed
            except Exception as error:
                number = index if numbers is None else numbers[index]
                raise batch_error(number, error, owner=owner)  # noqa: B904 (its cause is set)
    except Exception as error:
        if reduce is None:
            raise
        return error
    return None


def _finish(
    stats: InputStatistics, reduce: Reduce | None, failed: BaseException | None
) -> InputStatistics:
    """Reduce the statistics over the ranks (raising an error any rank met), or raise this
    rank's own error."""
    if reduce is not None:
        stats.reduce(reduce, failed)
    elif failed is not None:
        raise failed
    return stats
