"""Property: on random CNNs built from coupled blocks, compact(prune_channels(m)) computes what
the masked m computed; and the API's checks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint

ACTIVATIONS = {
    "relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu,
    "hardswish": F.hardswish, "softplus": F.softplus, "none": lambda x: x,
}  # fmt: skip


class Block(nn.Module):
    def __init__(self, kind: str, channels: int, act: str, norm: bool) -> None:
        super().__init__()
        self.kind, self.act = kind, ACTIVATIONS[act]
        half = channels // 2
        if kind == "conv" or kind == "residual":
            self.a = nn.Conv2d(channels, channels, 3, padding=1)
        elif kind == "cat":
            self.a, self.b = nn.Conv2d(channels, half, 1), nn.Conv2d(channels, half, 3, padding=1)
        elif kind == "chunk":
            self.a, self.b = nn.Conv2d(half, channels, 1), nn.Conv2d(half, channels, 1)
        elif kind == "grouped":
            self.a = nn.Conv2d(channels, channels, 3, padding=1, groups=2)
        else:  # depthwise
            self.a = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.norm = nn.BatchNorm2d(channels) if norm else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "residual":
            y = x + self.a(x)
        elif self.kind == "cat":
            y = torch.cat([self.a(x), self.b(x)], 1)
        elif self.kind == "chunk":
            left, right = x.chunk(2, dim=1)
            y = self.a(left) * torch.sigmoid(self.b(right))
        else:
            y = self.a(x)
        return self.act(self.norm(y))


class Net(nn.Module):
    def __init__(self, blocks: list[tuple[str, str, bool]], channels: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.Sequential(*(Block(k, channels, a, n) for k, a, n in blocks))
        self.head = nn.Linear(channels * 4, 5)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(F.relu(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(x, 2).flatten(1))


def _randomize_norms(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.5, 0.5)


block = st.tuples(
    st.sampled_from(["conv", "residual", "cat", "chunk", "grouped", "depthwise"]),
    st.sampled_from(sorted(ACTIVATIONS)),
    st.booleans(),
)


@settings(max_examples=20, deadline=None)
@given(
    blocks=st.lists(block, min_size=1, max_size=4),
    channels=st.sampled_from([4, 6, 8]),
    amount=st.floats(0.0, 0.9),
    criterion=st.sampled_from(["l1", "l2", "bn_scale"]),
    scope=st.sampled_from(["layer", "global"]),
    seed=st.integers(0, 2**16),
)
def test_compact_of_prune_channels_equals_the_masked_model(
    blocks: list[tuple[str, str, bool]],
    channels: int,
    amount: float,
    criterion: str,
    scope: str,
    seed: int,
) -> None:
    torch.manual_seed(seed)
    model = Net(blocks, channels)
    _randomize_norms(model)
    x = torch.randn(2, 3, 6, 6)
    pruned = prunekit.prune_channels(model, x, amount, criterion=criterion, scope=scope)
    model.eval()
    with torch.no_grad():
        masked = model(x)
    report = prunekit.compact(model, x, latency_runs=0)
    with torch.no_grad():
        out = model(x)
    assert float((out - masked).abs().max()) <= 1e-5 * max(float(masked.abs().max()), 1e-6)
    assert report.channels == sum(len(p.units) for p in pruned)
    removed = sum(p.numel() for p in model.parameters())
    assert removed == report.params_after <= report.params_before
    assert (report.params_after < report.params_before) == (report.channels > 0)


def _small() -> tuple[nn.Module, Tensor]:
    return Net([("residual", "relu", True), ("cat", "relu", True)], 8), torch.randn(2, 3, 4, 4)


def test_masks_are_prunekit_masks_that_report_and_remove_see() -> None:
    model, x = _small()
    prunekit.prune_channels(model, x, 0.5)
    found = prunekit.report(model)
    assert found["stem.weight"].masked and found["stem.weight"].method == "CustomFromMask"
    assert found["stem.weight"].sparsity == 0.5  # 4 of 8 whole filters
    mask = model.stem.weight_mask
    assert bool((mask.flatten(1).sum(1) == 0).sum() == 4) and bool(
        mask.flatten(1).all(1).sum() == 4
    )
    prunekit.remove(model.stem, "weight")
    assert "weight_mask" not in dict(model.stem.named_buffers())


def test_pruning_again_to_the_same_amount_changes_nothing() -> None:
    model, x = _small()
    prunekit.prune_channels(model, x, 0.5)
    masks = {k: v.clone() for k, v in model.state_dict().items() if k.endswith("_mask")}
    prunekit.prune_channels(model, x, 0.5)
    after = {k: v for k, v in model.state_dict().items() if k.endswith("_mask")}
    assert all(torch.equal(masks[k], after[k]) for k in masks)


def test_ignore_and_round_to() -> None:
    model, x = _small()
    chosen = prunekit.prune_channels(model, x, 0.3, ignore=["blocks.1.a"], round_to=4)
    names = {p.group.name for p in chosen}
    assert not any("blocks.1.a" in n for n in names)
    for p in chosen:
        assert (p.group.size - len(p.units)) % 4 == 0 or p.group.size - len(p.units) == p.group.size


def test_taylor_needs_gradients_and_uses_them() -> None:
    model, x = _small()
    with pytest.raises(ValueError, match=r"taylor.*no \.grad.*backward"):
        prunekit.prune_channels(model, x, 0.5, criterion="taylor")
    assert not prunekit.is_pruned(model)
    model(x).square().sum().backward()
    assert prunekit.prune_channels(model, x, 0.5, criterion="taylor")


def test_a_criterion_of_ones_own() -> None:
    model, x = _small()
    seen: list[int] = []

    def by_index(group: prunekit.ChannelGroup) -> Tensor:
        seen.append(group.size)
        return -torch.arange(group.size, dtype=torch.float)  # the last units are the least

    chosen = prunekit.prune_channels(model, x, 0.5, criterion=by_index)
    assert seen and all(p.units == tuple(range(p.group.size - len(p.units), p.group.size))
                        for p in chosen)  # fmt: skip
    with pytest.raises(ValueError, match=r"returned \(1,\).*expected a tensor of shape"):
        prunekit.prune_channels(model, x, 0.5, criterion=lambda g: torch.zeros(1))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"amount": 1.0}, ValueError, r"amount=1\.0; expected a float in \[0, 1\)"),
        ({"amount": 3}, ValueError, "amount=3"),
        ({"amount": 0.5, "scope": "model"}, ValueError, "scope='model'"),
        ({"amount": 0.5, "criterion": "l3"}, ValueError, "criterion='l3'.*'l1'"),
        ({"amount": 0.5, "round_to": 0}, ValueError, "round_to=0"),
        ({"amount": 0.5, "ignore": ["nope*"]}, ValueError, "ignore='nope\\*' names no module"),
    ],
)
def test_bad_arguments_change_nothing(kwargs: dict, error: type, match: str) -> None:  # type: ignore[type-arg]
    model, x = _small()
    before = fingerprint(model)
    with pytest.raises(error, match=match):
        prunekit.prune_channels(model, x, **kwargs)
    assert fingerprint(model) == before


def test_bad_inputs_and_models() -> None:
    model, _ = _small()
    with pytest.raises(TypeError, match="example_inputs=str"):
        prunekit.channel_groups(model, "image")
    with pytest.raises(TypeError, match=r"no torch\.nn\.Module"):
        prunekit.compact(object(), torch.randn(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tolerance"):
        prunekit.compact(model, torch.randn(1, 3, 4, 4), tolerance=-1.0)


def test_a_tensorplay_model_is_refused_clearly() -> None:
    tp = pytest.importorskip("tensorplay")
    with pytest.raises(TypeError, match=r"TensorPlay module.*torch\.nn\.Module"):
        prunekit.channel_groups(tp.nn.Linear(2, 2), torch.randn(1, 2))


def test_compact_with_nothing_masked_is_a_no_op_that_reports() -> None:
    model, x = _small()
    twin = copy.deepcopy(model)
    report = prunekit.compact(model, x, latency_runs=1)
    assert report.channels == 0 and report.params_after == report.params_before
    assert report.latency_before_ms is not None and report.latency_after_ms is not None
    assert "removed 0 channels" in str(report)
    assert torch.equal(model.eval()(x), twin.eval()(x))
