"""The tracer's labels: merged ids settled into one id per channel, and the groups they give."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers import graph_frozen
from prunekit.structure.graph.grouping import build_groups
from prunekit.structure.graph.tables import HANDLERS
from prunekit.structure.handlers import ops
from prunekit.structure.trace import skim
from prunekit.structure.trace import tracer as tracer_module
from prunekit.structure.trace.tracer import Tracer, run_traced


class _Tokens(nn.Module):
    """A class token and a position embedding added to projected patches, then a block."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.pos = nn.Parameter(torch.randn(1, 5, 8))
        self.norm = nn.LayerNorm(8)
        self.fc1, self.fc2 = nn.Linear(8, 12), nn.Linear(12, 8)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.cat([self.cls.expand(len(x), -1, -1), self.proj(x)], dim=1) + self.pos
        x = x + self.fc2(torch.relu(self.fc1(self.norm(x))))
        return x[:, 0]


def test_settled_broadcasts_ids_merged_along_a_dim() -> None:
    tr = Tracer()
    ids = tr.new_ids(6).reshape(2, 3)  # 2 rows x 3 channels, every id its own
    assert tr.settled(ids) is ids  # nothing merged: the labels as they were
    tr.merge(ids[0], ids[1])  # each channel's two rows merged
    settled = tr.settled(ids)
    assert settled.stride(0) == 0 and settled.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert tr.settled(torch.tensor([3, 4, 5])).tolist() == [3, 4, 5]  # one dim: as it was


def _label_of_input(name: str) -> Tensor | None:
    """The labels of what `_Tokens`' submodule `name` reads, in a traced forward."""
    torch.manual_seed(0)
    model = _Tokens().eval()
    seen: dict[str, Tensor] = {}

    def keep(_: nn.Module, args: Any) -> None:
        seen["input"] = args[0]

    model.get_submodule(name).register_forward_pre_hook(keep)
    tr, _ = run_traced(model, (torch.randn(2, 4, 6),), {}, HANDLERS)
    return tr.label(seen["input"])


def test_the_residual_stream_is_carried_settled() -> None:
    norm_out = _label_of_input("fc1")
    assert norm_out is not None and norm_out.stride(1) == 0  # one id per channel, all tokens


def _groups(model: nn.Module, x: Tensor) -> dict[str, Any]:
    return graph_frozen.summary(model, prunekit.channel_groups(model, x))


def test_settling_gives_the_groups_unsettled_labels_give(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model, x = _Tokens().eval(), torch.randn(2, 4, 6)
    settled = _groups(model, x)
    monkeypatch.setattr(tracer_module.Tracer, "settled", lambda self, labels: labels)
    assert _groups(model, x) == settled


def test_a_norm_settles_its_input_too() -> None:
    """The residual stream a norm reads carries one id per channel once the norm merged its
    positions' ids: the residual add after the block reads it so."""
    stream = _label_of_input("norm")
    assert stream is not None and stream.stride(1) == 0


def test_fresh_element_ids_give_the_groups_merged_ones_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A position embedding's element ids, made for the add that reads them, join their
    partners' sets directly: the same groups as merging them in the union-find."""
    torch.manual_seed(0)
    model, x = _Tokens().eval(), torch.randn(2, 4, 6)
    attached = _groups(model, x)
    monkeypatch.setattr(ops, "_fresh", lambda labels, made, out: False)
    assert _groups(model, x) == attached


class _Shared(nn.Module):
    """One linear layer read twice, and an attention whose fused projection holds the query,
    key and value rows apart."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.mix = nn.Linear(4, 8), nn.Linear(8, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        h = self.mix(self.proj(x)) + self.mix(self.proj(x.flip(1)))
        return self.attn(h, h, h, need_weights=False)[0]


def test_records_apart_give_the_groups_a_table_of_positions_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows of one tensor recorded apart (the fused projection) are kept without a table;
    forcing the table for every second record gives the same groups."""
    torch.manual_seed(0)
    model, x = _Shared().eval(), torch.randn(1, 3, 4)
    tr, _ = run_traced(model, (x,), {}, HANDLERS)
    tabled = {name for _, name, _ in tr._positions}
    assert "in_proj_weight" not in tabled and "weight" in tabled  # mix's, read twice
    apart = _groups(model, x)
    monkeypatch.setattr(tracer_module._Span, "apart", lambda self, other: False)
    assert _groups(model, x) == apart


class _Block(nn.Module):
    """Conv, norm and activation layers reading each other's channels, with a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6)
        self.depthwise = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.grouped = nn.Conv2d(6, 6, 1, groups=2)
        self.head = nn.Linear(6, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.norm(self.stem(x)))
        x = x + self.grouped(self.depthwise(x))
        return self.head(x.mean((2, 3)))


def test_ids_read_back_as_made_give_the_groups_of_fresh_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Layers reading the ids tensor their input's labels were made from, with one positions
    tensor per count (records sharing their entries), give the groups that fresh tensors for
    every record give."""
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(1, 3, 5, 5)
    tr, _ = run_traced(model, (x,), {}, HANDLERS)
    stem_rows = next(r for r in tr.records if r.module_name == "stem" and r.role == "out")
    norm = next(r for r in tr.records if r.module_name == "norm")
    assert norm.ids is stem_rows.ids and norm.positions is stem_rows.positions
    shared = _groups(model, x)
    monkeypatch.setattr(Tracer, "flat", lambda self, labels, dim: None)
    monkeypatch.setattr(Tracer, "positions", lambda self, count: torch.arange(count))
    assert _groups(model, x) == shared


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(x + self.fc(x))


def _one_too_wide(args: Any) -> tuple[tuple[int, ...], None, int]:
    """A broken rule of the skim for linear layers: one output feature too many."""
    x, w = args(0, "input"), args(1, "weight")
    return (*x.shape[:-1], w.shape[0] + 1), None, 1 << 30


def test_a_broken_skip_fails_strictly_and_falls_back_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model, x = _Residual().eval(), torch.randn(2, 16)
    expected = _groups(model, x)
    monkeypatch.setitem(skim._RULES, "linear", _one_too_wide)
    assert tracer_module.STRICT_SKIM  # the test suite's setting (tests/conftest.py)
    with pytest.raises(AssertionError, match="skimmed trace of _Residual failed") as caught:
        prunekit.channel_groups(model, x)
    assert isinstance(caught.value.__cause__, RuntimeError)  # the add of unequal widths
    assert str(caught.value.__cause__) in str(caught.value)
    monkeypatch.setattr(tracer_module, "STRICT_SKIM", False)
    assert _groups(model, x) == expected  # traced again, computing every op


class _Reads(nn.Module):
    """Reads a value of the activations, and raises an error of its own where that fails."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x)
        try:
            scale = float(h.abs().max())
        except Exception as error:
            raise ValueError("the scale cannot be read") from error
        return h / (1 + scale)


def test_a_failure_following_a_value_read_traces_again_strictly_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The model's own error after the skim's signal that values are needed is that signal's
    consequence, not a bug of the skim: traced again, even with STRICT_SKIM."""
    torch.manual_seed(0)
    made: list[skim.Fakes] = []

    class Kept(skim.Fakes):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(tracer_module, "Fakes", Kept)
    model, x = _Reads().eval(), torch.randn(2, 256)
    assert tracer_module.STRICT_SKIM
    groups = _groups(model, x)
    assert made[0].skipped == 1 and made[0].stopped  # the skim ran, and stopped
    full, _ = run_traced(model, (x,), {}, HANDLERS, skim=False)
    assert groups == graph_frozen.summary(model, build_groups(full))
