"""The same calls on tensorplay modules: masks equal to torch's, training, remove, clear errors."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import given, settings
from hypothesis import strategies as st

import prunekit as prune
from helpers.frameworks import Framework
from prunekit.core.backend import (
    common_namespace,
    dtype_name,
    is_module,
    is_tensor,
    multiply_,
    namespace,
    seeded_rand,
)
from prunekit.core.backend import framework as framework_of

tp = pytest.importorskip("tensorplay", minversion="1.0")
TORCH = Framework("torch")
TP = Framework("tensorplay")

# A step prunes module `m` through `lib` (prunekit or torch.nn.utils.prune), making
# any tensor it needs with `fw`.
Step = Callable[[Any, Framework, Any], Any]


def make(fw: Framework, kind: str, small: bool = False) -> Any:
    if small:
        return fw.nn.Linear(9, 2) if kind == "linear" else fw.nn.Conv2d(1, 2, 3)
    if kind == "linear":
        return fw.nn.Linear(7, 5)
    if kind == "conv1d":
        return fw.nn.Conv1d(4, 6, 3)
    return fw.nn.Conv2d(3, 6, 3)


def torch_and_tensorplay(kind: str, seed: int = 0) -> tuple[Any, Any]:
    """A torch module and a tensorplay module holding the same weights."""
    torch.manual_seed(seed)
    reference = make(TORCH, kind)
    other = make(TP, kind)
    TP.copy_parameters(reference, other)
    return reference, other


def ramp(fw: Framework, m: Any, name: str = "weight") -> Any:
    """Scores unlike the weights and free of ties: i at flat index i, but n - i - 0.5 at every
    third index."""
    n = getattr(m, name).numel()
    values = [n - i - 0.5 if i % 3 == 0 else float(i) for i in range(n)]
    return fw.tensor(values).reshape(tuple(getattr(m, name).shape))


def stripes(fw: Framework, m: Any) -> Any:
    n = m.weight.numel()
    values = [float(i % 3 != 0) for i in range(n)]
    return fw.tensor(values).reshape(tuple(m.weight.shape))


inf = math.inf
STEPS: dict[str, Step] = {
    "identity": lambda lib, fw, m: lib.identity(m, "weight"),
    "l1_frac": lambda lib, fw, m: lib.l1_unstructured(m, "weight", 0.3),
    "l1_count": lambda lib, fw, m: lib.l1_unstructured(m, "weight", 11),
    "l1_all": lambda lib, fw, m: lib.l1_unstructured(m, "weight", 1.0),
    "l1_none": lambda lib, fw, m: lib.l1_unstructured(m, "weight", 0.0),
    "l1_bias": lambda lib, fw, m: lib.l1_unstructured(m, "bias", 0.5),
    "l1_scores": lambda lib, fw, m: lib.l1_unstructured(
        m, "weight", 0.5, importance_scores=ramp(fw, m)
    ),
    "custom": lambda lib, fw, m: lib.custom_from_mask(m, "weight", stripes(fw, m)),
    "ln_scores": lambda lib, fw, m: lib.ln_structured(
        m, "weight", 0.5, 2, 0, importance_scores=ramp(fw, m)
    ),
}
for _n in (1, 2, 3, 0.5, inf, -inf):
    for _dim in (0, 1, -1):
        STEPS[f"ln_n{_n}_dim{_dim}"] = lambda lib, fw, m, n=_n, dim=_dim: lib.ln_structured(
            m, "weight", 0.5, n, dim
        )
STEPS["ln_count"] = lambda lib, fw, m: lib.ln_structured(m, "weight", 2, 1, 0)

CHAINS: dict[str, list[Step]] = {name: [step] for name, step in STEPS.items()}
CHAINS.update(
    {
        "l1_then_ln": [STEPS["l1_frac"], STEPS["ln_n2_dim0"]],
        "ln_then_l1_then_l1": [STEPS["ln_count"], STEPS["l1_frac"], STEPS["l1_count"]],
        "ln_then_ln": [STEPS["ln_count"], STEPS["ln_n2_dim1"]],
        "custom_then_l1": [STEPS["custom"], STEPS["l1_scores"]],
        "l1_all_then_ln": [STEPS["l1_all"], STEPS["ln_n1_dim0"]],
        "identity_then_l1": [STEPS["identity"], STEPS["l1_count"]],
    }
)


# -- the same weights give the same masks as torch.nn.utils.prune


def masks_of(m: Any) -> dict[str, Any]:
    return {name: buf.tolist() for name, buf in m.named_buffers() if name.endswith("_mask")}


@pytest.mark.parametrize("kind", ["linear", "conv2d"])
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_same_masks_as_torch(kind: str, chain: str) -> None:
    reference, other = torch_and_tensorplay(kind)
    mine = make(TORCH, kind)
    mine.load_state_dict(reference.state_dict())
    for step in CHAINS[chain]:
        step(torch_prune, TORCH, reference)
        step(prune, TORCH, mine)
        step(prune, TP, other)
    assert masks_of(reference)
    assert masks_of(other) == masks_of(reference)
    assert masks_of(mine) == masks_of(reference)
    for name in masks_of(reference):
        tensor = name.removesuffix("_mask")
        assert getattr(other, tensor).tolist() == getattr(reference, tensor).tolist()
        torch_prune.remove(reference, tensor)
        prune.remove(other, tensor)
        assert getattr(other, tensor).tolist() == getattr(reference, tensor).tolist()
    assert not prune.is_pruned(other)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_nuclear_norm_ranks_channels_as_torch(dim: int) -> None:
    reference, other = torch_and_tensorplay("conv1d")
    torch_prune.ln_structured(reference, "weight", 0.5, "nuc", dim)
    prune.ln_structured(other, "weight", 0.5, "nuc", dim)
    assert other.weight_mask.tolist() == reference.weight_mask.tolist()


@pytest.mark.parametrize("ns", [torch, tp], ids=["torch", "tensorplay"])
def test_multiply_in_place_writes_the_product(ns: Any) -> None:
    # tensorplay 1.0's t.mul_(tensor) leaves t as it was; masks and remove() rely on it.
    t = ns.tensor([0.0, 1.0, 2.0, 3.0])
    result = multiply_(t, ns.tensor([1.0, 0.0, 1.0, 0.0]))
    assert result is t
    assert t.tolist() == [0.0, 0.0, 2.0, 0.0]


def test_nuclear_norm_works_after_scipy_is_imported() -> None:
    # tensorplay 1.0 looks for LAPACK among the libraries loaded in the process; with
    # scipy's loaded first, its own decompositions fail. A fresh process shows it.
    pytest.importorskip("scipy")
    script = """
import scipy.linalg
import tensorplay as tp
import prunekit as prune

m = tp.nn.Conv1d(4, 6, 3)
with tp.no_grad():
    m.weight.copy_(tp.arange(72, dtype=tp.float32).reshape(6, 4, 3) % 7)
prune.ln_structured(m, "weight", 2, "nuc", 0)
print(m.weight_mask.sum(dim=[1, 2]).tolist())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    reference = TORCH.nn.Conv1d(4, 6, 3)
    with torch.no_grad():
        reference.weight.copy_(torch.arange(72, dtype=torch.float32).reshape(6, 4, 3) % 7)
    torch_prune.ln_structured(reference, "weight", 2, "nuc", 0)
    assert done.stdout.strip() == str(reference.weight_mask.sum(dim=[1, 2]).tolist())


@pytest.mark.parametrize("kind", ["linear", "conv2d"])
def test_frobenius_norm_is_the_2_norm_of_each_channel(framework: Framework, kind: str) -> None:
    # Channel 0 holds one 2.5 (L1 = L2 = 2.5), channel 1 only 0.5s (L1 >= 2.5, L2 <= 1.5):
    # the 1-norm would prune channel 0, the Frobenius norm prunes channel 1.
    m = make(framework, kind, small=True)
    shape = tuple(m.weight.shape)
    size = m.weight.numel() // 2
    values = [2.5] + [0.0] * (size - 1) + [0.5] * size
    with framework.ns.no_grad():
        m.weight.copy_(framework.tensor(values).reshape(shape))
    reference = make(TORCH, kind, small=True)
    TORCH.copy_parameters(m, reference)
    prune.ln_structured(m, "weight", 1, "fro", 0)
    assert m.weight_mask.reshape((2, size)).tolist() == [[1.0] * size, [0.0] * size]
    if kind == "linear":  # torch.nn.utils.prune takes 'fro' over one or two dims only
        torch_prune.ln_structured(reference, "weight", 1, "fro", 0)
        assert reference.weight_mask.tolist() == m.weight_mask.tolist()


@pytest.mark.parametrize("amount", [0.35, 40])
def test_global_unstructured_same_as_torch(amount: float) -> None:
    pairs = [torch_and_tensorplay("linear", 1), torch_and_tensorplay("conv2d", 2)]
    for lib, fw, side in ((torch_prune, TORCH, 0), (prune, TP, 1)):
        first, second = (pair[side] for pair in pairs)
        lib.l1_unstructured(first, "weight", 0.2)
        lib.global_unstructured(
            [(first, "weight"), (second, "weight"), (second, "bias")],
            pruning_method=lib.L1Unstructured,
            importance_scores={(second, "weight"): ramp(fw, second)},
            amount=amount,
        )
    for reference, other in pairs:
        assert masks_of(other) == masks_of(reference)
    assert isinstance(
        pairs[0][1]._forward_pre_hooks[next(iter(pairs[0][1]._forward_pre_hooks))],
        prune.PruningContainer,
    )


# -- tie-breaking: the portable selection path gives torch's selection, ties included


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 6),
    data=st.data(),
)
def test_ties_are_broken_alike(rows: int, cols: int, data: st.DataObject) -> None:
    values = data.draw(
        st.lists(
            st.sampled_from([-2.0, -1.0, 0.0, 1.0, 2.0]), min_size=rows * cols, max_size=rows * cols
        )
    )
    count = data.draw(st.integers(0, rows * cols))
    channels = data.draw(st.integers(0, rows))
    masks = []
    for fw in (TORCH, TP):
        t = fw.tensor(values).reshape((rows, cols))
        unstructured = prune.L1Unstructured(count).compute_mask(t, fw.ns.ones_like(t))
        structured = prune.LnStructured(channels, 1, 0).compute_mask(t, fw.ns.ones_like(t))
        masks.append((unstructured.tolist(), structured.tolist()))
    assert masks[0] == masks[1]
    assert sum(row.count(0.0) for row in masks[1][0]) == count


# -- rollback and framework detection


def snapshot(m: Any) -> tuple[Any, ...]:
    """Parameters, buffers, tensor attributes (objects and values) and hooks of `m`."""
    return (
        {k: (id(v), v.tolist()) for k, v in m._parameters.items() if v is not None},
        {k: v.tolist() for k, v in m._buffers.items()},
        {k: (id(v), v.tolist()) for k, v in m.__dict__.items() if is_tensor(v)},
        list(m._forward_pre_hooks.values()),
        list(m._load_state_dict_post_hooks.values()),
    )


def test_failed_call_leaves_tensorplay_module_as_it_was() -> None:
    m = TP.nn.Linear(4, 3)
    prune.l1_unstructured(m, "weight", 2)
    before = snapshot(m)
    with pytest.raises(ValueError, match="amount=99"):
        prune.l1_unstructured(m, "weight", 99)
    with pytest.raises(ValueError, match="importance_scores have shape"):
        prune.ln_structured(m, "weight", 1, 2, 0, importance_scores=TP.tensor([1.0, 2.0]))
    assert snapshot(m) == before


def test_failure_while_the_tensorplay_module_changes_rolls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fresh, pruned = TP.nn.Linear(4, 3), TP.nn.Linear(4, 3)
    prune.l1_unstructured(pruned, "weight", 2)
    for m in (fresh, pruned):
        before = snapshot(m)

        def boom(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("failed mid-way")

        monkeypatch.setattr(type(m), "register_forward_pre_hook", boom)
        monkeypatch.setattr(prune.PruningContainer, "add_pruning_method", boom)
        with pytest.raises(RuntimeError, match="failed mid-way"):
            prune.l1_unstructured(m, "weight", 1)
        monkeypatch.undo()
        assert snapshot(m) == before


def test_framework_of_objects() -> None:
    class Net(tp.nn.Module):
        pass

    class TorchNet(torch.nn.Module):
        pass

    assert framework_of(Net()) == "tensorplay"
    assert framework_of(TP.nn.Linear(2, 2).weight) == "tensorplay"
    assert framework_of(TP.tensor([1.0])) == "tensorplay"
    assert framework_of(TorchNet()) == "torch"
    assert framework_of(torch.ones(1).as_subclass(type("Sub", (torch.Tensor,), {}))) == "torch"
    assert namespace(Net()) is tp
    with pytest.raises(
        TypeError, match=r"invalid object of type builtins\.list; expected a torch or tensorplay"
    ):
        framework_of([1.0])
    with pytest.raises(
        TypeError, match="where: invalid scores of type list; expected a torch or tensorplay object"
    ):
        common_namespace("where", scores=[1.0])


def test_tensor_and_dtype_helpers(framework: Framework) -> None:
    layer = framework.nn.Linear(2, 2)
    assert is_tensor(layer.weight) and is_tensor(framework.ns.ones(2))
    assert not is_tensor(layer) and not is_tensor([1.0]) and not is_tensor(None)
    assert is_module(layer) and is_module(framework.nn.Sequential(layer))
    assert not is_module(layer.weight) and not is_module("Linear")
    assert dtype_name(framework.ns.float16) == "float16"
    assert dtype_name(layer.weight.dtype) == "float32"


def test_objects_of_unhashable_classes_are_neither_tensors_nor_modules() -> None:
    # A metaclass with __eq__ and no __hash__ makes its classes unhashable.
    class Meta(type):
        def __eq__(cls, other: object) -> bool:
            return cls is other

        __hash__ = None  # type: ignore[assignment]

    class Odd(metaclass=Meta):
        pass

    assert not is_tensor(Odd()) and not is_module(Odd())
    with pytest.raises(TypeError, match="expected a torch or tensorplay"):
        framework_of(Odd())


def test_seeded_rand_depends_only_on_the_seed(framework: Framework) -> None:
    ns = framework.ns
    framework.seed(11)
    expected_next = ns.rand(4).tolist()
    framework.seed(11)
    first = seeded_rand(ns, 6, seed=3, device=ns.ones(1).device).tolist()
    assert ns.rand(4).tolist() == expected_next  # the global RNG went on as if untouched
    assert seeded_rand(ns, 6, seed=3).tolist() == first
    assert seeded_rand(ns, 6, seed=4).tolist() != first
    assert all(0.0 <= v < 1.0 for v in first)


MIXED_CALLS: dict[str, Callable[[Any, Framework], Any]] = {
    "importance_scores": lambda m, other: prune.l1_unstructured(
        m, "weight", 1, importance_scores=other.tensor([[1.0] * 4] * 3)
    ),
    "custom_from_mask": lambda m, other: prune.custom_from_mask(
        m, "weight", other.tensor([[1.0] * 4] * 3)
    ),
    "global_modules": lambda m, other: prune.global_unstructured(
        [(m, "weight"), (other.nn.Linear(4, 3), "weight")], prune.L1Unstructured, amount=2
    ),
    "global_scores": lambda m, other: prune.global_unstructured(
        [(m, "weight")],
        prune.L1Unstructured,
        importance_scores={(m, "weight"): other.tensor([[1.0] * 4] * 3)},
        amount=2,
    ),
}


@pytest.mark.parametrize("call", sorted(MIXED_CALLS))
def test_mixing_frameworks_is_a_clear_error(framework: Framework, call: str) -> None:
    other = TP if framework.name == "torch" else TORCH
    m = framework.nn.Linear(4, 3)
    prune.l1_unstructured(m, "bias", 1)
    before = snapshot(m)
    with pytest.raises(TypeError, match="cannot mix torch and tensorplay") as info:
        MIXED_CALLS[call](m, other)
    assert f"a {framework.name} " in str(info.value) and f"a {other.name} " in str(info.value)
    assert snapshot(m) == before


def test_prune_rejects_mixed_tensors() -> None:
    method = prune.L1Unstructured(1)
    with pytest.raises(TypeError, match=r"L1Unstructured\.prune: cannot mix"):
        method.prune(TP.tensor([1.0, 2.0]), default_mask=torch.ones(2))
    with pytest.raises(TypeError, match="importance_scores is a torch tensor"):
        method.prune(TP.tensor([1.0, 2.0]), importance_scores=torch.ones(2))
    assert method.prune(TP.tensor([3.0, -1.0, 2.0])).tolist() == [3.0, 0.0, 2.0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nuclear_norm_below_float32_is_a_clear_error(framework: Framework, dtype: str) -> None:
    m = getattr(framework.nn.Conv1d(2, 4, 3), "half" if dtype == "float16" else dtype)()
    before = snapshot(m)
    with pytest.raises(
        TypeError, match=f"n='nuc' .* cannot run on dtype .*{dtype}; expected float32 or float64"
    ):
        prune.ln_structured(m, "weight", 1, "nuc", 0)
    assert snapshot(m) == before


def test_checkpoint_files_refuse_tensorplay_models_and_say_what_works(tmp_path: Any) -> None:
    nn = TP.nn
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    prune.l1_unstructured(model[0], "weight", 0.5)
    path = tmp_path / "pruned.pt"
    with pytest.raises(TypeError, match=r"save_pruned: .*tensorplay\.save\(model\.state_dict"):
        prune.save_pruned(model, path)
    assert not path.exists()
    fresh = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    with pytest.raises(TypeError, match=r"load_pruned: .*load_pruned_state_dict\(model, tensorp"):
        prune.load_pruned(fresh, path)
    # What the errors advise works:
    tp.save(model.state_dict(), str(path))
    prune.load_pruned_state_dict(fresh, tp.load(str(path)))
    assert fresh[0].weight_mask.tolist() == model[0].weight_mask.tolist()
    x = TP.randn(3, 4)
    assert fresh(x).tolist() == model(x).tolist()


@pytest.mark.parametrize(
    "call",
    [
        lambda layer: prune.l1_unstructured(layer, "weight", 0.4),
        lambda layer: prune.RandomStructured.apply(layer, "weight", 1, dim=0),
        lambda layer: prune.global_unstructured(
            [(layer, "weight")], prune.L1Unstructured, amount=2
        ),
    ],
    ids=["function", "class apply", "global"],
)
def test_tensorplay_transposed_convolution_warning_points_at_the_callers_line(
    call: Callable[[Any], Any],
) -> None:
    layer = TP.nn.ConvTranspose2d(3, 4, 2)
    with pytest.warns(UserWarning, match="outputs while pruned may be stale") as record:
        call(layer)
    assert [(w.filename, w.lineno) for w in record] == [(__file__, call.__code__.co_firstlineno)]


@pytest.mark.parametrize("kind", ["ConvTranspose2d", "ConvTranspose3d"])
def test_tensorplay_transposed_convolutions_warn_and_remove_makes_them_right(kind: str) -> None:
    layer = getattr(TP.nn, kind)(3, 4, 2)
    with pytest.warns(UserWarning, match=r"outputs while pruned may be stale.*remove\(\)"):
        prune.l1_unstructured(layer, "weight", 0.4)
    optimizer = tp.optim.SGD(layer.parameters(), lr=0.5)
    x = TP.randn(2, 3, *([4] * (int(kind[-2]))), seed=3)
    for _ in range(3):
        optimizer.zero_grad()
        layer(x).square().mean().backward()
        optimizer.step()
    prune.remove(layer, "weight")
    reference = getattr(torch.nn.functional, "conv_transpose" + kind[-2:].lower())(
        TORCH.tensor(x), TORCH.tensor(layer.weight), TORCH.tensor(layer.bias)
    )
    with tp.no_grad():
        output = layer(x)
    assert torch.allclose(TORCH.tensor(output), reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("fw_name", "kind"),
    [("torch", "ConvTranspose2d"), ("tensorplay", "Conv2d"), ("tensorplay", "ConvTranspose1d")],
)
def test_no_warning_where_the_framework_is_safe(fw_name: str, kind: str) -> None:
    layer = getattr(Framework(fw_name).nn, kind)(3, 4, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prune.l1_unstructured(layer, "weight", 0.4)


# -- a tensorplay network pruned, trained while pruned, then made permanent

PRUNINGS: dict[str, Callable[[Any], None]] = {
    "identity": lambda net: [prune.identity(layer, "weight") for layer in (net[0], net[3])],
    "random_unstructured": lambda net: [
        prune.random_unstructured(layer, "weight", 0.5) for layer in (net[0], net[3])
    ],
    "l1_unstructured": lambda net: [
        prune.l1_unstructured(layer, "weight", 0.5) for layer in (net[0], net[3])
    ],
    "random_structured": lambda net: [
        prune.random_structured(layer, "weight", 0.5, dim=0) for layer in (net[0], net[3])
    ],
    "ln_structured": lambda net: [
        prune.ln_structured(layer, "weight", 0.5, 2, dim=1) for layer in (net[0], net[3])
    ],
    "custom_from_mask": lambda net: [
        prune.custom_from_mask(layer, "weight", stripes(TP, layer)) for layer in (net[0], net[3])
    ],
    "global_unstructured": lambda net: prune.global_unstructured(
        [(net[0], "weight"), (net[3], "weight"), (net[3], "bias")],
        prune.L1Unstructured,
        amount=0.6,
    ),
}


@pytest.mark.parametrize("method", sorted(PRUNINGS))
def test_train_pruned_tensorplay_network_then_remove(method: str) -> None:
    TP.seed(0)
    nn = TP.nn
    net = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    PRUNINGS[method](net)
    pruned = [
        (layer, name.removesuffix("_mask"))
        for layer in (net[0], net[3])
        for name in layer._buffers
        if name.endswith("_mask")
    ]
    assert len(pruned) >= 2
    originals = {(id(layer), name): getattr(layer, name + "_orig") for layer, name in pruned}
    starts = {key: orig.detach().clone() for key, orig in originals.items()}
    optimizer = tp.optim.SGD(net.parameters(), lr=0.1)
    x = TP.randn(8, 2, 6, 6, seed=1)
    y = tp.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    for _ in range(3):
        optimizer.zero_grad()
        loss = tp.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        assert math.isfinite(float(loss))
        for layer, name in pruned:
            grad = getattr(layer, name + "_orig").grad
            mask = getattr(layer, name + "_mask")
            assert bool((grad[mask == 0] == 0).all()), f"{method}: gradient leaks into {name}"
            assert bool((grad[mask == 1] != 0).any())
        optimizer.step()
    for layer, name in pruned:
        orig, mask = getattr(layer, name + "_orig"), getattr(layer, name + "_mask")
        start = starts[(id(layer), name)]
        assert (orig[mask == 0]).tolist() == (start[mask == 0]).tolist()
        assert (orig[mask == 1]).tolist() != (start[mask == 1]).tolist()
    output = net(x).tolist()
    expected = {
        key: (orig * getattr(layer, key[1] + "_mask")).tolist()
        for (layer, _), (key, orig) in zip(pruned, originals.items(), strict=True)
    }
    for layer, name in pruned:
        prune.remove(layer, name)
    assert not prune.is_pruned(net)
    assert not any(name.endswith(("_orig", "_mask")) for name, _ in net.named_parameters())
    assert not list(net.named_buffers())
    for (layer, name), (key, orig) in zip(pruned, originals.items(), strict=True):
        assert getattr(layer, name) is orig
        assert getattr(layer, name).tolist() == expected[key]
    assert net(x).tolist() == output
