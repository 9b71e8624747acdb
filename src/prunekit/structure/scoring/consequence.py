"""Group criteria that rank a unit by the error its removal leaves in the layers reading it.

'obs': the structured optimal-brain-surgeon error. For a consumer with input Hessian H (the
mean of x x^T over calibration inputs, damped by ``OBS_DAMP`` x its mean diagonal) and a
unit reading its columns R, removing the unit and compensating the kept columns leaves the
squared output error sum over rows of w_R^T ((H^-1)[R, R])^-1 w_R, summed over the unit's
consumers. 'fluctuation' (FLAP): the variance of each input channel over the calibration
rows times the squared norm of the consumer's weight column reading it, summed over the
unit's channels and consumers: what a constant (the bias correction) cannot stand for.

Both score only consumers whose weight is 2-D with the input features along the slice's dim
(Linear, HF Conv1D; 'fluctuation' also convolutions of one group, per input channel); a
group with none such is ranked by 'l2'. Hessians are gathered in one pass over the batches
for all consumers at once (one n x n float32 matrix each) and dropped after scoring.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

import prunekit.calibrate as cal
from prunekit.core.errors import value_error
from prunekit.criteria.hessian import damped_inverse
from prunekit.structure.graph.graph import ChannelGroup, Slice
from prunekit.structure.scoring.protocol import (
    Calibration,
    GroupCriterion,
    consumer_modules,
    values,
)
from prunekit.structure.scoring.weights import WeightNorm

__all__ = ["OBS", "OBS_DAMP", "Fluctuation"]

OBS_DAMP = 0.01
"""Damping of the Hessian inverted by 'obs', relative to the mean of its diagonal: light,
as only the ranking depends on it (compensation's own ``DAMP`` is stronger)."""


class _PerConsumer(GroupCriterion):
    """Scores summed over a group's consumers, each computed in ``prepare`` from one
    statistic of that consumer's input (`_statistic`) and the weight slice reading the
    unit (`_unit_errors`); 'l2' for a group none of whose consumers could be measured."""

    calibrated = True
    wanted = cal.Wanted(norms=False, hessian=False)

    def __init__(self) -> None:
        self.totals: dict[int, Tensor] = {}
        self.names: dict[int, str] = {}

    def gather(self, calibration: Calibration) -> None:
        self.totals = {}
        self.names = {id(m): n for n, m in calibration.model.named_modules()}
        groups = calibration.groups
        modules = [m for m in consumer_modules(groups) if self._calibrates(m)]
        stats = cal.calibrate(
            calibration.model, calibration.required(), modules, self.wanted, owner="prune_channels"
        )
        for module in modules:
            if not stats.seen(module) or not self._measures(module):
                continue
            statistic = self._statistic(stats, module)
            for g in groups:
                for s in g.slices:
                    if s.module is module and s.role == "in" and _fits(s, statistic.shape[0]):
                        self._add(g, self._unit_errors(s, statistic))

    def scores(self, group: ChannelGroup) -> Tensor:
        found = self.totals.get(id(group))
        return found if found is not None else WeightNorm(2).scores(group)

    def _calibrates(self, module: nn.Module) -> bool:
        """Whether `module`'s input is calibrated at all."""
        return True

    def _measures(self, module: nn.Module) -> bool:
        """Whether `module`, calibrated and seen, adds to its units' scores."""
        return True

    def _statistic(self, stats: cal.InputStatistics, module: nn.Module) -> Tensor:
        """What the scores need of `module`'s input, one row per input feature."""
        raise NotImplementedError

    def _unit_errors(self, s: Slice, statistic: Tensor) -> Tensor:
        """One float64 score per unit of the consumer slice `s`."""
        raise NotImplementedError

    def _add(self, group: ChannelGroup, per_unit: Tensor) -> None:
        if id(group) in self.totals:
            self.totals[id(group)] += per_unit
        else:
            self.totals[id(group)] = per_unit


class OBS(_PerConsumer):
    """The structured OBS error of removing each unit, from each consumer's input Hessian."""

    wanted = cal.Wanted(norms=False, hessian=True)

    def _calibrates(self, module: nn.Module) -> bool:
        return _two_dimensional(module)

    def _statistic(self, stats: cal.InputStatistics, module: nn.Module) -> Tensor:
        hessian = stats.hessian(module)
        if not bool(torch.isfinite(hessian).all()):  # no damping inverts it: say why
            kind = "NaN" if bool(hessian.isnan().any()) else "inf"
            raise value_error(
                f"prune_channels: criterion='obs': the input of {self.names.get(id(module))} "
                f"on the calibration batches is not finite (its Hessian holds {kind}: the "
                "batches or what the model computes from them hold NaN or inf, or their "
                f"squares overflow {hessian.dtype}); expected calibration batches on which "
                "the model computes finite inputs"
            )
        return damped_inverse(hessian, OBS_DAMP, "'obs'")

    def _unit_errors(self, s: Slice, statistic: Tensor) -> Tensor:
        return obs_errors(_columns(s), statistic, s.indices)


def obs_errors(weight: Tensor, inverse: Tensor, units: Sequence[Sequence[int]]) -> Tensor:
    """Per unit of columns R: sum over rows of w_R^T (inverse[R, R])^-1 w_R (float64).

    Args:
        weight: (rows, n), the consumer's weight with input features as columns.
        inverse: (n, n), the inverse of the (damped) input Hessian.
        units: the columns of each unit.
    """
    w = weight.to(torch.float64)
    result = torch.zeros(len(units), dtype=torch.float64)
    sizes = {len(u) for u in units}
    for size in sizes:
        which = [k for k, u in enumerate(units) if len(u) == size]
        if size == 0:
            continue
        index = torch.tensor([list(units[k]) for k in which], dtype=torch.long)  # (U, r)
        blocks = inverse[index[:, :, None], index[:, None, :]]  # (U, r, r)
        taken = w[:, index].permute(1, 2, 0)  # (U, r, rows)
        factor = torch.linalg.cholesky(blocks)
        solved = torch.cholesky_solve(taken, factor)
        result[which] = (taken * solved).sum(dim=(1, 2))
    return result


class Fluctuation(_PerConsumer):
    """FLAP's fluctuation: input-channel variance x squared weight-column norm."""

    wanted = cal.Wanted(norms=True, hessian=False, means=True)

    def _measures(self, module: nn.Module) -> bool:
        return _ungrouped(module)

    def _statistic(self, stats: cal.InputStatistics, module: nn.Module) -> Tensor:
        return stats.variances(module)

    def _unit_errors(self, s: Slice, statistic: Tensor) -> Tensor:
        moved = values(s).movedim(s.dim, 0)
        norms = moved.reshape(moved.shape[0], -1).square().sum(1)
        per = [float((statistic[list(u)] * norms[list(u)]).sum()) for u in s.indices]
        return torch.tensor(per, dtype=torch.float64)


def _two_dimensional(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(weight, Tensor) and weight.dim() == 2


def _ungrouped(module: nn.Module) -> bool:
    return getattr(module, "groups", 1) == 1


def _fits(s: Slice, features: int) -> bool:
    """The slice's positions are the consumer's input features (one per position)."""
    value = getattr(s.module, s.name, None)
    return (
        s.name == "weight"
        and isinstance(value, Tensor)
        and value.shape[s.dim] == features
        and s.channels is not None
        and all(tuple(c) == tuple(p) for c, p in zip(s.channels, s.indices, strict=True))
    )


def _columns(s: Slice) -> Tensor:
    """The slice's 2-D weight with the input features as columns."""
    return values(s).movedim(s.dim, -1)
