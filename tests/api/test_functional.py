"""functional.py: the one-call API, global pruning, remove() and is_pruned(). On both frameworks."""

from __future__ import annotations

import pytest
import torch

import prunekit as prune
from helpers.frameworks import Framework


def zeros(t: torch.Tensor) -> int:
    return int((t == 0).sum())


def test_each_call_returns_the_module_and_prunes(framework: Framework) -> None:
    m = framework.nn.Conv2d(3, 8, 3)
    assert prune.identity(m, "bias") is m
    assert zeros(m.bias_mask) == 0
    assert prune.random_unstructured(m, "weight", 0.25) is m
    assert zeros(m.weight_mask) == 54
    assert prune.l1_unstructured(m, "weight", 10) is m
    assert zeros(m.weight_mask) == 64
    assert prune.random_structured(m, "weight", 1, dim=0) is m
    assert prune.ln_structured(m, "weight", 2, n=1, dim=0) is m
    dead = (m.weight_mask.sum(dim=(1, 2, 3)) == 0).sum()
    assert int(dead) >= 3
    custom = framework.ns.ones(8)
    custom[3] = 0
    assert prune.custom_from_mask(m, "bias", custom) is m
    assert m.bias_mask.tolist() == custom.tolist()
    assert prune.remove(m, "weight") is m


def test_is_pruned_looks_at_submodules(framework: Framework) -> None:
    net = framework.nn.Sequential(
        framework.nn.Linear(2, 2),
        framework.nn.Sequential(framework.nn.ReLU(), framework.nn.Linear(2, 2)),
    )
    assert not prune.is_pruned(net)
    prune.l1_unstructured(net[1][1], "weight", 1)
    assert prune.is_pruned(net)
    prune.remove(net[1][1], "weight")
    assert not prune.is_pruned(net)


def test_is_pruned_ignores_other_hooks(framework: Framework) -> None:
    m = framework.nn.Linear(2, 2)
    m.register_forward_pre_hook(lambda mod, inp: None)
    assert not prune.is_pruned(m)


def test_global_prunes_jointly(framework: Framework) -> None:
    a, b = framework.nn.Linear(4, 4, bias=False), framework.nn.Linear(4, 4, bias=False)
    with framework.ns.no_grad():
        a.weight.fill_(1.0)
        b.weight.copy_(framework.ns.arange(1, 17, dtype=framework.ns.float32).reshape(4, 4) * 0.01)
    prune.global_unstructured(
        [(a, "weight"), (b, "weight")], pruning_method=prune.L1Unstructured, amount=16
    )
    assert zeros(a.weight_mask) == 0
    assert zeros(b.weight_mask) == 16


def test_global_fraction_is_of_remaining_entries_and_respects_masks(framework: Framework) -> None:
    a, b = framework.nn.Linear(10, 10), framework.nn.Linear(10, 10)
    prune.l1_unstructured(a, "weight", 50)
    old = a.weight_mask.clone()
    params = [(a, "weight"), (b, "weight")]
    prune.global_unstructured(params, prune.L1Unstructured, amount=0.5)
    # 150 entries were unpruned; half of them go
    assert zeros(a.weight_mask) + zeros(b.weight_mask) == 50 + 75
    assert framework.ns.all(a.weight_mask[old == 0] == 0)
    assert isinstance(
        a._forward_pre_hooks[next(iter(a._forward_pre_hooks))], prune.PruningContainer
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_global_ignores_what_pruned_entries_hold(framework: Framework, value: float) -> None:
    # Pruned entries do not compete, as in torch and in a second l1_unstructured: a NaN or
    # an infinity behind the mask is never ranked.
    a, b = framework.nn.Linear(3, 1, bias=False), framework.nn.Linear(3, 1, bias=False)
    with framework.ns.no_grad():
        a.weight.copy_(framework.tensor([[5.0, 4.0, 3.0]]))
        b.weight.copy_(framework.tensor([[0.5, 6.0, 1.0]]))
    prune.custom_from_mask(a, "weight", framework.tensor([[1.0, 0.0, 1.0]]))
    with framework.ns.no_grad():
        a.weight_orig[0, 1] = value
    prune.global_unstructured([(a, "weight"), (b, "weight")], prune.L1Unstructured, amount=2)
    assert a.weight_mask.tolist() == [[1.0, 0.0, 1.0]]
    assert b.weight_mask.tolist() == [[0.0, 1.0, 0.0]]


def test_global_with_importance_scores(framework: Framework) -> None:
    a, b = framework.nn.Linear(3, 1, bias=False), framework.nn.Linear(3, 1, bias=False)
    scores = {
        (a, "weight"): framework.tensor([[5.0, 4.0, 3.0]]),
        (b, "weight"): framework.tensor([[0.0, 6.0, 1.0]]),
    }
    prune.global_unstructured(
        [(a, "weight"), (b, "weight")], prune.L1Unstructured, scores, amount=3
    )
    assert a.weight_mask.tolist() == [[1.0, 1.0, 0.0]]
    assert b.weight_mask.tolist() == [[0.0, 1.0, 0.0]]


def test_global_random(framework: Framework) -> None:
    layers = [framework.nn.Linear(5, 5) for _ in range(3)]
    params = [(m, "weight") for m in layers]
    prune.global_unstructured(params, prune.RandomUnstructured, amount=0.4)
    assert sum(zeros(m.weight_mask) for m in layers) == 30


def test_global_accepts_a_generator(framework: Framework) -> None:
    layers = [framework.nn.Linear(5, 5) for _ in range(2)]
    prune.global_unstructured(((m, "weight") for m in layers), prune.L1Unstructured, amount=5)
    assert sum(zeros(m.weight_mask) for m in layers) == 5


def test_global_rejects_structured_methods(framework: Framework) -> None:
    m = framework.nn.Linear(3, 3)
    with pytest.raises(TypeError, match="expected an 'unstructured' method"):
        prune.global_unstructured([(m, "weight")], prune.RandomStructured, amount=1)
    assert not prune.is_pruned(m)


def test_global_rejects_non_iterables_and_bad_scores(framework: Framework) -> None:
    m = framework.nn.Linear(3, 3)
    with pytest.raises(TypeError, match="iterable of \\(module, name\\) pairs"):
        prune.global_unstructured(m, prune.L1Unstructured, amount=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a dict keyed by"):
        prune.global_unstructured(
            [(m, "weight")],
            prune.L1Unstructured,
            importance_scores=[framework.ns.ones(3, 3)],  # type: ignore[arg-type]
            amount=1,
        )


def test_global_count_too_large_leaves_everything_unpruned(framework: Framework) -> None:
    a, b = framework.nn.Linear(2, 2), framework.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="amount=9 is more than the 8 units"):
        prune.global_unstructured([(a, "weight"), (b, "weight")], prune.L1Unstructured, amount=9)
    assert not prune.is_pruned(a) and not prune.is_pruned(b)


def test_pruned_model_trains_and_keeps_zeros(framework: Framework) -> None:
    net = framework.nn.Sequential(
        framework.nn.Linear(8, 16), framework.nn.ReLU(), framework.nn.Linear(16, 2)
    )
    prune.global_unstructured(
        [(net[0], "weight"), (net[2], "weight")], prune.L1Unstructured, amount=0.7
    )
    opt = framework.ns.optim.SGD(net.parameters(), lr=0.1)
    x, y = framework.ns.randn(32, 8), framework.ns.randint(0, 2, (32,))
    for _ in range(3):
        opt.zero_grad()
        framework.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    for layer in (net[0], net[2]):
        assert framework.ns.all(layer.weight[layer.weight_mask == 0] == 0)
    net(x)
    for layer in (net[0], net[2]):
        prune.remove(layer, "weight")
    assert sum(zeros(layer.weight) for layer in (net[0], net[2])) == round(0.7 * (128 + 32))
