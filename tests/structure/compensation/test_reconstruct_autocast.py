"""reconstruct_blocks under torch.autocast: its steps see the weights they change."""

from __future__ import annotations

import copy

import torch
from tests.helpers.tiny_llm import llama
from torch import Tensor, nn

from prunekit.structure import reconstruct_blocks


def _pair() -> tuple[nn.Module, nn.Module, list[Tensor], list[Tensor]]:
    """A tiny Llama of 2 blocks and a copy with half the input columns of each block's
    output projections zeroed (plain parameters, as a compacted model has), calibration
    and held-out batches."""
    reference = llama(layers=2)
    model = copy.deepcopy(reference)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            for linear in (layer.mlp.down_proj, layer.self_attn.o_proj):
                keep = torch.rand(linear.weight.shape[1], generator=generator) > 0.5
                linear.weight.mul_(keep)
    generator = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, 300, (4, 32), generator=generator) for _ in range(4)]
    held_out = [torch.randint(0, 300, (4, 32), generator=generator) for _ in range(4)]
    return model, reference, batches, held_out


def _error(model: nn.Module, reference: nn.Module, batches: list[Tensor]) -> float:
    """The logits' squared error relative to the reference's, in float32."""
    error = scale = 0.0
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        for batch in batches:
            ours, theirs = model(batch).logits.double(), reference(batch).logits.double()
            error += float((ours - theirs).square().sum())
            scale += float(theirs.square().sum())
    return error / scale


def test_under_autocast_the_steps_improve_the_model_as_in_float32() -> None:
    # autocast keeps a bfloat16 copy of each parameter it casts until its outermost
    # context ends: steps taken inside it that forward through stale copies train blind
    model, reference, batches, held_out = _pair()
    plain = copy.deepcopy(model)
    before = _error(model, reference, held_out)
    reconstruct_blocks(plain, reference, batches, steps=40, lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        errors = reconstruct_blocks(model, reference, batches, steps=40, lr=1e-3)
    after = _error(model, reference, held_out)
    assert all(last <= first for first, last in errors)
    assert errors[0][1] < 0.2 * errors[0][0]
    assert after < 0.2 * before
    assert after < 2 * _error(plain, reference, held_out)


def test_forwards_after_the_call_in_the_same_autocast_see_the_new_weights() -> None:
    model, reference, batches, _ = _pair()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            model(batches[0])  # bfloat16 copies of the weights cached
        reconstruct_blocks(model, reference, batches, steps=5, lr=1e-3)
        with torch.no_grad():
            inside = model(batches[0]).logits
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fresh = model(batches[0]).logits
    assert torch.equal(inside, fresh)
    assert torch.is_autocast_cache_enabled()  # the caller's setting is back
