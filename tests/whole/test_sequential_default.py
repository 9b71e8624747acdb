"""The default of `sequential`: 'layers' for SparseGPT, and for Wanda on a model whose
attention is causal (a decoder); block by block (True) otherwise, and over ranks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
from prunekit.whole import Config
from prunekit.whole.registry import default_sequential

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("method", "ranks", "causal", "expected"),
    [("sparsegpt", False, False, "layers"), ("sparsegpt", False, True, "layers"),
     ("sparsegpt", True, True, True), ("wanda", False, True, "layers"),
     ("wanda", False, False, True), ("wanda", True, True, True), ("taylor", False, True, True),
     ("l1", False, True, True)],
)  # fmt: skip
def test_the_default_by_method_ranks_and_attention(
    method: str, ranks: bool, causal: bool, expected: bool | str
) -> None:
    assert default_sequential(method, ranks, causal) == expected
    made = Config(method=method, amount=0.5, ranks=ranks, causal=causal)
    assert made.sequential == expected
    # A value given is kept, whatever the model.
    assert Config(method=method, amount=0.5, causal=causal, sequential=True).sequential is True


def test_causal_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"Config: invalid causal='yes'; expected True or False"):
        Config(method="wanda", amount=0.5, causal="yes")  # type: ignore[arg-type]


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()  # type: ignore[no-any-return]


def _bert() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.BertModel(config, add_pooling_layer=False).eval()  # type: ignore[no-any-return]


def _masks(make: Any, pattern: str, **options: Any) -> dict[str, torch.Tensor]:
    """The masks Wanda leaves on a fresh model of `make` with `options`."""
    model = make()
    generator = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, 64, (1, 24), generator=generator)} for _ in range(4)]
    prune.prune_model(model, 0.5, method="wanda", pattern=pattern, calibration=batches,
                      progress=False, **options)  # fmt: skip
    return {n: b.clone() for n, b in model.named_buffers() if n.endswith("_mask")}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("pattern", ["row", "2:4"])
def test_wanda_on_a_decoder_calibrates_group_by_group(pattern: str) -> None:
    default = _masks(_llama, pattern)
    assert len(default) == 2 * 7
    assert _same(default, _masks(_llama, pattern, sequential="layers"))
    assert not _same(default, _masks(_llama, pattern, sequential=True))


@pytest.mark.parametrize("pattern", ["row", "2:4"])
def test_wanda_on_an_encoder_calibrates_block_by_block(pattern: str) -> None:
    default = _masks(_bert, pattern)
    assert len(default) == 2 * 6
    assert _same(default, _masks(_bert, pattern, sequential=True))
    assert not _same(default, _masks(_bert, pattern, sequential="layers"))


def test_a_config_made_by_hand_keeps_its_sequential() -> None:
    """Made without the model, Config takes the default of a model without causal
    attention; prune_model keeps a Config as it was made."""
    made = Config(method="wanda", amount=0.5, progress=False)
    assert made.sequential is True
    model = _llama()
    generator = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, 64, (1, 24), generator=generator)} for _ in range(4)]
    prune.prune_model(model, config=made, calibration=batches)
    masks = {n: b for n, b in model.named_buffers() if n.endswith("_mask")}
    assert _same(masks, _masks(_llama, "row", sequential=True))
