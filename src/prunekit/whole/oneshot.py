"""One-shot pruning of chosen tensors of a model: magnitude, random, or calibrated (Wanda,
SparseGPT, Taylor), with any pattern, layer by layer or block by block.

``oneshot(model, targets, amount, method=..., pattern=..., calibration=...)`` checks every
argument, target and batch first (plan.py), then prunes (calibrated.py) inside one
transaction: if anything fails (a batch the model cannot take, an interrupt), the model is
put back as it was, SparseGPT's weight updates included. prunekit.prune_model is the front
door; this is its engine. SparseGPT's weights keep their previous values, for that undo,
until the call returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from prunekit.core.errors import value_error
from prunekit.core.transaction import transaction
from prunekit.criteria import calibration as cal
from prunekit.progress import Progress
from prunekit.whole.calibrated import execute
from prunekit.whole.config import Config
from prunekit.whole.plan import Loss, TensorRef, make_plan

__all__ = ["oneshot", "run"]


def oneshot(
    model: nn.Module,
    targets: Iterable[TensorRef],
    amount: float,
    *,
    method: str = "l1",
    pattern: Any = None,
    scope: str = "layer",
    calibration: Iterable[Any] | None = None,
    sequential: bool | str | None = None,
    loss: Loss | None = None,
    damp: float = 0.1,
    blocksize: int = 128,
    progress: bool | None = None,
) -> None:
    """Prune `amount` of each of `targets` ((module, name) pairs inside `model`).

    Args:
        model: the model holding the targets (the transaction covers all of it).
        targets: (module, name) pairs of the tensors to prune.
        amount: a fraction in [0, 1] or a count of entries, of each target (scope
            'layer') or of all of them ('global').
        method: 'l1' (magnitude), 'random', 'wanda' (|W| x input norm), 'sparsegpt'
            (OBS with weight updates, written into ``<name>_orig``), 'taylor' (|W x grad|
            summed over the batches of `loss(output, batch)`, default ``output.loss``).
        pattern: None for the method's own (Wanda per row in scope 'layer', the others
            unstructured), 'unstructured', 'row', 'N:M' or a Pattern.
        scope: 'layer' or 'global' (unstructured only).
        calibration: the batches the calibrated methods run (tensors, mappings of
            keyword arguments or tuples).
        sequential: calibrate block by block, each on the outputs of the pruned blocks
            before it (Wanda and SparseGPT; Taylor always takes the whole model's
            gradient); 'layers': in each block, its layers too, group by group (see
            prunekit.prune_model); None: the method's own ('layers' for SparseGPT,
            True for the others).
        loss: Taylor's loss of the model's output and the batch.
        damp: SparseGPT's dampening, a share of the Hessian diagonal's mean.
        blocksize: SparseGPT's columns updated at a time.
        progress: a bar on stderr (default: when stderr is a terminal).

    Raises:
        TypeError, ValueError: a bad argument, target or batch (nothing changed).
    """
    config = Config(
        method=method,
        amount=amount,
        pattern=pattern,
        scope=scope,
        sequential=sequential,
        progress=progress,
        damp=damp,
        blocksize=blocksize,
    )
    run(model, list(targets), config, calibration, loss)


def run(
    model: nn.Module,
    targets: list[TensorRef],
    config: Config,
    calibration: Iterable[Any] | None = None,
    loss: Loss | None = None,
    *,
    then: Callable[[], None] | None = None,
    reduce: cal.Reduce | None = None,
) -> None:
    """The one-shot engine: check (see plan.make_plan), then prune `targets` as `config`
    says, in one transaction over all of `model`.

    `then` runs last, inside the transaction (a failure anywhere, in a forward, a
    criterion or `then`, leaves the model as it was). `reduce` (see
    criteria.calibration.Reduce) makes the calibrated methods use the statistics (Taylor:
    the saliencies) of every data-parallel rank's batches, each rank holding the whole
    model; the ranks settle once the arguments are checked and once more inside the
    transaction, at the end, so that a failure on any rank undoes the call on every rank.
    """
    try:
        if reduce is not None and config.sequential == "layers":
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
    bar = Progress(f"{plan.method} {plan.pattern!r}", len(plan.targets), config.progress)
    try:
        with transaction(model):
            execute(model, plan, bar)
            if then is not None:
                then()
            if reduce is not None:
                reduce.settle(None)  # a rank failing since the last step: every rank undoes
    finally:
        bar.close()
