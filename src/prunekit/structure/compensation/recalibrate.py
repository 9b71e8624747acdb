"""``recalibrate_norms``: BatchNorm running statistics re-estimated on calibration data.

Masking or compensating channels changes what every later BatchNorm sees, while its running
mean and variance still describe the dense model. Re-estimating them is a forward pass over
the calibration batches with only the BatchNorms in training mode and their momentum set to
None, so that each running statistic ends as the cumulative average over the batches (the
mean of the batch means, and of the unbiased batch variances) rather than an exponential one.

The statistics then describe the calibration data: where it is narrower than what the model
was trained on, they move away from what its later layers expect even with nothing pruned.
Measured on EfficientNet-Lite0 (ImageNet weights) with 64 crops of 10 photos: the dense model,
its statistics re-estimated, agrees with itself on 34-39 % of held-out crops of the same
photos (``benchmarks/cnn_structure.py --dense-bn``). Re-estimate on data as broad as the
training data, or keep the statistics and compensate instead (``prune_channels(...,
compensate="reference")`` refits each layer towards the dense model's output, so the
BatchNorms after it see what they were estimated on).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from prunekit.calibrate import batch_list, run_batch
from prunekit.core.errors import value_error, warn_caller
from prunekit.structure.graph.graph import check_model

__all__ = ["recalibrate_norms"]


def recalibrate_norms(model: nn.Module, calibration: Iterable[Any]) -> int:
    """Reset the running statistics of every BatchNorm of `model` and recompute them.

    Each batch of `calibration` goes through the model once, without gradients, with the
    BatchNorms that track running statistics in training mode (momentum None: a cumulative
    average over the batches) and every other module in evaluation mode (dropout off). The
    training flags and momenta are put back afterwards; parameters and the buffers of other
    modules are not touched. Masked BatchNorm parameters are fine: a masked channel's
    statistics are recomputed too but its output stays zero. A BatchNorm the forward never
    runs (a branch taken in training mode only) keeps its statistics, with a warning
    naming it: there is nothing to re-estimate them from.

    Args:
        model: the model, pruned or not.
        calibration: an iterable of batches the model's forward takes (a tensor, a mapping
            of keyword arguments or a tuple of positional arguments each).

    Returns:
        The number of BatchNorm modules re-estimated (0 when the model has none: it is then
        not run).

    Raises:
        TypeError: `model` is not an nn.Module, or a batch is not of a kind listed above.
        ValueError: `calibration` holds no batch, or a batch gives a BatchNorm no values
            (an empty batch) or makes its statistics NaN or infinite; every BatchNorm's
            statistics are then restored.
        Exception: any error of the model's forward, raised as it is, after every
            BatchNorm's statistics, momentum and every module's training flag have been
            restored.
    """
    check_model(model, "recalibrate_norms")
    batches = batch_list(calibration, "recalibrate_norms")
    norms = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not norms:
        return 0
    flags = [(m, m.training) for m in model.modules()]
    saved = [(m, m.momentum, {k: v.clone() for k, v in m.named_buffers(recurse=False)})
             for m in norms]  # fmt: skip
    names = {id(m): name for name, m in model.named_modules()}
    seen = _Seen(norms)
    try:
        model.eval()
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None
            norm.train()
        with torch.no_grad():
            for index, batch in enumerate(batches):
                seen.start()
                run_batch(model, batch)
                seen.check(index, names)
    except BaseException:
        _restore(saved)
        raise
    finally:
        seen.remove()
        for norm, momentum, _ in saved:
            norm.momentum = momentum
        for module, training in flags:
            module.training = training
    idle = [entry for entry in saved if id(entry[0]) not in seen.ran]
    if idle:
        _restore(idle)
        listed = ", ".join(repr(names[id(norm)]) for norm, _, _ in idle)
        warn_caller(
            f"recalibrate_norms: {listed} never ran on the calibration batches (a branch "
            "taken in training mode only, say), so their statistics are kept as they were"
        )
    return len(norms) - len(idle)


Saved = tuple[_BatchNorm, Any, dict[str, Tensor]]


def _restore(saved: Iterable[Saved]) -> None:
    """Put back each BatchNorm's buffers as they were saved."""
    with torch.no_grad():
        for norm, _, buffers in saved:
            for name, value in norm.named_buffers(recurse=False):
                value.copy_(buffers[name])


class _Seen:
    """Which BatchNorms ran, and on how many values, batch by batch (forward pre-hooks)."""

    def __init__(self, norms: list[_BatchNorm]) -> None:
        self.norms = norms
        self.ran: set[int] = set()
        self.values: dict[int, int] = {}
        self.hooks = [norm.register_forward_pre_hook(self._count) for norm in norms]

    def _count(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        found = args[0].numel() if args and isinstance(args[0], Tensor) else 1
        self.values[id(module)] = self.values.get(id(module), 0) + found

    def start(self) -> None:
        self.values = {}

    def check(self, index: int, names: dict[int, str]) -> None:
        """Refuse batch `index` where it gave a BatchNorm no values or made its statistics
        not finite."""
        for norm in self.norms:
            if id(norm) not in self.values:
                continue
            where = f"recalibrate_norms: batch {index}"
            if self.values[id(norm)] == 0:
                raise value_error(
                    f"{where} gives {names[id(norm)]!r} no values (an empty batch); expected "
                    "batches of at least one sample (torch would count it in the average)"
                )
            stats = [t for t in (norm.running_mean, norm.running_var) if t is not None]
            if not all(bool(t.isfinite().all()) for t in stats):
                raise value_error(
                    f"{where} makes the running statistics of {names[id(norm)]!r} NaN or "
                    "infinite; expected batches whose activations are finite"
                )
            self.ran.add(id(norm))

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
