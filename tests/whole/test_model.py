"""prune_model: a whole model by parameter names, MultiheadAttention and tied weights included."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
from helpers import distributed_calibration
from helpers.attention_block import Block, train_and_compare
from helpers.frameworks import Framework
from helpers.model_state import fingerprint as state_of


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 4))


class Tied(nn.Module):
    """A language model's shape: the output layer shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.relu(self.body(self.embed(ids))))
        return out


def masks(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if k.endswith("_mask")}


def test_layer_scope_is_one_call_per_weight() -> None:
    model = mlp()
    twin = copy.deepcopy(model)
    found = prune.prune_model(model, 0.5)
    prune.l1_unstructured(twin[0], "weight", 0.5)
    prune.l1_unstructured(twin[3], "weight", 0.5)
    assert masks(model).keys() == masks(twin).keys() == {"0.weight_mask", "3.weight_mask"}
    for key, mask in masks(twin).items():
        assert torch.equal(masks(model)[key], mask)
    assert isinstance(found, prune.Report)
    assert found["0.weight"].sparsity == 0.5 and found["0.weight"].method == "L1Unstructured(0.5)"
    assert not found["0.bias"].masked and not found["1.weight"].masked  # biases, norms


def test_global_scope_ranks_all_selected_tensors_together() -> None:
    model = mlp()
    twin = copy.deepcopy(model)
    prune.prune_model(model, 100, scope="global")
    prune.global_unstructured(
        [(twin[0], "weight"), (twin[3], "weight")], prune.L1Unstructured, amount=100
    )
    for key, mask in masks(twin).items():
        assert torch.equal(masks(model)[key], mask)
    assert sum(int((m == 0).sum()) for m in masks(model).values()) == 100


@pytest.mark.parametrize("method", ["random", "ln"])
def test_other_methods(method: str) -> None:
    model = mlp()
    prune.prune_model(model, 0.5, method=method)
    mask = model[0].weight_mask
    assert int((mask == 0).sum()) == 256
    if method == "ln":  # whole output channels
        assert sorted(set(mask.sum(dim=1).tolist())) == [0.0, 16.0]


def test_include_globs_narrow_exact_names_add_and_exclude_leaves_out() -> None:
    model = mlp()
    found = prune.prune_model(model, 0.5, include=("0.*", "1.weight", "1.bias"), exclude="1.bias")
    assert [r.name for r in found.rows if r.masked] == ["0.weight", "1.weight"]
    other = mlp()
    found = prune.prune_model(other, 0.5, exclude=["3.*"])
    assert [r.name for r in found.rows if r.masked] == ["0.weight"]


def test_pruning_again_prunes_further() -> None:
    model = mlp()
    prune.prune_model(model, 0.5)
    found = prune.prune_model(model, 0.5)
    assert found["0.weight"].sparsity == 0.75
    assert found["0.weight"].method == "L1Unstructured(0.5) x2"
    found = prune.prune_model(model, 0.5, include="0.weight")  # the name, not 0.weight_orig
    assert found["0.weight"].sparsity == 0.875 and found["3.weight"].sparsity == 0.75


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_multihead_attention_trains_correctly(scope: str) -> None:
    model = Block()
    found = prune.prune_model(model, 0.3, scope=scope)
    assert {r.name for r in found.rows if r.masked} == {
        "attn.in_proj_weight",
        "attn.out_proj.weight",
        "ff.weight",
    }
    # out_proj is pruned through the attention module, which refreshes it on each call
    assert any(
        type(h).__name__ == "RefreshSubmodule" for h in model.attn._forward_pre_hooks.values()
    )
    train_and_compare(model)


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_tied_weights_are_pruned_once_and_masked_under_every_name(scope: str) -> None:
    model = Tied()
    found = prune.prune_model(model, 40, scope=scope)
    embed, head = model.embed, model.head
    assert embed.weight_orig is head.weight_orig  # still one Parameter
    assert torch.equal(embed.weight_mask, head.weight_mask)
    assert torch.equal(embed.weight, head.weight)
    tied_zeros = int((embed.weight_mask == 0).sum())
    body_zeros = int((model.body.weight_mask == 0).sum())
    assert tied_zeros + body_zeros == 40 if scope == "global" else tied_zeros == body_zeros == 40
    assert len(list(model.parameters())) == 3  # the tie, body.weight, body.bias
    assert [r.name for r in found.rows if r.masked] == ["embed.weight", "body.weight"]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.randint(0, 20, (4, 3))
    for _ in range(2):
        opt.zero_grad()
        model(ids).square().mean().backward()
        opt.step()
        assert torch.equal(embed.weight, head.weight)
        assert not embed.weight_orig.grad[embed.weight_mask == 0].any()
    for name in ("embed.weight", "head.weight", "body.weight"):
        prune.remove(model, name)
    assert model.head.weight is model.embed.weight
    assert not prune.is_pruned(model)


def test_tied_weights_must_be_selected_under_all_names_or_none() -> None:
    model = Tied()
    before = state_of(model)
    with pytest.raises(ValueError, match=r"'embed.weight', 'head.weight' are one Parameter"):
        prune.prune_model(model, 0.5, exclude="head.*")
    assert state_of(model) == before


def test_a_shared_module_is_pruned_once() -> None:
    shared = nn.Linear(8, 8)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    found = prune.prune_model(model, 0.5, include="2.weight")  # its second name will do
    assert found["0.weight"].sparsity == 0.5
    assert len(shared._forward_pre_hooks) == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"amount": 1.5}, ValueError, r"prune_model: .*amount=1.5"),
        ({"amount": "half"}, TypeError, r"prune_model: .*amount='half'"),
        ({"amount": 0.5, "method": "l2"}, ValueError, r"method='l2'.*l1, random, ln"),
        ({"amount": 0.5, "scope": "local"}, ValueError, r"scope='local'.*'layer'.*'global'"),
        ({"amount": 0.5, "method": "ln", "scope": "global"}, ValueError, r"method='ln'.*'layer'"),
        ({"amount": 0.5, "include": ("enc.*",)}, ValueError, r"'enc.\*' matches no .*0.weight"),
        ({"amount": 0.5, "include": [3]}, TypeError, r"include=\[3\].*globs"),
        ({"amount": 0.5, "exclude": "*"}, ValueError, r"no tensor left"),
        ({"amount": 17}, ValueError, r"'3.weight'|amount=17 is more than"),  # 3.weight has 128
    ],
)
def test_bad_arguments_leave_the_model_unchanged(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.ReLU(), nn.Linear(4, 4))
    prune.l1_unstructured(model[0], "weight", 0.5)
    before = state_of(model)
    with pytest.raises(error, match=match):
        prune.prune_model(model, **kwargs)
    assert state_of(model) == before


def test_a_failure_midway_undoes_the_earlier_tensors() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))  # 64 and 16 weights
    before = state_of(model)
    with pytest.raises(ValueError, match="amount=20"):
        prune.prune_model(model, 20)  # fits the first weight, not the second
    assert state_of(model) == before
    assert not prune.is_pruned(model)


def test_not_a_model() -> None:
    with pytest.raises(TypeError, match="prune_model: invalid model of type dict"):
        prune.prune_model({"weight": torch.ones(2, 2)}, 0.5)  # type: ignore[arg-type]


def test_tensorplay_model() -> None:
    tp = Framework("tensorplay")
    model = tp.nn.Sequential(tp.nn.Linear(16, 32), tp.nn.ReLU(), tp.nn.Linear(32, 4))
    found = prune.prune_model(model, 0.5, scope="global")
    assert [r.name for r in found.rows if r.masked] == ["0.weight", "2.weight"]
    assert found.zeros == 320


def test_a_tied_model_pruned_loads_into_a_fresh_one() -> None:
    model = Tied()
    prune.prune_model(model, 0.5)
    fresh = Tied()
    prune.load_pruned_state_dict(fresh, model.state_dict())
    assert fresh.embed.weight_orig is fresh.head.weight_orig
    ids = torch.randint(0, 20, (3, 4))
    assert torch.equal(fresh(ids), model(ids))


@pytest.mark.parametrize(
    ("options", "first"),
    [
        ({}, 1),
        ({"pattern": "2:4"}, 1),
        ({"pattern": "row"}, 1),
        ({"method": "wanda", "calibration": [torch.ones(3, 4)]}, 1),
        # The NaN makes the gradients of the layer before it NaN: that one fails first.
        ({"method": "taylor", "calibration": [torch.ones(3, 4)], "loss": lambda y, _: y.sum()}, 0),
    ],
    ids=["l1", "l1 2:4", "l1 row", "wanda", "taylor"],
)
def test_an_error_on_one_weight_names_its_path(options: dict[str, Any], first: int) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    path = rf"^'{first}\.weight': parameter 'weight' of Linear: .*(nan|NaN)"
    with pytest.raises(ValueError, match=path):
        prune.prune_model(model, 0.5, **options)
    assert not prune.is_pruned(model)


def nan_data() -> list[torch.Tensor]:
    batch = torch.ones(3, 4)
    batch[0, 0] = float("nan")
    return [batch]


@pytest.mark.parametrize(
    ("options", "nan_in", "first"),
    [
        ({}, "weight", "1.1"),
        ({"method": "wanda", "sequential": False}, "weight", "1.1"),
        ({"method": "wanda", "sequential": False}, "data", "0"),
        # The NaN makes the gradients of the layer before it NaN: that one fails first.
        ({"method": "taylor", "loss": lambda y, _: y.sum()}, "weight", "0"),
        ({"method": "taylor", "loss": lambda y, _: y.sum()}, "data", "0"),
    ],
    ids=["l1", "wanda", "wanda data", "taylor", "taylor data"],
)
def test_an_error_on_one_weight_names_its_path_in_global_scope(
    options: dict[str, Any], nan_in: str, first: str
) -> None:
    """All tensors rank together, yet the one whose scores cannot be ranked is named by its
    path in the model, as in scope 'layer'; the model is left as it was."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Identity(), nn.Linear(4, 4)))
    if nan_in == "weight":
        with torch.no_grad():
            model[1][1].weight[0, 0] = float("nan")
    if "method" in options:
        options = {**options, "calibration": nan_data() if nan_in == "data" else [torch.ones(3, 4)]}
    before = state_of(model)
    path = rf"'{re.escape(first)}\.weight', parameter 'weight' of Linear: the scores .*(nan|NaN)"
    with pytest.raises(ValueError, match=path):
        prune.prune_model(model, 0.5, scope="global", **options)
    assert state_of(model) == before


@pytest.mark.parametrize(
    ("value", "pattern", "sequential"),
    [
        (float("nan"), "unstructured", "layers"),
        (float("inf"), "2:4", False),
        (-float("inf"), "row", True),
    ],
)
def test_sparsegpt_refuses_a_weight_that_is_not_finite(
    value: float, pattern: str, sequential: bool | str
) -> None:
    """Its updates would spread the value over the row's other entries (as the scores of
    l1 or Wanda, it cannot be ranked); entries pruned before do not count."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    prune.l1_unstructured(model[2], "weight", 0.25)
    with torch.no_grad():
        model[2].weight_orig[model[2].weight_mask == 0] = float("nan")
        model[2].weight_orig[1, 3] = value
        model[2].weight_mask[1, 3] = 1
    before = state_of(model)
    batches = [torch.randn(4, 8)]
    with pytest.raises(ValueError, match=rf"'2\.weight'.* 1 value.*{value} at index \(1, 3\)"):
        prune.prune_model(
            model,
            0.5,
            method="sparsegpt",
            pattern=pattern,
            sequential=sequential,
            calibration=batches,
        )
    assert state_of(model) == before


def test_sparsegpt_calibrates_layer_group_by_group_unless_told_otherwise() -> None:
    """sequential's default is the method's own: 'layers' for SparseGPT (each group of a
    block's layers on the outputs of the groups pruned before it), True for Wanda."""
    data = distributed_calibration.batches(0, 1)

    def pruned(method: str, **sequential: Any) -> dict[str, torch.Tensor]:
        model = distributed_calibration.build()
        prune.prune_model(model, 0.5, method=method, calibration=data, **sequential)
        return {k: v for k, v in model.state_dict().items() if k.endswith(("_mask", "_orig"))}

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    default = pruned("sparsegpt")
    assert same(default, pruned("sparsegpt", sequential="layers"))
    assert not same(default, pruned("sparsegpt", sequential=True))
    assert same(pruned("wanda"), pruned("wanda", sequential=True))


def test_global_scope_errors_name_prune_model_not_an_inner_function() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    before = state_of(model)
    with pytest.raises(ValueError, match=r"^prune_model: .*amount=100 is more than the 32"):
        prune.prune_model(model, 100, scope="global")
    assert state_of(model) == before
