"""Group criteria from calibration batches: 'activation' (|W| x input norm of each consumer
column) and 'taylor' (|sum of w x grad| per batch, summed), checked against hand computations;
GroupCriterion objects; arguments refused before anything changes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint
from prunekit.structure import Activation, GroupCriterion, GroupTaylor


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


def hidden_group(model: nn.Module, x: Tensor) -> prunekit.ChannelGroup:
    groups = [g for g in prunekit.channel_groups(model, x) if g.prunable]
    assert len(groups) == 1 and groups[0].size == 6
    return groups[0]


def test_activation_scores_are_input_norms_times_consumer_columns() -> None:
    model, x = mlp(), torch.randn(2, 4)
    batches = [torch.randn(5, 4), torch.randn(3, 4)]
    criterion = Activation()
    group = hidden_group(model, x)
    criterion.prepare(model, [group], batches, None)
    with torch.no_grad():
        inner = torch.relu(model[0](torch.cat(batches))).double()
    expected = inner.square().sum(0).sqrt() * model[2].weight.detach().double().abs().sum(0)
    torch.testing.assert_close(criterion.scores(group), expected)


def test_activation_prunes_what_the_data_does_not_use_where_l2_does_not() -> None:
    model, x = mlp(), torch.randn(2, 4)
    with torch.no_grad():
        model[0].weight[:3] *= 10  # large weights ...
        model[0].bias[:3] = -100.0  # ... whose unit never fires on these inputs
    batches = [torch.randn(8, 4) for _ in range(2)]
    by_l2 = prunekit.prune_channels(copy.deepcopy(model), x, 0.5, criterion="l2")
    by_data = prunekit.prune_channels(model, x, 0.5, criterion="activation", calibration=batches)
    assert by_l2[0].units != (0, 1, 2)
    assert by_data[0].units == (0, 1, 2)
    assert not bool(model[2].weight_mask[:, :3].any())


def test_activation_for_convolutions_grouped_too() -> None:
    class Convs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, padding=1)
            self.b = nn.Conv2d(8, 4, 3, padding=1, groups=2)
            self.head = nn.Linear(4, 2)

        def forward(self, x: Tensor) -> Tensor:
            return self.head(self.b(torch.relu(self.a(x))).mean((2, 3)))

    model, x = Convs(), torch.randn(1, 3, 5, 5)
    batches = [torch.randn(2, 3, 5, 5), torch.randn(1, 3, 5, 5)]
    group = prunekit.channel_groups(model, x)[0]  # unit u: channel u of each group of b
    assert group.name == "a.weight" and group.size == 4
    criterion = Activation()
    criterion.prepare(model, [group], batches, None)
    with torch.no_grad():
        inner = torch.cat([torch.relu(model.a(b)) for b in batches]).double()
    norms = inner.square().sum((0, 2, 3)).sqrt()  # per input channel of b
    columns = model.b.weight.detach().double().abs().sum((2, 3))  # (4 out, 4 per group)
    # channel c is read by the 2 output rows of its group, column c % 4
    reads = torch.stack([columns[2 * (c // 4) : 2 * (c // 4) + 2, c % 4].sum() for c in range(8)])
    torch.testing.assert_close(criterion.scores(group), (norms * reads).reshape(2, 4).sum(0))


def test_taylor_from_batches_sums_each_batchs_absolute_group_sum() -> None:
    model, x = mlp(), torch.randn(2, 4)
    batches = [torch.randn(5, 4), torch.randn(3, 4)]

    def loss(output: Tensor, batch: Any) -> Tensor:
        return (output - 1).square().mean()

    expected = torch.zeros(6, dtype=torch.float64)
    for batch in batches:
        twin = copy.deepcopy(model)
        loss(twin(batch), batch).backward()
        first, second = twin[0], twin[2]
        per_unit = (first.weight * first.weight.grad).sum(1) + first.bias * first.bias.grad
        per_unit = per_unit + (second.weight * second.weight.grad).sum(0)
        expected += per_unit.detach().double().abs()
    model[0].weight.grad = grad = torch.ones(6, 4)
    flags = [p.requires_grad for p in model.parameters()]
    criterion = GroupTaylor()
    group = hidden_group(model, x)
    criterion.prepare(model, [group], batches, loss)
    torch.testing.assert_close(criterion.scores(group), expected)
    assert model[0].weight.grad is grad and [p.requires_grad for p in model.parameters()] == flags
    assert model[2].weight.grad is None


def test_taylor_through_prune_channels_and_its_default_loss() -> None:
    model, x = mlp(), torch.randn(2, 4)
    batches = [torch.randn(4, 4)]
    with pytest.raises(ValueError, match=r"taylor.*output has no \.loss.*loss=lambda"):
        prunekit.prune_channels(model, x, 0.5, criterion="taylor", calibration=batches)
    found = prunekit.prune_channels(
        model, x, 0.5, criterion="taylor", calibration=batches, loss=lambda out, _: out.sum()
    )
    assert len(found[0].units) == 3


def test_a_group_criterion_of_ones_own_gets_the_batches() -> None:
    class Last(GroupCriterion):
        calibrated = True

        def prepare(self, model: nn.Module, groups: Any, batches: Any, loss: Any) -> None:
            self.seen = len(batches)

        def scores(self, group: prunekit.ChannelGroup) -> Tensor:
            return torch.arange(group.size, 0, -1, dtype=torch.float64)  # the last units go

    criterion = Last()
    model, x = mlp(), torch.randn(2, 4)
    found = prunekit.prune_channels(model, x, 0.5, criterion=criterion, calibration=[x, x, x])
    assert criterion.seen == 3 and found[0].units == (3, 4, 5)
    assert prunekit.GroupCriterion is GroupCriterion


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"criterion": "activation"}, ValueError, r"Activation\(\) needs calibration data"),
        ({"criterion": "l2", "calibration": [torch.randn(2, 4)]}, ValueError,
         r"WeightNorm\(p=2\) uses no calibration data"),
        ({"criterion": "activation", "calibration": [torch.randn(2, 4)], "loss": len},
         ValueError, r"loss is for criterion='taylor'"),
        ({"criterion": "activation", "calibration": torch.randn(2, 4)}, TypeError,
         r"invalid calibration of type Tensor"),
        ({"criterion": "activation", "calibration": []}, ValueError, "holds no batch"),
        ({"criterion": "activation", "calibration": [torch.randn(2, 5)]}, ValueError,
         r"cannot take batch 0"),
        ({"criterion": "wanda"}, ValueError, r"unknown criterion='wanda'.*'activation'"),
        ({"criterion": 3}, TypeError, r"invalid criterion=3"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_and_nothing_changes(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    model, x = mlp(), torch.randn(2, 4)
    before = fingerprint(model)
    with pytest.raises(error, match=match):
        prunekit.prune_channels(model, x, 0.5, **options)
    assert fingerprint(model) == before


@pytest.mark.parametrize(
    ("loss", "found"),
    [
        (lambda out, _: out, r"a tensor of shape \(4, 3\)"),
        (lambda out, _: out.sum().long(), "a tensor of dtype torch.int64"),
        (lambda out, _: out.sum().detach(), r"a tensor that does not require grad \(detached.*\)"),
        (lambda out, _: 3.0, r"a float \(3\.0\)"),
    ],
)
def test_a_loss_no_gradient_can_flow_from_is_named(loss: Any, found: str) -> None:
    model, x = mlp(), torch.randn(2, 4)
    before = fingerprint(model)
    expected = rf"loss\(output, batch\) returned {found} on batch 0.*scalar floating tensor"
    with pytest.raises(ValueError, match=expected + ".*requires grad"):
        prunekit.prune_channels(
            model, x, 0.5, criterion="taylor", calibration=[torch.randn(4, 4)], loss=loss
        )
    assert fingerprint(model) == before
