"""methods.py: what each built-in method's compute_mask chooses. On both frameworks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit as prune
from helpers.frameworks import Framework


def test_identity_keeps_the_default_mask(framework: Framework) -> None:
    default = framework.tensor([1.0, 0.0, 1.0])
    assert framework.equal(prune.Identity().compute_mask(framework.ns.randn(3), default), default)


def test_l1_prunes_the_smallest_magnitudes(framework: Framework) -> None:
    t = framework.tensor([[-5.0, 0.1], [2.0, -0.2], [0.3, 4.0]])
    mask = prune.L1Unstructured(amount=0.5).compute_mask(t, framework.ns.ones_like(t))
    assert mask.tolist() == [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]


def test_l1_keeps_zeros_of_the_default_mask_without_reranking(framework: Framework) -> None:
    # Called directly (outside a container) the ranking is over all entries,
    # and entries the default mask zeroes stay zero.
    t = framework.tensor([1.0, 2.0, 3.0, 4.0])
    default = framework.tensor([1.0, 1.0, 1.0, 0.0])
    assert prune.L1Unstructured(1).compute_mask(t, default).tolist() == [0.0, 1.0, 1.0, 0.0]


def test_l1_leaves_default_mask_untouched(framework: Framework) -> None:
    default = framework.ns.ones(4)
    prune.L1Unstructured(2).compute_mask(framework.ns.randn(4), default)
    assert default.tolist() == [1.0] * 4


@pytest.mark.parametrize("amount", [0, 0.0])
def test_nothing_to_prune(framework: Framework, amount: float) -> None:
    t = framework.ns.randn(5)
    assert prune.L1Unstructured(amount).compute_mask(t, framework.ns.ones(5)).tolist() == [1.0] * 5


def test_l1_rejects_nan_scores(framework: Framework) -> None:
    t = framework.tensor([1.0, math.nan, 2.0])
    with pytest.raises(ValueError, match=r"cannot be ranked, e\.g\. nan"):
        prune.L1Unstructured(1).compute_mask(t, framework.ns.ones(3))


def test_l1_handles_float16_sums_that_overflow(framework: Framework) -> None:
    t = framework.ns.full((100,), 60000.0, dtype=framework.ns.float16)
    t[7] = 1.0
    mask = prune.L1Unstructured(1).compute_mask(t, framework.ns.ones_like(t))
    assert mask[7] == 0 and int(mask.sum()) == 99


def test_random_unstructured_exact_count_and_randomness(framework: Framework) -> None:
    masks = [
        prune.RandomUnstructured(0.3).compute_mask(
            framework.ns.randn(10, 10), framework.ns.ones(10, 10)
        )
        for _ in range(5)
    ]
    assert all(int((mask == 0).sum()) == 30 for mask in masks)
    assert len({tuple(m.reshape(-1).tolist()) for m in masks}) > 1


def test_random_unstructured_follows_the_seed(framework: Framework) -> None:
    framework.seed(3)
    a = prune.RandomUnstructured(0.5).compute_mask(framework.ns.ones(20), framework.ns.ones(20))
    framework.seed(3)
    b = prune.RandomUnstructured(0.5).compute_mask(framework.ns.ones(20), framework.ns.ones(20))
    assert framework.equal(a, b)


def test_random_structured_prunes_whole_channels(framework: Framework) -> None:
    t = framework.ns.randn(6, 4, 3)
    mask = prune.RandomStructured(amount=2, dim=1).compute_mask(t, framework.ns.ones_like(t))
    channel_sums = mask.sum(dim=(0, 2))
    assert sorted(channel_sums.tolist()) == [0.0, 0.0, 18.0, 18.0]


@pytest.mark.parametrize(
    ("n", "dim", "pruned"),
    [
        (1, 0, [0]),  # row L1 norms: 3, 4, 3.5
        (2, 0, [2]),  # row L2 norms: 3, 2.83, 2.69
        ("fro", 0, [2]),
        (math.inf, 0, [1]),  # row max |x|: 3, 2, 2.5
        (-math.inf, 0, [0]),  # row min |x|: 0, 2, 1
        (2, 1, [1]),  # column L2 norms: 4.39, 2.24
    ],
)
def test_ln_structured_prunes_the_smallest_norms(
    framework: Framework, n: object, dim: int, pruned: list[int]
) -> None:
    t = framework.tensor([[3.0, 0.0], [2.0, 2.0], [2.5, 1.0]])
    mask = prune.LnStructured(amount=1, n=n, dim=dim).compute_mask(t, framework.ns.ones_like(t))
    dead = [i for i in range(t.shape[dim]) if mask.select(dim, i).sum() == 0]
    assert dead == pruned
    assert int((mask == 0).sum()) == t.numel() // t.shape[dim]


def test_frobenius_on_4d_is_the_channel_2_norm(framework: Framework) -> None:
    t = framework.ns.randn(5, 3, 2, 2)
    fro = prune.LnStructured(amount=2, n="fro", dim=0).compute_mask(t, framework.ns.ones_like(t))
    two = prune.LnStructured(amount=2, n=2, dim=0).compute_mask(t, framework.ns.ones_like(t))
    assert framework.equal(fro, two)
    norms = t.reshape(5, -1).norm(dim=1)
    dead = (fro.reshape(5, -1).sum(dim=1) == 0).nonzero().reshape(-1)
    assert sorted(dead.tolist()) == sorted(norms.argsort()[:2].tolist())


def test_ln_structured_nuclear_norm_on_3d(framework: Framework) -> None:
    t = framework.ns.randn(3, 4, 5)
    t[:, :, 2] *= 0.01
    mask = prune.LnStructured(amount=1, n="nuc", dim=2).compute_mask(t, framework.ns.ones_like(t))
    assert mask[:, :, 2].sum() == 0 and mask.sum() == 48


def test_ln_structured_nuclear_norm_needs_3d(framework: Framework) -> None:
    with pytest.raises(ValueError, match="n='nuc' needs a 3-D tensor"):
        prune.LnStructured(amount=1, n="nuc", dim=0).compute_mask(
            framework.ns.ones(2, 2), framework.ns.ones(2, 2)
        )


def test_ln_structured_ties_prune_lower_channel_first(framework: Framework) -> None:
    t = framework.ns.ones(3, 4)
    mask = prune.LnStructured(amount=2, n=2, dim=1).compute_mask(t, framework.ns.ones_like(t))
    assert mask[0].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_structured_respects_the_default_mask(framework: Framework) -> None:
    t = framework.ns.randn(4, 4)
    default = framework.ns.ones(4, 4)
    default[0, 0] = 0
    mask = prune.LnStructured(amount=0, n=1, dim=0).compute_mask(t, default)
    assert mask[0, 0] == 0
    mask = prune.RandomStructured(amount=1, dim=0).compute_mask(t, default)
    assert mask[0, 0] == 0 and int(mask.sum()) in (11, 12)


def test_structured_rejects_1d_and_bad_dim(framework: Framework) -> None:
    with pytest.raises(ValueError, match="2 or more dims"):
        prune.LnStructured(1, n=1, dim=0).compute_mask(framework.ns.ones(4), framework.ns.ones(4))
    with pytest.raises(IndexError, match="dim=2 is out of range"):
        prune.RandomStructured(1, dim=2).compute_mask(
            framework.ns.ones(2, 2), framework.ns.ones(2, 2)
        )


def test_structured_count_above_channels(framework: Framework) -> None:
    with pytest.raises(ValueError, match="amount=5 is more than the 4 units"):
        prune.LnStructured(5, n=1, dim=0).compute_mask(
            framework.ns.ones(4, 2), framework.ns.ones(4, 2)
        )


@pytest.mark.parametrize("n", [0, -1, "l1", None])
def test_ln_structured_rejects_bad_norm(n: object) -> None:
    with pytest.raises(ValueError, match="norm order"):
        prune.LnStructured(0.5, n=n)


def test_structured_rejects_non_int_dim() -> None:
    with pytest.raises(TypeError, match=r"dim=0\.5"):
        prune.RandomStructured(0.5, dim=0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"dim=True"):
        prune.LnStructured(0.5, n=2, dim=True)


def test_structured_takes_a_numpy_int_dim_as_torch_does() -> None:
    np = pytest.importorskip("numpy")
    theirs, ours = nn.Linear(8, 6), nn.Linear(8, 6)
    ours.load_state_dict(theirs.state_dict())
    torch_prune.ln_structured(theirs, "weight", 0.5, n=2, dim=np.int64(0))
    prune.ln_structured(ours, "weight", 0.5, n=2, dim=np.int64(0))
    assert torch.equal(theirs.weight_mask, ours.weight_mask)
    assert type(ours._forward_pre_hooks[next(iter(ours._forward_pre_hooks))].dim) is int


def test_custom_from_mask_multiplies_into_default(framework: Framework) -> None:
    method = prune.CustomFromMask(framework.ns.tensor([1, 0, 1, 0]))
    out = method.compute_mask(framework.ns.randn(4), framework.tensor([1.0, 1.0, 0.0, 0.0]))
    assert out.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert out.dtype == framework.ns.float32


def test_custom_from_mask_rejects_bad_masks(framework: Framework) -> None:
    with pytest.raises(ValueError, match="only 0 and 1"):
        prune.CustomFromMask(framework.tensor([0.5, 1.0]))
    with pytest.raises(TypeError, match="invalid mask of type list; expected a tensor"):
        prune.CustomFromMask([1, 0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"mask has shape \(2,\); expected the tensor's"):
        prune.CustomFromMask(framework.ns.ones(2)).compute_mask(
            framework.ns.ones(3), framework.ns.ones(3)
        )


@pytest.mark.parametrize(
    ("cls", "kind"),
    [
        (prune.Identity, "unstructured"),
        (prune.RandomUnstructured, "unstructured"),
        (prune.L1Unstructured, "unstructured"),
        (prune.RandomStructured, "structured"),
        (prune.LnStructured, "structured"),
        (prune.CustomFromMask, "global"),
    ],
)
def test_pruning_types(cls: type[prune.BasePruningMethod], kind: str) -> None:
    assert kind == cls.PRUNING_TYPE
