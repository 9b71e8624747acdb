"""The layer handlers' joins: a grouped convolution ties the j-th channel of every group, its
inputs as vectors of pairs and its fresh outputs straight to the first group's ids."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers import graph_frozen
from prunekit.structure.graph.tables import HANDLERS
from prunekit.structure.trace.tracer import Tracer, compressed, run_traced


class _Grouped(nn.Module):
    """Grouped convolutions: one reading two channels of no layer (the input's), one not."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.grouped = nn.Conv2d(8, 12, 3, padding=1, groups=4)
        self.mixed = nn.Conv2d(12, 12, 1, groups=3)
        self.head = nn.Conv2d(12, 5, 1)

    def forward(self, x: Tensor) -> Tensor:
        y = self.grouped(torch.cat([self.stem(x), x[:, :2]], 1))
        return self.head(torch.relu(self.mixed(y)))


def _roots(model: nn.Module, x: Tensor) -> Tensor:
    tr, _ = run_traced(model, (x,), {}, HANDLERS)
    return compressed(tr.parents().clone())


def test_grouped_convolutions_join_the_sets_the_general_merge_joins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The root of every id and the groups equal those of a trace where each join goes
    through ``Tracer.merge`` (pairs deduplicated, no fresh-id shortcut)."""
    torch.manual_seed(0)
    model, x = _Grouped().eval(), torch.randn(1, 3, 5, 5)
    roots = _roots(model, x)
    groups = prunekit.channel_groups(model, x)
    assert any("grouped with channels of no layer" in (g.reason or "") for g in groups)
    fast = graph_frozen.summary(model, groups)
    monkeypatch.setattr(Tracer, "union", Tracer.merge)
    monkeypatch.setattr(Tracer, "attach", Tracer.merge)
    assert torch.equal(_roots(model, x), roots)
    assert graph_frozen.summary(model, prunekit.channel_groups(model, x)) == fast


def test_a_grouped_convolution_ties_the_same_channel_of_every_group() -> None:
    torch.manual_seed(0)
    model, x = _Grouped().eval(), torch.randn(1, 3, 5, 5)
    mixed = next(g for g in prunekit.channel_groups(model, x) if g.name == "mixed.weight")
    assert mixed.size == 4  # 12 channels, 3 groups: channel j of each goes with the others
    out = next(s for s in mixed.slices if s.role == "out")
    assert out.indices == ((0, 4, 8), (1, 5, 9), (2, 6, 10), (3, 7, 11))
