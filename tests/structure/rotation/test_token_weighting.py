"""rotate_hidden(unit_tokens=...): the principal directions from unit-length token vectors
(the default) or from the vectors as they are."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers import tiny_llm
from prunekit.structure.rotation.family import find_stream
from prunekit.structure.rotation.pca import second_moments

pytest.importorskip("transformers")

BATCHES = [torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(k))
           for k in range(3)]  # fmt: skip
IDS = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(5))


def model() -> Any:
    return tiny_llm.llama(vocab=300, layers=2)


def norm_inputs(built: nn.Module) -> list[Tensor]:
    """Every token vector at each norm the stream is read at, in float64."""
    stream = find_stream(built)
    seen: list[list[Tensor]] = [[] for _ in stream.readings]
    handles = [
        r.norm.register_forward_pre_hook(
            lambda _m, args, k=k: seen[k].append(args[0].detach().reshape(-1, 32).double())
        )
        for k, r in enumerate(stream.readings)
    ]
    with torch.no_grad():
        for batch in BATCHES:
            built(input_ids=batch)
    for handle in handles:
        handle.remove()
    return [torch.cat(x) for x in seen]


def test_second_moments_count_unit_or_raw_token_vectors() -> None:
    built = model()
    stream = find_stream(built)
    inputs = norm_inputs(built)
    unit = second_moments(built, stream, BATCHES)
    raw = second_moments(built, stream, BATCHES, unit_tokens=False)
    for x, u, r in zip(inputs, unit, raw, strict=True):
        scaled = x / x.norm(dim=1, keepdim=True)
        assert torch.allclose(u, scaled.T @ scaled, rtol=1e-9, atol=1e-9)
        assert torch.allclose(r, x.T @ x, rtol=1e-9, atol=1e-9)
        assert not torch.allclose(u, r)


def test_raw_weighting_changes_the_slice_and_keeps_rotation_exact() -> None:
    dense = model()
    with torch.no_grad():
        want = dense(input_ids=IDS).logits
    rotated = model()
    prunekit.rotate_hidden(rotated, BATCHES, unit_tokens=False)
    with torch.no_grad():
        got = rotated(input_ids=IDS).logits
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    unit, raw = model(), model()
    prunekit.rotate_hidden(unit, BATCHES, 0.25)
    prunekit.rotate_hidden(raw, BATCHES, 0.25, unit_tokens=False)
    first = unit.model.layers[0].self_attn.q_proj.weight
    assert first.shape == raw.model.layers[0].self_attn.q_proj.weight.shape == (32, 24)
    assert not torch.allclose(first, raw.model.layers[0].self_attn.q_proj.weight)


def test_unit_tokens_must_be_a_bool_and_a_refusal_leaves_the_model() -> None:
    built = model()
    before = {k: v.clone() for k, v in built.state_dict().items()}
    with pytest.raises(TypeError, match=r"rotate_hidden: invalid unit_tokens=1; expected a bool"):
        prunekit.rotate_hidden(built, BATCHES, 0.25, unit_tokens=1)  # type: ignore[arg-type]
    after = built.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert built.config.hidden_size == 32
