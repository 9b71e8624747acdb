"""Pruned models survive deepcopy, pickle, torch.save/load and state_dict round trips."""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable

import pytest
import torch
from torch import nn

import prunekit as prune
from helpers.pruned_models import BUILDERS, attention, hooks, mlp, run, state, train_step


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


def test_unpickled_in_a_fresh_process_new_hooks_keep_the_pruning_hooks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch numbers hooks from a per-process counter: a pruned model loaded where the
    counter starts again (another process) must not have its pruning hooks replaced by the
    next hooks registered (compact's tracing, a user's), nor be left uncompactable."""
    from torch.utils.hooks import RemovableHandle

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
    x = torch.randn(2, 3, 10, 10)
    prune.prune_channels(model.eval(), x, 0.5)
    saved = pickle.dumps(model)
    monkeypatch.setattr(RemovableHandle, "next_id", 0)  # as in a process just started
    loaded: nn.Module = pickle.loads(saved)
    conv = loaded[0]
    before = dict(conv._forward_pre_hooks)
    for _ in range(max(before) + 1):  # as many ids as the saving process had given
        conv.register_forward_pre_hook(lambda module, args: None)
    assert all(conv._forward_pre_hooks.get(k) is h for k, h in before.items())
    with torch.no_grad():
        expected = loaded(x)
    prune.compact(loaded, x, latency_runs=0)
    assert loaded[0].out_channels == 4
    torch.testing.assert_close(loaded(x), expected)


def test_unpickled_in_a_fresh_process_new_hooks_keep_the_refresh_hooks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hooks that refresh a pruned tensor (a child's, through its parent; after a
    load_state_dict) keep their keys too when new hooks are registered after unpickling."""
    from torch.utils.hooks import RemovableHandle

    from prunekit.dropin.install import RefreshAfterLoad
    from prunekit.dropin.out_proj import RefreshSubmodule

    model = nn.Sequential(nn.Linear(4, 4))
    prune.l1_unstructured(model, "0.weight", amount=0.5)  # a child's tensor, through the parent
    saved = pickle.dumps(model)
    monkeypatch.setattr(RemovableHandle, "next_id", 0)  # as in a process just started
    loaded: nn.Module = pickle.loads(saved)
    after_load = RemovableHandle.next_id
    hooks = {
        "forward": (loaded._forward_pre_hooks, RefreshSubmodule),
        "load": (loaded[0]._load_state_dict_post_hooks, RefreshAfterLoad),
    }
    for kind, (found, refresh) in hooks.items():
        assert any(isinstance(h, refresh) for h in found.values()), kind
        before = dict(found)
        monkeypatch.setattr(RemovableHandle, "next_id", after_load)
        for _ in range(max(before) + 1):  # as many ids as the saving process had given
            if kind == "forward":
                loaded.register_forward_pre_hook(lambda module, args: None)
            else:
                loaded[0].register_load_state_dict_post_hook(lambda module, keys: None)
        assert all(found.get(k) is h for k, h in before.items()), kind
