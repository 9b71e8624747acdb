"""Hostile cases of rotate_hidden(..., unit_tokens=...): the argument's checks, the rotated
model before removal against the model, calibration that counts no token, and a call that
fails at its very end (config written) or is interrupted mid-calibration."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import prunekit
import prunekit.structure.rotation.rotate as rotate
from helpers import tiny_llm

pytest.importorskip("transformers")

VOCAB = 96


def model(tied: bool = True) -> Any:
    return tiny_llm.llama(vocab=VOCAB, layers=2, tied=tied)


def batches() -> list[Any]:
    torch.manual_seed(11)
    ids = torch.randint(0, VOCAB, (2, 10))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return [ids, {"input_ids": ids, "attention_mask": mask}]


def snapshot(built: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any], bool, list[int]]:
    state = {k: v.clone() for k, v in built.state_dict().items()}
    tied = built.lm_head.weight is built.model.embed_tokens.weight
    widths = [m.in_features for m in built.modules() if isinstance(m, torch.nn.Linear)]
    return state, built.config.to_dict(), tied, widths


def assert_unchanged(built: Any, before: tuple[Any, ...]) -> None:
    state, config, tied, widths = snapshot(built)
    assert set(state) == set(before[0])
    for name, tensor in state.items():
        assert torch.equal(tensor, before[0][name]), name
    assert config == before[1]
    assert tied == before[2] and widths == before[3]


@pytest.mark.parametrize("value", [1, 0, None, "yes", 1.0, torch.tensor(True)])
def test_a_unit_tokens_that_is_no_bool_is_named_and_the_model_left(value: object) -> None:
    built = model()
    before = snapshot(built)
    with pytest.raises(TypeError) as raised:
        prunekit.rotate_hidden(built, batches(), 0.25, unit_tokens=value)  # type: ignore[arg-type]
    message = str(raised.value)
    assert "rotate_hidden" in message and f"unit_tokens={value!r}" in message
    assert "bool" in message
    assert_unchanged(built, before)


@pytest.mark.parametrize("unit_tokens", [True, False])
@pytest.mark.parametrize("tied", [True, False])
def test_rotation_alone_computes_what_the_model_did(unit_tokens: bool, tied: bool) -> None:
    built = model(tied).double()
    rotated = copy.deepcopy(built)
    report = prunekit.rotate_hidden(rotated, batches(), 0.0, unit_tokens=unit_tokens)
    assert report.width_after == report.width_before == 32 and report.energy == 1.0
    assert report.untied == tied
    assert rotated.config.tie_word_embeddings is False or not tied
    for batch in batches():
        ids = batch if isinstance(batch, torch.Tensor) else batch["input_ids"]
        with torch.no_grad():
            want, got = built(ids).logits, rotated(ids).logits
        # the family's RMSNorm computes in float32 whatever the model's dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert want.abs().max() > 0.05


def test_rotation_that_matters_moves_the_weights() -> None:
    """The exactness above is not the identity: the stream is rotated for real."""
    built = model(False)
    rotated = copy.deepcopy(built)
    prunekit.rotate_hidden(rotated, batches(), 0.0)
    moved = rotated.model.embed_tokens.weight - built.model.embed_tokens.weight
    assert moved.abs().max() > 1e-3


@pytest.mark.parametrize("unit_tokens", [True, False])
def test_calibration_that_counts_no_token_is_refused(unit_tokens: bool) -> None:
    """Every attention_mask all zero: no direction is measured; the call would cut the
    width along an arbitrary basis and report an energy of 0."""
    built = model()
    before = snapshot(built)
    ids = torch.randint(0, VOCAB, (2, 8))
    empty = [{"input_ids": ids, "attention_mask": torch.zeros_like(ids)}]
    with pytest.raises(ValueError) as raised:
        prunekit.rotate_hidden(built, empty, 0.25, unit_tokens=unit_tokens)
    message = str(raised.value)
    assert "rotate_hidden" in message and "attention_mask" in message
    assert_unchanged(built, before)


def test_a_failure_after_the_config_is_written_leaves_model_and_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = model(tied=True)
    before = snapshot(built)
    real = rotate._set_config

    def failing(*args: Any) -> None:
        real(*args)
        assert built.config.hidden_size == 24  # written by now
        raise RuntimeError("late failure")

    monkeypatch.setattr(rotate, "_set_config", failing)
    with pytest.raises(RuntimeError, match="late failure"):
        prunekit.rotate_hidden(built, batches(), 0.25, unit_tokens=False)
    assert_unchanged(built, before)
    assert built.model.embed_tokens.embedding_dim == 32
    ids = batches()[0]
    with torch.no_grad():
        assert built(ids).logits.shape == (2, 10, VOCAB)  # the model still runs


def test_an_interrupt_mid_calibration_leaves_the_model_without_hooks() -> None:
    built = model()
    before = snapshot(built)
    seen = []

    def interrupting(module: Any, args: Any) -> None:
        seen.append(1)
        if len(seen) == 4:
            raise KeyboardInterrupt

    handle = built.model.layers[1].register_forward_pre_hook(interrupting)
    with pytest.raises(KeyboardInterrupt):
        prunekit.rotate_hidden(built, batches() * 2, 0.25)
    handle.remove()
    assert_unchanged(built, before)
    hooks = [m for m in built.modules() if m._forward_pre_hooks or m._forward_hooks]
    assert hooks == []
