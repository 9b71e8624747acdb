"""prunekit against torch.nn.utils.prune: equal masks and weights on tie-free inputs."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit

Step = Callable[[ModuleType, nn.Module], Any]


def twins(make: Callable[[], nn.Module]) -> tuple[nn.Module, nn.Module]:
    a = make()
    b = make()
    b.load_state_dict(a.state_dict())
    return a, b


def assert_same(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert torch.equal(sa[key].to(sb[key].dtype), sb[key]), key
    modules_b = dict(b.named_modules())
    for path, sub in a.named_modules():
        for name in sub._buffers:
            if name.endswith("_mask"):
                tensor = name[: -len("_mask")]
                other = getattr(modules_b[path], tensor)
                assert torch.equal(getattr(sub, tensor), other), f"{path}.{tensor}"


def random_step(rng: random.Random, shape: torch.Size) -> tuple[str, Step]:
    """A deterministic pruning step with random parameters valid for `shape`."""
    kind = rng.choice(["l1", "l1_count", "ln", "ln_count", "identity", "custom", "l1_scores"])
    if kind == "l1":
        amount = rng.choice([0.1, 0.25, 0.3, 0.5, 0.75])
        return f"l1({amount})", lambda p, m: p.l1_unstructured(m, "weight", amount)
    if kind == "l1_count":
        return "l1(1)", lambda p, m: p.l1_unstructured(m, "weight", 1)
    if kind == "l1_scores":
        scores = torch.rand(shape)
        return "l1(scores)", lambda p, m: p.l1_unstructured(
            m, "weight", 0.2, importance_scores=scores
        )
    if kind in ("ln", "ln_count"):
        # Not -inf here: after an unstructured step, every channel holding a pruned
        # entry has min-norm 0, a tie that the two libraries may break differently.
        # torch accepts 'fro' only over at most two axes.
        n = rng.choice([1, 2, 3, math.inf] + (["fro"] if len(shape) <= 3 else []))
        dim = rng.randrange(-len(shape), len(shape))
        amount = 0.3 if kind == "ln" else 1
        return f"ln({amount}, n={n}, dim={dim})", lambda p, m: p.ln_structured(
            m, "weight", amount, n=n, dim=dim
        )
    if kind == "identity":
        return "identity", lambda p, m: p.identity(m, "weight")
    custom = (torch.rand(shape) > 0.2).float()
    return "custom", lambda p, m: p.custom_from_mask(m, "weight", custom)


MAKERS: dict[str, Callable[[], nn.Module]] = {
    "linear": lambda: nn.Linear(12, 9),
    "conv": lambda: nn.Conv2d(4, 6, 3),
    "linear64": lambda: nn.Linear(7, 5).double(),
}


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("model", sorted(MAKERS))
def test_chains_of_prunings_match_torch(seed: int, model: str) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    ours, theirs = twins(MAKERS[model])
    shape = ours.weight.shape
    for _ in range(rng.randint(2, 4)):
        _, step = random_step(rng, shape)
        step(prunekit, ours)
        step(torch_prune, theirs)
        assert_same(ours, theirs)
    x = torch.randn(3, *([12] if model == "linear" else [4, 8, 8] if model == "conv" else [7]))
    x = x.to(ours.weight.dtype)
    assert torch.equal(ours(x), theirs(x))
    prunekit.remove(ours, "weight")
    torch_prune.remove(theirs, "weight")
    assert_same(ours, theirs)


def make_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 5, 3), nn.Flatten(), nn.Linear(20, 10), nn.Linear(10, 4))


@pytest.mark.parametrize("seed", range(10))
def test_global_unstructured_matches_torch(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    ours, theirs = twins(make_net)

    def params(net: nn.Module) -> list[tuple[nn.Module, str]]:
        return [(net[0], "weight"), (net[2], "weight"), (net[3], "weight"), (net[2], "bias")]

    for prune_module, net in ((prunekit, ours), (torch_prune, theirs)):
        prune_module.ln_structured(net[2], "weight", 2, n=2, dim=0)
    for _ in range(rng.randint(1, 3)):
        amount = rng.choice([0.2, 0.5, 0.8, 17])
        prunekit.global_unstructured(params(ours), prunekit.L1Unstructured, amount=amount)
        torch_prune.global_unstructured(params(theirs), torch_prune.L1Unstructured, amount=amount)
        assert_same(ours, theirs)


def test_global_with_importance_scores_matches_torch() -> None:
    ours, theirs = twins(make_net)
    scores = [torch.rand(5, 3, 3, 3), torch.rand(10, 20)]

    def params(net: nn.Module) -> list[tuple[nn.Module, str]]:
        return [(net[0], "weight"), (net[2], "weight")]

    prunekit.global_unstructured(
        params(ours),
        prunekit.L1Unstructured,
        importance_scores=dict(zip(params(ours), scores, strict=True)),
        amount=0.6,
    )
    torch_prune.global_unstructured(
        params(theirs),
        torch_prune.L1Unstructured,
        importance_scores=dict(zip(params(theirs), scores, strict=True)),
        amount=0.6,
    )
    assert_same(ours, theirs)


@pytest.mark.parametrize("dim", [0, 1])
def test_min_norm_on_a_fresh_tensor_matches_torch(dim: int) -> None:
    ours, theirs = twins(lambda: nn.Linear(10, 8))
    prunekit.ln_structured(ours, "weight", 0.5, n=-math.inf, dim=dim)
    torch_prune.ln_structured(theirs, "weight", 0.5, n=-math.inf, dim=dim)
    assert_same(ours, theirs)


def test_method_objects_match_torch_compute_mask() -> None:
    t = torch.randn(6, 5, 4)
    default = (torch.rand(6, 5, 4) > 0.3).float()
    pairs = [
        (prunekit.L1Unstructured(0.4), torch_prune.L1Unstructured(0.4)),
        (prunekit.LnStructured(2, n=1, dim=1), torch_prune.LnStructured(2, n=1, dim=1)),
        (prunekit.LnStructured(0.5, n="nuc", dim=0), torch_prune.LnStructured(0.5, n="nuc", dim=0)),
        (prunekit.Identity(), torch_prune.Identity()),
    ]
    for ours, theirs in pairs:
        assert torch.equal(
            ours.compute_mask(t, default.clone()), theirs.compute_mask(t, default.clone())
        )
        assert torch.equal(ours.prune(t), theirs.prune(t))
