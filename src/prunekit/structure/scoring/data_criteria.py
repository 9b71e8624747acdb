"""Group criteria that learn from data: input activations (Wanda-style) and Taylor.

The statistics and the per-entry scores are the criteria's (``prunekit.criteria``): the input
norms of ``calibration.InputStatistics``, Wanda's |W| x norm (``wanda.wanda_scores``), the
signed product W x dL/dW (``taylor.taylor_product``) from the gradient loop that restores
every ``requires_grad`` flag and ``.grad`` afterwards. These classes only sum them over the
entries (or input channels) of each unit. Neither changes the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

import prunekit.calibrate as cal
from prunekit.criteria.taylor import taylor_product
from prunekit.criteria.wanda import wanda_scores
from prunekit.structure.graph.graph import ChannelGroup, Slice
from prunekit.structure.scoring.protocol import (
    Calibration,
    GroupCriterion,
    Loss,
    consumer_modules,
    parameter_slices,
    per_unit,
    unit_sums,
    values,
)
from prunekit.structure.scoring.weights import WeightNorm

__all__ = ["Activation", "GroupTaylor"]


class Activation(GroupCriterion):
    """Wanda for channels: a unit's score is, over every consumer column that reads it,
    |W| x the L2 norm of that input channel over the calibration batches.

    The norms are those of each consumer module's forward input (a Linear's features, a
    convolution's channels); for a grouped convolution each row group reads its own
    channels. A consumer whose module does not run its own forward on that input (a weight
    read by another module's code) adds nothing; a group with no such consumer is ranked by
    'l2'.
    """

    calibrated = True

    def __init__(self) -> None:
        self.norms: dict[int, Tensor] = {}

    def gather(self, calibration: Calibration) -> None:
        modules = consumer_modules(calibration.groups)
        wanted = cal.Wanted(norms=True, hessian=False)
        stats = cal.calibrate(
            calibration.model, calibration.required(), modules, wanted, owner="prune_channels"
        )
        self.norms = {id(m): stats.norms(m).double() for m in modules if stats.seen(m)}

    def scores(self, group: ChannelGroup) -> Tensor:
        total = torch.zeros(group.size, dtype=torch.float64)
        used = False
        for s in group.slices:
            norm = self.norms.get(id(s.module)) if s.role == "in" else None
            per_channel = None if norm is None else _weighted_columns(s, norm)
            if per_channel is None or s.channels is None:
                continue
            used = True
            units = [u for u, channels in enumerate(s.channels) for _ in channels]
            flat = [c for channels in s.channels for c in channels]
            total.index_add_(0, torch.tensor(units, dtype=torch.long), per_channel[flat])
        return total if used else WeightNorm(2).scores(group)


def _weighted_columns(s: Slice, norm: Tensor) -> Tensor | None:
    """Per input channel of the consumer: Wanda's score of the weight with its kernel
    positions summed (the norm is per channel, the same at every position), summed over the
    rows that read the channel (None when the recorded input does not fit the weight)."""
    w = values(s).abs().movedim(s.dim, 1)
    w = w.reshape(w.shape[0], w.shape[1], -1).sum(2)  # (rows, columns)
    rows, per = w.shape
    groups = len(norm) // per if per else 0
    if groups < 1 or groups * per != len(norm) or rows % groups:
        return None
    row_group = torch.arange(rows) // (rows // groups)
    channel = row_group[:, None] * per + torch.arange(per)[None, :]  # what (row, column) reads
    flat = channel.reshape(-1)
    return torch.zeros(len(norm), dtype=torch.float64).index_add_(
        0, flat, wanda_scores(w, norm[channel]).reshape(-1)
    )


class GroupTaylor(GroupCriterion):
    """Taylor for channels: |sum of w x dL/dw over the unit's entries|, the first-order
    change of the loss when the unit goes.

    With calibration batches the gradient of ``loss(output, batch)`` (default
    ``output.loss``) is taken on each batch and the absolute group sums are added over the
    batches (the model's ``requires_grad`` flags and ``.grad`` are as before afterwards);
    without, the gradients already in ``.grad`` are used (run a backward first).
    """

    calibrated = None  # optional
    uses_loss = True

    def __init__(self) -> None:
        self.totals: dict[int, Tensor] | None = None

    def gather(self, calibration: Calibration) -> None:
        if calibration.batches is None:
            self.totals = None
            return
        loss = calibration.loss or cal.output_loss("prune_channels", "criterion='taylor'")
        self.totals = _from_batches(calibration.model, calibration.groups, calibration.batches,
                                    loss)  # fmt: skip

    def scores(self, group: ChannelGroup) -> Tensor:
        if self.totals is not None:
            return self.totals[id(group)]
        return unit_sums(group, parameter_slices(group), _products).abs()


def _from_batches(
    model: nn.Module, groups: Sequence[ChannelGroup], batches: list[Any], loss: Loss
) -> dict[int, Tensor]:
    """Per group: the sum over batches of |sum of w x grad| of each unit."""
    where: dict[tuple[int, str], list[tuple[ChannelGroup, Slice]]] = {}
    tensors: list[tuple[nn.Module, str]] = []
    for g in groups:
        for s in parameter_slices(g):
            key = (id(s.module), s.name)
            if key not in where:
                where[key] = []
                tensors.append((s.module, s.name))
            where[key].append((g, s))
    keys = list(where)
    totals = {id(g): torch.zeros(g.size, dtype=torch.float64) for g in groups}
    batch = {id(g): torch.zeros(g.size, dtype=torch.float64) for g in groups}

    def close_batch() -> None:
        for k, found in batch.items():
            totals[k] += found.abs()
            found.zero_()

    def step(i: int, current: Tensor, grad: Tensor) -> None:
        product = taylor_product(current, grad, torch.float64)
        for g, s in where[keys[i]]:
            batch[id(g)] += per_unit(s, product, g.size)

    params = cal.gradient_targets(tensors)
    cal.gradients(model, batches, params, loss, step, owner="prune_channels", end_batch=close_batch)
    return totals


def _products(s: Slice) -> Tensor:
    """W x dL/dW of the slice's tensor, from the gradient in ``.grad`` (float64)."""
    return taylor_product(values(s), _grad(s))


def _grad(s: Slice) -> Tensor:
    param = cal.parameter(s.module, s.name)
    if param.grad is None:
        raise ValueError(
            f"prune_channels: criterion='taylor' needs gradients, but {s.qualified} has no "
            ".grad; run a backward pass (loss.backward()) on the model first, or pass "
            "calibration= batches (and loss=)"
        )
    return param.grad.detach().to(torch.float64)
