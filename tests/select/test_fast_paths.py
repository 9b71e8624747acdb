"""Fast paths give the masks of torch.nn.utils.prune (tie-free inputs) and of the generic path."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

import prunekit as prune
from prunekit.select import tuning

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.fixture(autouse=True, params=["guess", "guess-tensors", "radix", "plain"])
def selection_path(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test runs through each selection path: one pass around a guess from a sample
    (as the C loop, in chunks and parts as small as these inputs allow, and as tensor
    operations), the histogram passes, and the plain one (small inputs normally take it).

    The inputs here are small, so the guess from a sample of them is loose: the one pass
    may gather up to half of the entries in between (1/16 otherwise) to be taken at all.
    """
    with tuning.overridden(
        small=1 << 16 if request.param == "plain" else 0,
        guess=0,
        sample=1024 if "guess" in request.param else 1 << 40,
        gather_share=2,
        gather_capped=False,
        step=1000,
        part=100,
        threads=lambda: 2,
        native=request.param != "guess-tensors",
    ):
        yield


class Distinct:
    """Hands out values whose magnitudes never repeat, so rankings have no ties."""

    def __init__(self, dtype: torch.dtype, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        if dtype in (torch.float16, torch.bfloat16):
            # Every normal positive bit pattern below 2.0, shuffled (norms stay finite).
            bits = torch.randperm(0x4000 - 0x0400, generator=g) + 0x0400
            pool = bits.to(torch.int16).view(dtype)
        else:
            pool = (torch.randperm(1 << 20, generator=g).to(dtype) + 1) / (1 << 20)
        signs = torch.where(torch.rand(pool.numel(), generator=g) < 0.5, -1.0, 1.0)
        self.pool = pool * signs.to(dtype)

    def fill_(self, *tensors: Tensor) -> None:
        with torch.no_grad():
            for t in tensors:
                n = t.numel()
                t.copy_(self.pool[:n].reshape(t.shape))
                self.pool = self.pool[n:]


def models(dtype: torch.dtype, count: int = 3) -> tuple[list[nn.Linear], list[nn.Linear]]:
    """Two identical lists of Linear layers with tie-free weights and biases."""
    values = Distinct(dtype)
    layers = [nn.Linear(48, 24).to(dtype) for _ in range(count)]
    for layer in layers:
        values.fill_(layer.weight, layer.bias)
    return layers, copy.deepcopy(layers)


def assert_same_pruning(theirs: nn.Module, ours: nn.Module, name: str = "weight") -> None:
    their_mask = getattr(theirs, name + "_mask")
    our_mask = getattr(ours, name + "_mask")
    # prunekit keeps masks in the parameter's dtype even when the scores have another.
    assert our_mask.dtype == getattr(ours, name + "_orig").dtype
    assert torch.equal(our_mask, their_mask.to(our_mask.dtype))
    assert torch.equal(getattr(ours, name), getattr(theirs, name))


@pytest.mark.parametrize("dtype", DTYPES)
def test_l1_unstructured_matches_torch(dtype: torch.dtype) -> None:
    (theirs,), (ours,) = models(dtype, 1)
    torch_prune.l1_unstructured(theirs, "weight", amount=0.37)
    prune.l1_unstructured(ours, "weight", amount=0.37)
    assert_same_pruning(theirs, ours)


@pytest.mark.parametrize("dtype", DTYPES)
def test_container_chain_matches_torch(dtype: torch.dtype) -> None:
    (theirs,), (ours,) = models(dtype, 1)
    steps = [
        lambda lib, m: lib.l1_unstructured(m, "weight", amount=0.3),
        lambda lib, m: lib.ln_structured(m, "weight", amount=0.25, n=2, dim=0),
        lambda lib, m: lib.l1_unstructured(m, "weight", amount=0.4),
        lambda lib, m: lib.l1_unstructured(m, "weight", amount=7),
        lambda lib, m: lib.l1_unstructured(m, "weight", amount=0.5),
    ]
    for step in steps:
        step(torch_prune, theirs)
        step(prune, ours)
        assert_same_pruning(theirs, ours)


@pytest.mark.parametrize("dtype", DTYPES)
def test_container_with_importance_scores_matches_torch(dtype: torch.dtype) -> None:
    (theirs,), (ours,) = models(dtype, 1)
    scores = torch.empty(theirs.weight.shape, dtype=torch.float32)
    Distinct(torch.float32, seed=3).fill_(scores)
    for lib, module in ((torch_prune, theirs), (prune, ours)):
        lib.l1_unstructured(module, "weight", amount=0.2)
        lib.l1_unstructured(module, "weight", amount=0.3, importance_scores=scores)
    assert_same_pruning(theirs, ours)


@pytest.mark.parametrize("dtype", DTYPES)
def test_global_unstructured_matches_torch(dtype: torch.dtype) -> None:
    theirs, ours = models(dtype)
    # Earlier prunings make containers and leave entries that must not compete again.
    for lib, layers in ((torch_prune, theirs), (prune, ours)):
        lib.l1_unstructured(layers[0], "weight", amount=0.3)
        lib.l1_unstructured(layers[0], "weight", amount=0.2)
        lib.ln_structured(layers[2], "weight", amount=0.5, n=1, dim=1)
    for amount in (0.3, 100, 0.5):
        for lib, layers in ((torch_prune, theirs), (prune, ours)):
            params = [(m, "weight") for m in layers] + [(m, "bias") for m in layers]
            lib.global_unstructured(params, pruning_method=lib.L1Unstructured, amount=amount)
        for their_layer, our_layer in zip(theirs, ours, strict=True):
            assert_same_pruning(their_layer, our_layer, "weight")
            assert_same_pruning(their_layer, our_layer, "bias")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_global_with_importance_scores_matches_torch(dtype: torch.dtype) -> None:
    theirs, ours = models(dtype, 2)
    values = Distinct(torch.float32, seed=5)
    scores = []
    for layer in theirs:
        s = torch.empty(layer.weight.shape)
        values.fill_(s)
        scores.append(s)
    for lib, layers in ((torch_prune, theirs), (prune, ours)):
        lib.l1_unstructured(layers[1], "weight", amount=0.4)
        given = {(m, "weight"): s for m, s in zip(layers, scores, strict=True)}
        lib.global_unstructured(
            [(m, "weight") for m in layers],
            pruning_method=lib.L1Unstructured,
            importance_scores=given,
            amount=0.45,
        )
    for their_layer, our_layer in zip(theirs, ours, strict=True):
        assert_same_pruning(their_layer, our_layer)


class GenericL1(prune.L1Unstructured):
    """Same ranking as L1Unstructured, but its own compute_mask sends it down the generic path."""

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return super().compute_mask(t, default_mask)


class GenericRandom(prune.RandomUnstructured):
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return super().compute_mask(t, default_mask)


def tied_layer(dtype: torch.dtype) -> nn.Linear:
    layer = nn.Linear(40, 30).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randint(-3, 4, layer.weight.shape).to(dtype))
    return layer


@pytest.mark.parametrize("dtype", DTYPES)
def test_container_fast_path_equals_generic_path_with_ties(dtype: torch.dtype) -> None:
    fast = tied_layer(dtype)
    slow = copy.deepcopy(fast)
    for amount in (0.3, 0.5, 11, 0.25):
        prune.L1Unstructured.apply(fast, "weight", amount=amount)
        GenericL1.apply(slow, "weight", amount=amount)
        assert torch.equal(fast.weight_mask, slow.weight_mask)


def test_random_container_fast_path_equals_generic_path() -> None:
    fast = nn.Linear(50, 20)
    slow = copy.deepcopy(fast)
    prune.l1_unstructured(fast, "weight", amount=0.3)
    prune.l1_unstructured(slow, "weight", amount=0.3)
    for seed, amount in ((1, 0.4), (2, 0.5), (3, 9)):
        torch.manual_seed(seed)
        prune.RandomUnstructured.apply(fast, "weight", amount=amount)
        torch.manual_seed(seed)
        GenericRandom.apply(slow, "weight", amount=amount)
        assert torch.equal(fast.weight_mask, slow.weight_mask)


@pytest.mark.parametrize("dtype", DTYPES)
def test_global_fast_path_equals_generic_path_with_ties(dtype: torch.dtype) -> None:
    fast = [tied_layer(dtype) for _ in range(3)]
    slow = copy.deepcopy(fast)
    prune.l1_unstructured(fast[1], "weight", amount=0.3)
    prune.l1_unstructured(slow[1], "weight", amount=0.3)
    for method, layers in ((prune.L1Unstructured, fast), (GenericL1, slow)):
        params = [(m, "weight") for m in layers] + [(m, "bias") for m in layers]
        prune.global_unstructured(params, pruning_method=method, amount=0.45)
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(a.weight_mask, b.weight_mask)
        assert torch.equal(a.bias_mask, b.bias_mask)


def test_global_random_prunes_exactly_the_amount_among_unpruned_entries() -> None:
    layers = [nn.Linear(30, 30) for _ in range(4)]
    prune.l1_unstructured(layers[0], "weight", amount=0.5)
    before = [layer.weight_mask.clone() for layer in layers[:1]]
    prune.global_unstructured(
        [(m, "weight") for m in layers], pruning_method=prune.RandomUnstructured, amount=0.5
    )
    alive_before = 4 * 900 - 450
    pruned_now = sum(int((m.weight_mask == 0).sum()) for m in layers) - 450
    assert pruned_now == round(0.5 * alive_before)
    # What was pruned stays pruned.
    assert bool((layers[0].weight_mask[before[0] == 0] == 0).all())
    # Each tensor gets a share: the selection is spread over all of them.
    assert all(int((m.weight_mask == 0).sum()) > 100 for m in layers[1:])


def test_unrankable_entries_fall_back_or_fail_like_the_generic_path() -> None:
    layer = nn.Linear(10, 10)
    prune.l1_unstructured(layer, "weight", amount=0.5)
    scores = layer.weight.detach().abs() + 1.0
    scores[layer.weight_mask == 0] = float("inf")  # only pruned entries: they do not compete
    prune.l1_unstructured(layer, "weight", amount=0.2, importance_scores=scores)
    assert int((layer.weight_mask == 0).sum()) == 50 + 10
    scores[layer.weight_mask == 1] = float("inf")
    before = layer.weight_mask.clone()
    with pytest.raises(ValueError, match="cannot be ranked"):
        prune.l1_unstructured(layer, "weight", amount=0.2, importance_scores=scores)
    assert torch.equal(layer.weight_mask, before)
    with pytest.raises(ValueError, match="cannot be ranked"):
        prune.global_unstructured(
            [(layer, "weight")],
            pruning_method=prune.L1Unstructured,
            importance_scores={(layer, "weight"): scores},
            amount=0.2,
        )
    assert torch.equal(layer.weight_mask, before)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_first_pruning_refuses_scores_it_cannot_rank(bad: float) -> None:
    # A first pruning checks the scores as it reads them: the error still names the entry,
    # whatever the amount (none or all of them too), on every path.
    layers = [nn.Linear(64, 64) for _ in range(2)]
    with torch.no_grad():
        layers[1].weight[5, 7] = bad
    kept = [layer.weight.detach().clone() for layer in layers]
    for amount in (0.3, 0.0, 1.0):
        with pytest.raises(ValueError, match=r"\(5, 7\)"):
            prune.l1_unstructured(layers[1], "weight", amount=amount)
    with pytest.raises(ValueError, match=r"\(5, 7\)"):
        prune.global_unstructured(
            [(m, "weight") for m in layers], pruning_method=prune.L1Unstructured, amount=0.3
        )
    for layer, weight in zip(layers, kept, strict=True):
        assert not prune.is_pruned(layer)
        assert torch.allclose(layer.weight, weight, equal_nan=True)


def test_each_path_serves_first_second_and_global_pruning(
    request: pytest.FixtureRequest, one_pass: list[bool]
) -> None:
    # The one pass serves every call in the "guess" modes, and no call in the other two.
    theirs, ours = models(torch.float32)
    for lib, layers in ((torch_prune, theirs), (prune, ours)):
        lib.l1_unstructured(layers[0], "weight", amount=0.3)
        lib.l1_unstructured(layers[0], "weight", amount=0.4)
        params = [(m, "weight") for m in layers]
        lib.global_unstructured(params, pruning_method=lib.L1Unstructured, amount=0.2)
    for t, o in zip(theirs, ours, strict=True):
        assert_same_pruning(t, o)
    if "guess" in request.node.callspec.params["selection_path"]:
        assert len(one_pass) >= 3 and all(one_pass)
    else:
        assert one_pass == []


def test_a_bad_amount_is_named_before_bad_scores_on_every_path() -> None:
    layer = nn.Linear(64, 64)
    with torch.no_grad():
        layer.weight[5, 7] = float("nan")
    with pytest.raises(ValueError, match="amount=4101"):
        prune.l1_unstructured(layer, "weight", amount=4101)
    with torch.no_grad():
        layer.weight[5, 7] = 1.0
    prune.l1_unstructured(layer, "weight", amount=0.5)
    with torch.no_grad():
        layer.weight_orig[5, 7] = float("nan")
    with pytest.raises(ValueError, match="amount=2049"):
        prune.l1_unstructured(layer, "weight", amount=2049)  # 2048 left unpruned
