"""One-shot pruning of chosen tensors of a model: magnitude, random, or calibrated (Wanda,
SparseGPT, Taylor), with any pattern, layer by layer or block by block.

``run(model, targets, config, calibration)`` (a whole.Config says what and how) checks
every target and batch first (plan.py), then prunes (calibrated.py) inside one
transaction: if anything fails (a batch the model cannot take, an interrupt), the model
is put back as it was, SparseGPT's weight updates included. prunekit.prune_model is the front
door; this is its engine. Before a weight changes in place (SparseGPT's update, a pruning
made permanent without `keep_masks`), its values are written ahead to a temporary file for
that undo, not kept in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

import prunekit.calibrate as cal
from prunekit.core.errors import value_error
from prunekit.core.transaction import transaction
from prunekit.progress import Progress
from prunekit.whole.config import Config
from prunekit.whole.oneshot_execute import execute
from prunekit.whole.oneshot_plan import Loss, TensorRef, make_plan

__all__ = ["run"]


def run(
    model: nn.Module,
    targets: list[TensorRef],
    config: Config,
    calibration: Iterable[Any] | None = None,
    loss: Loss | None = None,
    *,
    then: Callable[[], None] | None = None,
    reduce: cal.Reduce | None = None,
    keep_masks: bool = True,
) -> None:
    """The one-shot engine: check (see plan.make_plan), then prune `targets` as `config`
    says, in one transaction over all of `model`.

    `then` runs last, inside the transaction (a failure anywhere, in a forward, a
    criterion or `then`, leaves the model as it was). `reduce` (see
    prunekit.calibrate.reduce.Reduce) makes the calibrated methods use the statistics (Taylor:
    the saliencies) of every data-parallel rank's batches, each rank holding the whole
    model; the ranks settle once the arguments are checked and once more inside the
    transaction, at the end, so that a failure on any rank undoes the call on every rank.
    Without `keep_masks`, each target's pruning is made permanent as soon as it is pruned
    (as prunekit.remove would after the call), so that the call never holds a mask and
    the original values of more than one layer beside the pruned ones.
    """
    try:
        if reduce is not None and config.chosen_sequential == "layers":
            raise value_error(
                f"{config.owner}: sequential='layers' finds each block's groups of layers "
                "from the order its batches call them, which may differ from rank to rank; "
                "expected sequential=True with process_group"
            )
        plan = make_plan(model, targets, config, calibration, loss)
    except Exception as error:
        if reduce is None:
            raise
        reduce.settle(error)  # every rank raises
        raise
    if reduce is not None:
        reduce.settle(None)  # every rank's checks passed, and the arguments agree
    plan.reduce = reduce
    plan.keep_masks = keep_masks
    bar = Progress(f"{plan.method} {plan.pattern!r}", len(plan.targets), config.progress)
    try:
        with transaction(model) as recorded:
            plan.journal = recorded
            execute(model, plan, bar)
            if then is not None:
                then()
            if reduce is not None:
                reduce.settle(None)  # a rank failing since the last step: every rank undoes
    finally:
        bar.close()
