"""Pruned models survive deepcopy, pickle, torch.save/load and state_dict round trips."""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
from model_state import bits


def hooks(model: nn.Module) -> list[tuple[str, str, list[str]]]:
    """Which pruning hooks sit where, with the methods inside containers."""
    out = []
    for path, m in model.named_modules():
        for hook in m._forward_pre_hooks.values():
            inner = [type(x).__name__ for x in getattr(hook, "_pruning_methods", ())]
            out.append((path, type(hook).__name__, inner))
    return out


def state(model: nn.Module) -> list[tuple[str, Any]]:
    return [(k, bits(v)) for k, v in model.state_dict().items()]


def mlp() -> nn.Module:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    prune.l1_unstructured(model[0], "weight", 0.3)
    prune.ln_structured(model[0], "weight", 2, n=2, dim=0)  # a container
    prune.random_unstructured(model[0], "bias", 0.25)
    prune.global_unstructured(
        [(model[0], "weight"), (model[2], "weight")], prune.L1Unstructured, amount=0.2
    )
    return model


def conv() -> nn.Module:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.Flatten(), nn.LazyLinear(3))
    model(torch.randn(1, 2, 5, 5))
    prune.ln_structured(model[0], "weight", 0.5, n=1, dim=0)
    prune.custom_from_mask(model[2], "weight", (torch.rand(3, 36) > 0.5).float())
    return model


def lstm() -> nn.Module:
    torch.manual_seed(3)
    model = nn.LSTM(4, 5, num_layers=2)
    prune.l1_unstructured(model, "weight_hh_l0", 0.5)
    prune.random_unstructured(model, "weight_ih_l1", 0.5)
    return model


def attention() -> nn.Module:
    torch.manual_seed(4)
    model = nn.MultiheadAttention(8, 2)
    prune.l1_unstructured(model, "in_proj_weight", 0.5)
    prune.l1_unstructured(model, "out_proj.weight", 0.5)
    return model


BUILDERS = {"mlp": mlp, "conv": conv, "lstm": lstm, "attention": attention}
INPUTS: dict[str, Callable[[], Any]] = {
    "mlp": lambda: (torch.randn(5, 6),),
    "conv": lambda: (torch.randn(2, 2, 5, 5),),
    "lstm": lambda: (torch.randn(3, 2, 4),),
    "attention": lambda: (torch.randn(3, 2, 8),) * 3,
}


def run(model: nn.Module, kind: str, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    out = model(*INPUTS[kind]())
    result: torch.Tensor = out[0] if isinstance(out, tuple) else out
    return result


def train_step(model: nn.Module, kind: str) -> None:
    """A forward with grad: leaves each pruned tensor a non-leaf (pytorch#37322)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    run(model, kind).square().sum().backward()
    opt.step()
    run(model, kind, seed=1).sum().backward()


def by_pickle(model: nn.Module) -> nn.Module:
    copied: nn.Module = pickle.loads(pickle.dumps(model))
    return copied


def by_torch_save(model: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    copied: nn.Module = torch.load(buffer, weights_only=False)
    return copied


COPIERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "deepcopy": copy.deepcopy,
    "pickle": by_pickle,
    "torch.save": by_torch_save,
}


@pytest.mark.parametrize("kind", BUILDERS)
@pytest.mark.parametrize("how", COPIERS)
def test_copies_are_exact_independent_and_still_pruned(kind: str, how: str) -> None:
    model = BUILDERS[kind]()
    train_step(model, kind)
    copied = COPIERS[how](model)

    assert state(copied) == state(model)
    assert hooks(copied) == hooks(model) != []
    with torch.no_grad():
        assert torch.equal(run(copied, kind), run(model, kind))
    for (_, a), (_, b) in zip(model.named_parameters(), copied.named_parameters(), strict=True):
        assert a is not b
    # Training the copy changes neither the original nor its masks, and keeps pruned zeros.
    before = state(model)
    train_step(copied, kind)
    assert state(model) == before
    for m in copied.modules():
        for hook in list(m._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                name = hook._tensor_name
                assert name is not None
                effective = getattr(m, name)
                assert torch.equal(
                    effective, getattr(m, name + "_orig") * getattr(m, name + "_mask")
                )
    # A copy of a copy (after its own forward with grad) works too.
    again = copy.deepcopy(copied)
    assert state(again) == state(copied)


@pytest.mark.parametrize("kind", BUILDERS)
def test_deepcopy_links_the_copied_weight_to_the_copied_orig(kind: str) -> None:
    model = BUILDERS[kind]()
    train_step(model, kind)
    copied = copy.deepcopy(model)
    for m in copied.modules():
        for hook in m._forward_pre_hooks.values():
            if isinstance(hook, prune.BasePruningMethod):
                assert hook._bound_module() is m
                name = hook._tensor_name
                assert name is not None
                getattr(m, name).sum().backward()
                orig = getattr(m, name + "_orig")
                assert torch.equal(orig.grad, getattr(m, name + "_mask"))


def test_copy_then_prune_again_matches_the_original() -> None:
    model = mlp()
    train_step(model, "mlp")
    copied = copy.deepcopy(model)
    for m in (model, copied):
        prune.l1_unstructured(m[0], "weight", 0.3)
        prune.remove(m[2], "weight")
    assert state(copied) == state(model)
    assert hooks(copied) == hooks(model)


@pytest.mark.parametrize("kind", BUILDERS)
def test_state_dict_round_trip_into_a_pruned_twin(kind: str) -> None:
    model = BUILDERS[kind]()
    train_step(model, kind)
    twin = BUILDERS[kind]()  # same structure and prunings, other values
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    twin.load_state_dict(torch.load(buffer, weights_only=True))
    assert state(twin) == state(model)
    with torch.no_grad():
        assert torch.equal(run(twin, kind), run(model, kind))


def test_pickled_hook_alone_and_unpickled_module_deepcopy() -> None:
    model = attention()
    train_step(model, "attention")
    loaded = by_pickle(model)
    train_step(loaded, "attention")  # non-leaf pruned tensors again
    copied = copy.deepcopy(loaded)
    assert state(copied) == state(loaded)


def test_load_state_dict_refreshes_the_pruned_attribute_without_a_forward() -> None:
    model, twin = mlp(), mlp()
    train_step(model, "mlp")
    twin.load_state_dict(model.state_dict())
    for m in (twin[0], twin[2]):
        assert torch.equal(m.weight, m.weight_orig * m.weight_mask)
    prune.remove(twin[0], "weight")
    assert len(twin[0]._load_state_dict_post_hooks) == 1  # bias is still pruned
    prune.remove(twin[0], "bias")
    prune.remove(twin[2], "weight")
    assert [len(m._load_state_dict_post_hooks) for m in twin] == [0, 0, 0]
