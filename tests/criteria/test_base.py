"""The criterion x pattern protocol: a criterion written outside the package keeps the
patterns' fast selection, global pruning included, and composes like the built-ins."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit as prune


class Scaled(prune.Criterion):
    """|w| times a per-module factor: a criterion that ranks by what it knows per module."""

    by_magnitude = True

    def __init__(self, factors: dict[nn.Module, float]) -> None:
        self.factors = factors
        self.calls = 0

    def scores(self, values: Tensor, target: Any = None) -> Tensor:
        self.calls += 1
        module = target[0] if target is not None else None
        return values * self.factors.get(module, 1.0)  # type: ignore[arg-type]


def _layers(seed: int) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(512, 384), nn.Linear(384, 256), nn.Linear(256, 300)]  # > 2**18 weights


def _masks(layers: list[nn.Linear]) -> list[Tensor]:
    return [layer.weight_mask.clone() for layer in layers]


@pytest.mark.parametrize("amount", [0.3, 0.7, 12345])
def test_global_pruning_with_an_outside_criterion_keeps_the_one_pass(
    amount: float, one_pass: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, reference = _layers(0), _layers(0)
    factors = {m: f for m, f in zip(ours, (0.5, 2.0, 1.0), strict=True)}
    criterion = Scaled(factors)
    concatenated: list[int] = []
    real_cat = torch.cat

    def cat(tensors: Any, *args: Any, **kwargs: Any) -> Tensor:
        concatenated.append(sum(t.numel() for t in tensors))
        return real_cat(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "cat", cat)
    prune.global_unstructured(
        [(m, "weight") for m in ours], prune.Pruning, amount=amount, criterion=criterion
    )
    monkeypatch.setattr(torch, "cat", real_cat)
    assert one_pass and all(one_pass)  # the sampled guess held: one pass over the scores
    total = sum(m.weight.numel() for m in ours)
    assert all(n < total // 4 for n in concatenated)  # never the model, nor a large part
    assert criterion.calls >= len(ours)

    factor = zip(reference, (0.5, 2.0, 1.0), strict=True)
    scores = {(m, "weight"): m.weight.detach() * f for m, f in factor}
    prune.global_unstructured(
        [(m, "weight") for m in reference],
        prune.L1Unstructured,
        amount=amount,
        importance_scores=scores,
    )
    for got, expected in zip(_masks(ours), _masks(reference), strict=True):
        assert torch.equal(got, expected)


def test_an_outside_criterion_in_apply_and_in_a_container_matches_importance_scores() -> None:
    ours, reference = nn.Linear(40, 30), nn.Linear(40, 30)
    reference.load_state_dict(ours.state_dict())
    criterion = Scaled({ours: 3.0})
    prune.Pruning.apply(ours, "weight", amount=0.4, criterion=criterion)
    prune.l1_unstructured(reference, "weight", 0.4, importance_scores=reference.weight * 3.0)
    assert torch.equal(ours.weight_mask, reference.weight_mask)
    # A second pruning ranks only the entries still alive, as L1Unstructured does.
    prune.Pruning.apply(ours, "weight", amount=0.5, criterion=criterion)
    prune.l1_unstructured(
        reference, "weight", 0.5, importance_scores=reference.weight_orig.detach() * 3.0
    )
    assert torch.equal(ours.weight_mask, reference.weight_mask)
    assert int((ours.weight_mask == 0).sum()) == 480 + 360


def test_channels_pattern_with_an_outside_criterion_matches_ln_structured() -> None:
    ours, reference = nn.Conv2d(8, 16, 3), nn.Conv2d(8, 16, 3)
    reference.load_state_dict(ours.state_dict())
    pattern = prune.Channels(dim=0, norm=1)
    prune.Pruning.apply(ours, "weight", 5, criterion=Scaled({ours: 2.0}), pattern=pattern)
    prune.ln_structured(reference, "weight", 5, 1, 0, importance_scores=reference.weight * 2.0)
    assert torch.equal(ours.weight_mask, reference.weight_mask)
    assert ours._forward_pre_hooks[next(iter(ours._forward_pre_hooks))].PRUNING_TYPE == (
        "structured"
    )


def test_the_built_in_methods_are_criterion_times_pattern() -> None:
    l1 = prune.L1Unstructured(0.2)
    assert isinstance(l1.criterion, prune.Magnitude) and isinstance(l1.pattern, prune.Unstructured)
    ln = prune.LnStructured(0.2, n=1, dim=1)
    assert isinstance(ln.pattern, prune.Channels) and (ln.pattern.dim, ln.pattern.norm) == (1, 1)
    assert (ln.dim, ln.n, ln.amount) == (1, 1, 0.2)
    assert isinstance(prune.RandomStructured(1, dim=0).criterion, prune.Random)
    assert prune.methods.METHODS["ln"] is prune.LnStructured


def test_a_criterion_whose_scores_have_the_wrong_shape_is_refused_and_changes_nothing() -> None:
    class Flat(prune.Criterion):
        by_magnitude = True

        def scores(self, values: Tensor, target: Any = None) -> Tensor:
            return values.reshape(-1)

    m = nn.Linear(4, 3)
    with pytest.raises(ValueError, match=r"Flat.scores returned shape \(12,\); expected"):
        prune.Pruning.apply(m, "weight", 0.5, criterion=Flat())
    assert not prune.is_pruned(m) and "weight" in m._parameters


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"criterion": "l1"}, "invalid criterion='l1'; expected a prunekit.Criterion"),
        ({"pattern": 2}, "invalid pattern=2; expected a prunekit.Pattern"),
    ],
)
def test_pruning_refuses_what_is_not_a_criterion_or_pattern(
    kwargs: dict[str, Any], message: str
) -> None:
    m = nn.Linear(4, 3)
    with pytest.raises(TypeError, match=message):
        prune.Pruning.apply(m, "weight", 0.5, **kwargs)
    assert not prune.is_pruned(m)


def test_a_bug_inside_a_users_method_is_not_reworded_as_the_callers_error() -> None:
    class Buggy(prune.BasePruningMethod):
        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
            raise ValueError("bug in compute_mask")

    m = nn.Linear(4, 3)
    with pytest.raises(ValueError) as caught:
        Buggy.apply(m, "weight")
    assert str(caught.value) == "bug in compute_mask"  # no "parameter 'weight' of ..." in front
    assert caught.traceback[-1].name == "compute_mask"  # its own traceback, down to the bug
    assert not prune.is_pruned(m)


def test_the_callers_errors_get_the_tensors_name_and_keep_their_type() -> None:
    m = nn.Linear(4, 3)
    with pytest.raises(ValueError) as caught:
        prune.l1_unstructured(m, "weight", amount=13)
    assert type(caught.value) is ValueError
    assert str(caught.value).startswith("parameter 'weight' of Linear: L1Unstructured: amount=13")
    with pytest.raises(TypeError, match=r"parameter 'weight' of Linear: .*unexpected keyword"):
        prune.Pruning.apply(m, "weight", amunt=0.5)
