"""Group criteria of the weights alone: 'l1' and 'l2' (the norm of every parameter entry a
unit owns) and 'bn_scale' (|gamma| of the group's norm layers)."""

from __future__ import annotations

from torch import Tensor

from prunekit.structure.graph.graph import ChannelGroup
from prunekit.structure.scoring.protocol import GroupCriterion, parameter_slices, unit_sums, values


class WeightNorm(GroupCriterion):
    """'l1' (p=1: sum of |w|) or 'l2' (p=2: root of the sum of w^2) over each unit's entries.

    Args:
        p: 1 or 2.

    Raises:
        ValueError: another `p`.
    """

    def __init__(self, p: int = 2) -> None:
        if p not in (1, 2):
            raise ValueError(f"WeightNorm: invalid p={p!r}; expected 1 or 2")
        self.p = p

    def scores(self, group: ChannelGroup) -> Tensor:
        params = parameter_slices(group)
        if self.p == 1:
            return unit_sums(group, params, lambda s: values(s).abs())
        return unit_sums(group, params, lambda s: values(s).square()).sqrt()

    def __repr__(self) -> str:
        return f"WeightNorm(p={self.p})"


class BNScale(GroupCriterion):
    """|gamma| of the group's norm layers, summed; 'l2' for a group without one."""

    def scores(self, group: ChannelGroup) -> Tensor:
        norms = [s for s in parameter_slices(group) if s.role == "norm" and s.name == "weight"]
        if norms:
            return unit_sums(group, norms, lambda s: values(s).abs())
        return WeightNorm(2).scores(group)
