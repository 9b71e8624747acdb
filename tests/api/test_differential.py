"""prunekit against torch.nn.utils.prune: equal masks and weights on tie-free inputs.

prunekit runs on each framework in turn; the reference is always torch.nn.utils.prune
on a torch module holding the same weights.
"""

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
from helpers.frameworks import Framework
from prunekit.core.backend import framework as framework_of

Step = Callable[[ModuleType, Any], Any]
Maker = Callable[[Any], Any]  # builds a module from a framework's nn package


def twins(framework: Framework, make: Maker) -> tuple[Any, nn.Module]:
    """A module of `framework` (for prunekit) and a torch one with the same weights."""
    theirs = make(nn)
    ours = make(framework.nn)
    framework.copy_parameters(theirs, ours)
    return ours, theirs


def like(m: Any, t: torch.Tensor) -> Any:
    """The torch tensor `t` as a tensor of the framework module `m` belongs to."""
    if framework_of(m) == "torch":
        return t
    return Framework("tensorplay").tensor(t, dtype=str(t.dtype).removeprefix("torch."))


def assert_same(a: Any, b: nn.Module) -> None:
    """Same state_dict keys and values (whatever the framework), same masked tensors."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].tolist() == sb[key].tolist(), key
    modules_b = dict(b.named_modules())
    for path, sub in a.named_modules():
        for name in sub._buffers:
            if name.endswith("_mask"):
                tensor = name[: -len("_mask")]
                other = getattr(modules_b[path], tensor)
                assert getattr(sub, tensor).tolist() == other.tolist(), f"{path}.{tensor}"


def assert_close(a: Any, b: torch.Tensor) -> None:
    """Equal on torch; on tensorplay within float32 rounding of its own kernels."""
    if framework_of(a) == "torch":
        assert torch.equal(a, b)
        return
    ours = torch.tensor(a.tolist(), dtype=b.dtype)
    assert torch.allclose(ours, b, rtol=1e-5, atol=1e-6)


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
            m, "weight", 0.2, importance_scores=like(m, scores)
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
    return "custom", lambda p, m: p.custom_from_mask(m, "weight", like(m, custom))


MAKERS: dict[str, Maker] = {
    "linear": lambda nn: nn.Linear(12, 9),
    "conv": lambda nn: nn.Conv2d(4, 6, 3),
    "linear64": lambda nn: nn.Linear(7, 5).double(),
}


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("model", sorted(MAKERS))
def test_chains_of_prunings_match_torch(framework: Framework, seed: int, model: str) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    ours, theirs = twins(framework, MAKERS[model])
    shape = ours.weight.shape
    for _ in range(rng.randint(2, 4)):
        _, step = random_step(rng, shape)
        step(prunekit, ours)
        step(torch_prune, theirs)
        assert_same(ours, theirs)
    x = torch.randn(3, *([12] if model == "linear" else [4, 8, 8] if model == "conv" else [7]))
    x = x.to(theirs.weight.dtype)
    assert_close(ours(like(ours, x)), theirs(x))
    prunekit.remove(ours, "weight")
    torch_prune.remove(theirs, "weight")
    assert_same(ours, theirs)


def make_net(nn: Any) -> Any:
    return nn.Sequential(nn.Conv2d(3, 5, 3), nn.Flatten(), nn.Linear(20, 10), nn.Linear(10, 4))


@pytest.mark.parametrize("seed", range(10))
def test_global_unstructured_matches_torch(framework: Framework, seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    ours, theirs = twins(framework, make_net)

    def params(net: Any) -> list[tuple[Any, str]]:
        return [(net[0], "weight"), (net[2], "weight"), (net[3], "weight"), (net[2], "bias")]

    for prune_module, net in ((prunekit, ours), (torch_prune, theirs)):
        prune_module.ln_structured(net[2], "weight", 2, n=2, dim=0)
    for _ in range(rng.randint(1, 3)):
        amount = rng.choice([0.2, 0.5, 0.8, 17])
        prunekit.global_unstructured(params(ours), prunekit.L1Unstructured, amount=amount)
        torch_prune.global_unstructured(params(theirs), torch_prune.L1Unstructured, amount=amount)
        assert_same(ours, theirs)


def test_global_with_importance_scores_matches_torch(framework: Framework) -> None:
    ours, theirs = twins(framework, make_net)
    scores = [torch.rand(5, 3, 3, 3), torch.rand(10, 20)]

    def params(net: Any) -> list[tuple[Any, str]]:
        return [(net[0], "weight"), (net[2], "weight")]

    prunekit.global_unstructured(
        params(ours),
        prunekit.L1Unstructured,
        importance_scores=dict(zip(params(ours), [like(ours, s) for s in scores], strict=True)),
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
def test_min_norm_on_a_fresh_tensor_matches_torch(framework: Framework, dim: int) -> None:
    ours, theirs = twins(framework, lambda nn: nn.Linear(10, 8))
    prunekit.ln_structured(ours, "weight", 0.5, n=-math.inf, dim=dim)
    torch_prune.ln_structured(theirs, "weight", 0.5, n=-math.inf, dim=dim)
    assert_same(ours, theirs)


def test_method_objects_match_torch_compute_mask(framework: Framework) -> None:
    t = torch.randn(6, 5, 4)
    default = (torch.rand(6, 5, 4) > 0.3).float()
    our_t, our_default = framework.tensor(t), framework.tensor(default)
    pairs = [
        (prunekit.L1Unstructured(0.4), torch_prune.L1Unstructured(0.4)),
        (prunekit.LnStructured(2, n=1, dim=1), torch_prune.LnStructured(2, n=1, dim=1)),
        (prunekit.LnStructured(0.5, n="nuc", dim=0), torch_prune.LnStructured(0.5, n="nuc", dim=0)),
        (prunekit.Identity(), torch_prune.Identity()),
    ]
    for ours, theirs in pairs:
        mask = ours.compute_mask(our_t, our_default.clone())
        assert mask.tolist() == theirs.compute_mask(t, default.clone()).tolist()
        assert ours.prune(our_t).tolist() == theirs.prune(t).tolist()
