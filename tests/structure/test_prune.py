"""Channel groups, prune_channels and compact on hand-built models, one coupling each."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint


def roundtrip(model: nn.Module, x: Any, amount: float = 0.5, **kwargs: Any) -> Any:
    """Prune channels, then compact; the compacted model computes what the masked one did."""
    prunekit.prune_channels(model, x, amount, **kwargs)
    model.eval()
    with torch.no_grad():
        masked = model(x)
    report = prunekit.compact(model, x, latency_runs=0)
    with torch.no_grad():
        compacted = model(x)
    assert compacted.shape == masked.shape
    assert float((compacted - masked).abs().max()) <= 1e-5 * float(masked.abs().max())
    return report


def by_name(groups: list[prunekit.ChannelGroup], name: str) -> prunekit.ChannelGroup:
    found = [g for g in groups if any(s.qualified == name and s.role == "out" for s in g.slices)]
    assert len(found) == 1, [str(g) for g in groups]
    return found[0]


def slice_of(group: prunekit.ChannelGroup, name: str, dim: int) -> prunekit.Slice:
    found = [s for s in group.slices if s.qualified == name and s.dim == dim]
    assert len(found) == 1, str(group)
    return found[0]


class Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 6, 3, padding=1)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        return self.fc(torch.flatten(F.relu(self.conv2(x)), 1))


def _trained_bn(model: nn.Module) -> nn.Module:
    """Non-trivial BatchNorm statistics and affine values, so dropping channels is visible."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._NormBase):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            if m.affine:
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.5, 0.5)
    return model


def test_chain_groups_norm_bias_and_flatten_into_linear() -> None:
    groups = prunekit.channel_groups(Chain(), torch.randn(2, 3, 4, 4))
    first = by_name(groups, "conv1.weight")
    assert first.prunable and first.size == 8
    names = {(s.qualified, s.dim, s.role) for s in first.slices}
    assert names == {
        ("conv1.weight", 0, "out"), ("conv1.bias", 0, "bias"), ("bn1.weight", 0, "norm"),
        ("bn1.bias", 0, "norm"), ("bn1.running_mean", 0, "buffer"),
        ("bn1.running_var", 0, "buffer"), ("conv2.weight", 1, "in"),
    }  # fmt: skip
    second = by_name(groups, "conv2.weight")
    # flatten: channel c feeds features 16c .. 16c+15 of fc
    assert slice_of(second, "fc.weight", 1).indices[2] == tuple(range(32, 48))
    last = by_name(groups, "fc.weight")
    assert not last.prunable and "output" in (last.reason or "")


def test_chain_compacts_exactly_and_updates_attributes() -> None:
    model = _trained_bn(Chain())
    report = roundtrip(model, torch.randn(4, 3, 4, 4), 0.5)
    assert (model.conv1.out_channels, model.bn1.num_features, model.conv2.in_channels) == (4, 4, 4)
    assert (model.conv2.out_channels, model.fc.in_features) == (3, 48)
    assert model.conv1.weight.shape == (4, 3, 3, 3) and model.bn1.running_mean.shape == (4,)
    assert report.params_after < report.params_before and report.channels == 7
    assert report.macs_after < report.macs_before


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 1)
        self.body = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        return self.head(F.relu(x + self.body(x)))


def test_residual_add_couples_both_producers() -> None:
    groups = prunekit.channel_groups(Residual(), torch.randn(1, 3, 5, 5))
    group = by_name(groups, "stem.weight")
    makers = {s.qualified for s in group.slices if s.role == "out"}
    assert makers == {"stem.weight", "body.weight"} and group.size == 8
    assert {s.qualified for s in group.slices if s.role == "in"} == {"body.weight", "head.weight"}
    roundtrip(Residual(), torch.randn(2, 3, 5, 5), 0.5)


class CatTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 2, 1)
        self.c = nn.Conv2d(10, 3, 1)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.sigmoid(self.a(x))
        return self.c(torch.cat([y, y, self.b(x)], 1))


def test_cat_of_one_tensor_twice_and_offsets() -> None:
    groups = prunekit.channel_groups(CatTwice(), torch.randn(1, 3, 3, 3))
    a, b = by_name(groups, "a.weight"), by_name(groups, "b.weight")
    assert slice_of(a, "c.weight", 1).indices == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert slice_of(b, "c.weight", 1).indices == ((8,), (9,))
    roundtrip(CatTwice(), torch.randn(2, 3, 3, 3), 0.5)


class Chunked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)
        self.left = nn.Conv2d(4, 2, 1)
        self.right = nn.Conv2d(4, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.conv(x).chunk(2, dim=1)
        return self.left(a) + self.right(b)


def test_chunk_keeps_its_pieces_equal() -> None:
    groups = prunekit.channel_groups(Chunked(), torch.randn(1, 3, 3, 3))
    group = by_name(groups, "conv.weight")
    assert group.size == 4  # channel j goes with channel j + 4
    assert slice_of(group, "conv.weight", 0).indices[1] == (1, 5)
    assert slice_of(group, "left.weight", 1).indices[1] == (1,)
    model = Chunked()
    roundtrip(model, torch.randn(2, 3, 3, 3), 0.5)
    assert model.conv.out_channels == 4 and model.left.in_channels == 2


class Grouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(3, 8, 1)
        self.bn = nn.BatchNorm2d(8)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.depthwise = nn.Conv2d(8, 16, 3, padding=1, groups=8)
        self.project = nn.Conv2d(16, 4, 1)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn(self.expand(x)))
        return self.project(F.relu6(self.depthwise(self.grouped(x))))


def test_grouped_and_depthwise_convs() -> None:
    groups = prunekit.channel_groups(Grouped(), torch.randn(1, 3, 5, 5))
    expand = by_name(groups, "expand.weight")
    assert expand.size == 4  # input j of each of the 2 groups goes together
    assert slice_of(expand, "expand.weight", 0).indices[0] == (0, 4)
    grouped = by_name(groups, "grouped.weight")
    assert grouped.size == 4
    assert slice_of(grouped, "depthwise.weight", 0).indices[0] == (0, 1, 8, 9)
    model = _trained_bn(Grouped())
    roundtrip(model, torch.randn(2, 3, 5, 5), 0.5)
    assert (model.grouped.in_channels, model.grouped.out_channels, model.grouped.groups) == (
        4,
        4,
        2,
    )
    assert (model.depthwise.in_channels, model.depthwise.groups) == (4, 4)
    assert model.depthwise.out_channels == 8 and model.project.in_channels == 8


class Unknown(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 6, 1)
        self.b = nn.Conv2d(3, 6, 1)
        self.c = nn.Conv2d(12, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        sorted_a = torch.sort(self.a(x), dim=1).values  # no handler: never assumed element-wise
        return self.c(torch.cat([sorted_a, F.relu(self.b(x))], 1))


def test_an_unknown_op_leaves_its_channels_alone_and_says_why() -> None:
    groups = prunekit.channel_groups(Unknown(), torch.randn(1, 3, 2, 2))
    a = by_name(groups, "a.weight")
    assert not a.prunable and "sort" in (a.reason or "") and "not an op" in (a.reason or "")
    assert by_name(groups, "b.weight").prunable
    model = Unknown()
    roundtrip(model, torch.randn(2, 3, 2, 2), 0.5)
    assert model.a.out_channels == 6 and model.b.out_channels == 3


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 1)
        self.gn = nn.GroupNorm(4, 8)
        self.prelu = nn.PReLU(8)
        self.c2 = nn.Conv2d(8, 6, 1)
        self.inorm = nn.InstanceNorm2d(6, affine=True)
        self.c3 = nn.Conv2d(6, 4, 1)
        self.ln = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = self.c2(self.prelu(self.gn(self.c1(x))))
        x = self.c3(F.softplus(self.inorm(x)))
        return self.fc(self.ln(x.mean((2, 3))))


def test_group_norm_units_instance_norm_prelu_and_layer_norm() -> None:
    groups = prunekit.channel_groups(Norms(), torch.randn(1, 3, 3, 3))
    c1 = by_name(groups, "c1.weight")
    assert c1.size == 4 and slice_of(c1, "gn.weight", 0).indices[0] == (0, 1)
    assert slice_of(c1, "prelu.weight", 0).indices[3] == (6, 7)
    assert slice_of(by_name(groups, "c2.weight"), "inorm.weight", 0).indices[1] == (1,)
    c3 = by_name(groups, "c3.weight")
    assert c3.prunable and c3.kind == "hidden"  # a LayerNorm over them: pruned by hidden=
    model = Norms()
    roundtrip(model, torch.randn(2, 3, 3, 3), 0.5)
    assert (model.gn.num_groups, model.gn.num_channels, model.prelu.num_parameters) == (2, 4, 4)
    assert model.inorm.num_features == 3 and model.c3.out_channels == 4


class Embedded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.fc1 = nn.Linear(8, 6)
        self.fc2 = nn.Linear(6, 2)

    def forward(self, ids: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(self.embed(ids))))


def test_embedding_columns_feed_the_linear() -> None:
    ids = torch.tensor([[1, 2, 3], [4, 5, 9]])
    group = by_name(prunekit.channel_groups(Embedded(), ids), "embed.weight")
    assert slice_of(group, "embed.weight", 1).indices[5] == (5,)
    assert slice_of(group, "fc1.weight", 1).role == "in"
    model = Embedded()
    roundtrip(model, ids, 0.5)
    assert model.embed.embedding_dim == 4 and model.fc1.in_features == 4


class SigmoidInto(nn.Module):
    def __init__(self, padding: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.next = nn.Conv2d(6, 4, 3, padding=padding)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        y = self.next(torch.sigmoid(self.conv(x)))
        return self.fc(F.softplus(y).mean((2, 3)))


def _mask_rows(module: nn.Module, rows: list[int]) -> None:
    """Mask whole output rows of a weight only (bias left as it is)."""
    mask = torch.ones_like(module.weight)
    mask[rows] = 0
    prunekit.custom_from_mask(module, "weight", mask)


def test_constants_of_removed_channels_are_folded_into_the_bias() -> None:
    model = SigmoidInto(padding=0).eval()
    _mask_rows(model.conv, [1, 4])  # sigmoid(bias) stays: a constant for next
    _mask_rows(model.next, [0])  # softplus(bias) stays: a constant for fc
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        masked = model(x)
    report = prunekit.compact(model, x, latency_runs=0)
    assert report.channels == 3 and model.next.in_channels == 4 and model.fc.in_features == 3
    with torch.no_grad():
        assert torch.allclose(model(x), masked, atol=1e-6)


def test_a_constant_into_a_zero_padded_conv_is_refused_and_nothing_changes() -> None:
    model = SigmoidInto(padding=1).eval()
    _mask_rows(model.conv, [1])
    x = torch.randn(1, 3, 5, 5)
    with torch.no_grad():
        model(x)  # the pruning hook's product, reused by later gradient-free forwards
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"next\.weight.*pads with zeros"):
        prunekit.compact(model, x, latency_runs=0)
    assert fingerprint(model) == before and model.conv.out_channels == 6


class HardCoded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.fc = nn.Linear(16, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.conv(x).reshape(-1, 16))  # 16 = 4 channels x 2 x 2, hard-coded


def test_compact_warns_of_layers_the_example_inputs_never_ran() -> None:
    class ByBatch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.big, self.small = nn.Linear(5, 8), nn.Linear(8, 2), nn.Linear(8, 2)

        def forward(self, x: Tensor) -> Tensor:
            y = F.relu(self.a(x))
            return self.big(y) if x.shape[0] > 2 else self.small(y)

    model, x = ByBatch(), torch.randn(4, 5)
    prunekit.prune_channels(model, x, 0.5)
    with pytest.warns(UserWarning, match=r"ByBatch: small never ran on the example inputs"):
        prunekit.compact(model, x, latency_runs=0)
    assert model.a.out_features == model.big.in_features == 4  # what did run is compacted
    assert model.small.in_features == 8


def test_a_failed_check_rolls_back() -> None:
    model = HardCoded()
    x = torch.randn(3, 3, 2, 2)
    prunekit.prune_channels(model, x, 0.5)
    with torch.no_grad():
        model(x)
    before = fingerprint(model)
    with pytest.raises(RuntimeError, match=r"forward failed.*restored"):
        prunekit.compact(model, x, latency_runs=0)
    assert fingerprint(model) == before and model.conv.out_channels == 4
    assert prunekit.is_pruned(model)


def test_moves_that_do_not_commute_are_blocked() -> None:
    class Moves(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 8, 1), nn.Conv2d(3, 8, 1), nn.Conv2d(3, 8, 1)

        def forward(self, x: Tensor) -> Tensor:
            shuffled = self.a(x).unflatten(1, (2, 4)).transpose(1, 2).flatten(1, 2)
            summed = self.c(x).permute(0, 2, 3, 1).sum(3, True).permute(0, 3, 1, 2)
            return torch.cat([shuffled, self.b(x)[:, :4], summed], 1)

    groups = prunekit.channel_groups(Moves(), torch.randn(1, 3, 2, 2))
    assert "splits the channels" in (by_name(groups, "a.weight").reason or "")
    assert "fixed positions" in (by_name(groups, "b.weight").reason or "")
    assert "reduces over them" in (by_name(groups, "c.weight").reason or "")


def test_a_parameter_used_elsewhere_blocks_its_group() -> None:
    class Reused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1)

        def forward(self, x: Tensor) -> Tensor:
            return self.b(self.a(x)) + self.a.bias.sum()

    group = by_name(prunekit.channel_groups(Reused(), torch.randn(1, 3, 2, 2)), "a.weight")
    assert "a.bias is also used by sum" in (group.reason or "")


class TiedPair(nn.Module):
    """`b` and `c` hold one weight; `d` is a depthwise conv on `c`'s channels, `bn` their norm."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 1)
        self.c = nn.Conv2d(8, 8, 1, bias=False)
        self.c.weight = self.b.weight
        self.d, self.e = nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 2, 1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.c(F.relu(self.b(F.relu(self.a(x))))))
        return self.e(F.relu(self.bn(self.d(x))))


@pytest.mark.parametrize("excluded", ["c", "d", "bn"])
def test_exclude_keeps_the_channels_a_tied_depthwise_or_norm_layer_outputs(excluded: str) -> None:
    model, x = TiedPair(), torch.randn(2, 3, 4, 4)
    group = by_name(prunekit.channel_groups(model, x), "a.weight")
    assert group.prunable and group.size == 8  # c (through b's weight), d and bn output them
    assert not prunekit.prune_channels(model, x, 0.5, exclude=[excluded])
    assert not prunekit.is_pruned(model)
    roundtrip(model, x, 0.5)  # without the exclusion they go
    assert model.c.out_channels == model.d.out_channels == model.bn.num_features == 4


@pytest.mark.parametrize("by_name", [False, True])
def test_exclude_of_a_block_keeps_the_channels_its_layers_output(by_name: bool) -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 1), nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)),
        nn.ReLU(), nn.Conv2d(8, 2, 1),
    )  # fmt: skip
    excluded = "1" if by_name else model[1]
    chosen = prunekit.prune_channels(model, torch.randn(2, 3, 4, 4), 0.5, exclude=[excluded])
    assert [p.group.name for p in chosen] == ["0.weight"]
    assert not prunekit.is_pruned(model[1][1])
    assert bool(model[1][0].weight_mask.flatten(1).any(1).all())  # only its input columns go


def test_parameters_combined_in_forward_are_sliced() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 6, 1)
            self.scale = nn.Parameter(torch.rand(6, 1, 1) + 0.5)
            self.shift = nn.Parameter(torch.rand(1, 6, 1, 1))
            self.head = nn.Conv2d(6, 2, 1)

        def forward(self, x: Tensor) -> Tensor:
            return self.head(self.scale * self.conv(x) + self.shift)

    group = by_name(prunekit.channel_groups(Scaled(), torch.randn(1, 3, 2, 2)), "conv.weight")
    assert slice_of(group, "scale", 0).indices[2] == (2,)
    assert slice_of(group, "shift", 1).indices[2] == (2,)
    model = Scaled()
    roundtrip(model, torch.randn(2, 3, 2, 2), 0.5)
    assert model.scale.shape == (3, 1, 1) and model.shift.shape == (1, 3, 1, 1)


def test_attention_is_traced_by_module_and_an_unknown_one_is_left_alone() -> None:
    class Attend(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 8)
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x: Tensor) -> Tensor:
            y = self.proj(x)
            return self.attn(y, y, y)[0]

    class Handmade(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 8)

        def forward(self, x: Tensor) -> Tensor:
            y = self.proj(x)
            return torch.softmax(y @ y.transpose(1, 2), -1) @ y

    groups = prunekit.channel_groups(Attend(), torch.randn(2, 3, 4))
    assert by_name(groups, "proj.weight").prunable  # read by in_proj_weight's columns
    heads = [g for g in groups if g.kind == "heads"]
    assert len(heads) == 1 and heads[0].size == 2 and heads[0].prunable
    groups = prunekit.channel_groups(Handmade(), torch.randn(2, 3, 4))
    assert "matmul" in (by_name(groups, "proj.weight").reason or "")


def test_a_pruned_model_traces_to_the_same_groups() -> None:
    model, x = _trained_bn(Grouped()), torch.randn(1, 3, 5, 5)
    before = [(g.name, g.size, g.prunable) for g in prunekit.channel_groups(model, x)]
    prunekit.prune_channels(model, x, 0.5)
    assert [(g.name, g.size, g.prunable) for g in prunekit.channel_groups(model, x)] == before


class Widths(nn.Module):
    """Two candidate groups: a.weight of 16 channels and b.weight of 64."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 64), nn.Linear(64, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


@pytest.mark.parametrize(
    ("options", "rule", "removed"),
    [({"amount": 0.25, "round_to": 8}, "amount=0.25 removes nothing from a.weight: 0.25 of 16 "
      "channels rounds down to 0 under round_to=8;", [("b.weight", 16)]),
     ({"amount": 0.5, "round_to": 16}, "amount=0.5 removes nothing from a.weight: 0.5 of 16 "
      "channels rounds down to 0 under round_to=16 (at or above its width);",
      [("b.weight", 32)]),
     ({"amount": 0.02}, "amount=0.02 removes nothing from a.weight: 0.02 of 16 channels "
      "rounds to 0;", [("b.weight", 1)]),
     ({"amount": 0.1, "round_to": 64}, "amount=0.1 removes nothing from a.weight: 0.1 of 16 "
      "channels rounds down to 0 under round_to=64 (at or above its width); so do 1 more "
      "group", []),
     ({"amount": 0.03, "scope": "global", "round_to": 8}, "amount=0.03 removes nothing from "
      "the 2 groups of channels: 0.03 of their 80 channels rounds down to 0 under round_to=8;",
      []),
     ({"amount": 0.005, "scope": "global"}, "amount=0.005 removes nothing from the 2 groups "
      "of channels: 0.005 of their 80 channels rounds to 0;", [])],
)  # fmt: skip
def test_a_share_that_rounds_to_nothing_warns_once_naming_the_group_and_the_rule(
    options: dict[str, Any], rule: str, removed: list[tuple[str, int]]
) -> None:
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning) as caught:
        found = prunekit.prune_channels(Widths(), x, **options)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and said[0].startswith("prune_channels: " + rule), said
    hint = "a larger share or a smaller round_to removes some" if "under" in rule else (
        "a larger share removes some")  # fmt: skip
    assert said[0].endswith(hint)
    assert caught[0].filename == __file__
    assert [(p.group.name, len(p.units)) for p in found] == removed


class Widened(nn.Module):
    """A residual block with an inner width of its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, width), nn.Linear(width, 16)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Blocks(nn.Module):
    """Three blocks of inner widths 8, 8 and 32, then a head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Widened(8), Widened(8), Widened(32)])
        self.head = nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_a_share_that_rounds_to_nothing_in_several_blocks_warns_once_per_call() -> None:
    """Compensated block by block (each block calibrated on the outputs of the one before),
    a share that rounds to nothing in blocks 0 and 1 is said once, for the whole call."""
    model = Blocks()
    batches = [torch.randn(20, 16) for _ in range(2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = prunekit.prune_channels(model, batches[0], 0.25, round_to=8, compensate=True,
                                        calibration=batches)  # fmt: skip
    said = [str(w.message) for w in caught]
    assert said == [
        "prune_channels: amount=0.25 removes nothing from blocks.0.up.weight: 0.25 of 8 "
        "channels rounds down to 0 under round_to=8 (at or above its width); so do 1 more "
        "group; a larger share or a smaller round_to removes some"
    ]
    assert [(p.group.name, len(p.units)) for p in found] == [("blocks.2.up.weight", 8)]


def test_shares_that_remove_something_from_every_group_say_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = prunekit.prune_channels(Widths(), torch.randn(4, 8), 0.5, round_to=8)
        assert [len(p.units) for p in found] == [8, 32]
        assert prunekit.prune_channels(Widths(), torch.randn(4, 8), 0.0) == []


def test_query_heads_a_share_rounds_to_none_of_per_key_value_group_warn() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                                      intermediate_size=40, max_position_embeddings=32)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    ids = {"input_ids": torch.randint(0, 100, (2, 7))}
    with pytest.warns(UserWarning, match=r"^prune_channels: heads=0\.1 removes nothing from "
                      r"model\.layers\.0\.self_attn\.q_proj\.weight: 0\.1 of 4 query heads per "
                      r"key/value group rounds to 0; a larger share removes some$"):  # fmt: skip
        found = prunekit.prune_channels(model, ids, 0.0, heads=0.1)
    assert found == []
