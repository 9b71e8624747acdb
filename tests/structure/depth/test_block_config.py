"""prune_blocks(config=...): one BlockConfig in place of the keywords, which still work."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import prunekit
from helpers.model_state import fingerprint
from prunekit import BlockConfig

T = pytest.importorskip("transformers")


def calibration() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [{"input_ids": torch.randint(0, 100, (2, 16), generator=g)} for _ in range(3)]


def llama(layers: int = 6) -> Any:
    config = T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                           tie_word_embeddings=False)  # fmt: skip
    return T.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize(
    "options",
    [{"count": 2, "criterion": "influence"}, {"amount": 0.5, "criterion": "angular", "ridge": 0.0}],
)
def test_a_config_skips_as_its_keywords_do(options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    by_keywords = llama()
    by_config = llama()
    by_config.load_state_dict(by_keywords.state_dict())
    expected = prunekit.prune_blocks(by_keywords, calibration(), **options)
    found = prunekit.prune_blocks(by_config, calibration(), config=BlockConfig(**options))
    assert found == expected
    assert prunekit.skipped_blocks(by_config) == prunekit.skipped_blocks(by_keywords)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: BlockConfig(2, criterion="cosine"), ValueError, r"unknown criterion='cosine'"),
        (lambda: BlockConfig(2, replace="cubic"), ValueError, r"invalid replace='cubic'"),
        (lambda: BlockConfig(2, ridge=-1.0), ValueError, r"invalid ridge=-1.0"),
        (
            lambda: dataclasses.replace(BlockConfig(2), ridge=float("inf")),
            ValueError,
            "invalid ridge=inf",
        ),
    ],
)
def test_a_config_is_checked_when_made(make: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=r"^prune_blocks: " + message):
        make()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        ({"count": 2, "config": BlockConfig(2)}, ValueError,
         r"config= holds every option, but count=2 came beside it"),
        ({"config": BlockConfig(2), "ridge": 0.1}, ValueError,
         r"config= holds every option, but ridge= came beside it"),
        ({"config": {"count": 2}}, TypeError, r"invalid config=\{'count': 2\}"),
        ({"count": 2, "ridg": 0.1}, TypeError, r"unexpected keyword argument 'ridg'"),
    ],
)  # fmt: skip
def test_bad_calls_are_refused_and_leave_the_model_alone(
    call: dict[str, Any], error: type[Exception], message: str
) -> None:
    model = llama(4)
    before = fingerprint(model)
    with pytest.raises(error, match=r"^prune_blocks: " + message):
        prunekit.prune_blocks(model, calibration(), **call)
    assert fingerprint(model) == before
