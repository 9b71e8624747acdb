"""MultiheadAttention.out_proj pruned on its own, as torch's tutorial loop over modules() does.

MultiheadAttention reads ``out_proj.weight`` without calling out_proj, so out_proj's own
pre-hook never runs (pytorch#69353: in torch the second backward fails). prunekit refreshes
it when the attention module is called.
"""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit as prune
from helpers.attention_block import Block, prune_like_the_tutorial, train_and_compare
from helpers.frameworks import Framework


def test_torch_fails_the_second_backward() -> None:
    """The issue itself, in torch: what the test below checks prunekit does not do."""
    model = Block()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prune_like_the_tutorial(model, torch_prune)
    x = torch.randn(5, 2, 8)
    model(x).sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        model(x).sum().backward()


def test_the_tutorial_loop_trains_correctly() -> None:
    model = Block()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either: nothing is wrong any more
        prune_like_the_tutorial(model)
    train_and_compare(model)


def test_out_proj_is_refreshed_once_per_call_when_pruned_through_the_parent() -> None:
    """The dotted name's refresh (on the parent) is not repeated by the out_proj one."""
    model = Block()
    prune.l1_unstructured(model.attn, "out_proj.weight", 0.3)
    other = nn.MultiheadAttention(8, 2)
    prune.l1_unstructured(other.out_proj, "weight", 0.3)  # the out_proj refresh is on
    hook = next(iter(model.attn.out_proj._forward_pre_hooks.values()))
    calls = []
    real = hook.apply_mask
    hook.apply_mask = lambda module: calls.append(module) or real(module)  # type: ignore[method-assign]
    x = torch.randn(5, 2, 8)
    model(x).sum().backward()
    assert calls == [model.attn.out_proj]
    train_and_compare(model)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_copies_train_correctly(how: str) -> None:
    model = Block()
    prune_like_the_tutorial(model)
    x = torch.randn(5, 2, 8)
    model(x).sum().backward()  # after a step, as copies are usually made
    if how == "deepcopy":
        copied = copy.deepcopy(model)
    elif how == "pickle":
        copied = pickle.loads(pickle.dumps(model))
    else:
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        copied = torch.load(buffer, weights_only=False)
    train_and_compare(copied)
    train_and_compare(model)


UNPICKLE_AND_TRAIN = """
import pickle, sys, torch
model = pickle.loads(sys.stdin.buffer.read())
opt = torch.optim.SGD(model.parameters(), lr=0.5)
x = torch.randn(5, 2, 8)
out_proj = model.out_proj
for _ in range(3):
    opt.zero_grad()
    out = model(x, x, x)[0]
    assert torch.equal(out_proj.weight, out_proj.weight_orig * out_proj.weight_mask)
    out.sum().backward()
    assert out_proj.weight_orig.grad is not None and out_proj.weight_orig.grad.any()
    opt.step()
print("trained")
"""


def test_a_model_unpickled_in_a_fresh_process_trains() -> None:
    """The refresh is set up again where the model is loaded, before any pruning call."""
    model = nn.MultiheadAttention(8, 2)
    prune.l1_unstructured(model.out_proj, "weight", 0.3)
    done = subprocess.run(
        [sys.executable, "-c", UNPICKLE_AND_TRAIN],
        input=pickle.dumps(model),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().strip() == "trained"


def test_remove_makes_out_proj_plain_again() -> None:
    model = Block()
    prune_like_the_tutorial(model)
    x = torch.randn(5, 2, 8)
    model(x).sum().backward()
    prune.remove(model.attn.out_proj, "weight")
    assert isinstance(model.attn.out_proj._parameters["weight"], nn.Parameter)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(2):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()


def test_out_proj_refresh_on_tensorplay() -> None:
    tp = Framework("tensorplay")
    mha = tp.nn.MultiheadAttention(8, 2)
    prune.l1_unstructured(mha.out_proj, "weight", 0.3)
    opt = tp.ns.optim.SGD(mha.parameters(), lr=0.5)
    x = tp.randn(5, 2, 8)
    for _ in range(3):
        opt.zero_grad()
        out = mha(x, x, x)[0]
        masked = mha.out_proj.weight_orig * mha.out_proj.weight_mask
        assert tp.equal(mha.out_proj.weight, masked)  # refreshed by this call
        out.sum().backward()
        opt.step()
