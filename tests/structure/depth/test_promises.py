"""Depth pruning keeps its promises under hostile use: a map folded into a pruned
projection, config fields that depend on layer indices, no tokens to score on, both
residual styles, one block at several positions, and a removal checked before it returns."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint

T = pytest.importorskip("transformers")

IDS = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(1))


def calibration(count: int = 3) -> list[dict[str, Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [{"input_ids": torch.randint(0, 100, (2, 16), generator=g)} for _ in range(count)]


def llama(layers: int = 4) -> Any:
    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                           tie_word_embeddings=False)  # fmt: skip
    return T.LlamaForCausalLM(config).eval()


def logits(model: Any, ids: Tensor = IDS) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(ids).logits
    return out


def close(a: Tensor, b: Tensor, rel: float = 1e-5) -> bool:
    return bool((a - b).abs().max() <= rel * b.abs().max())


def test_a_map_folds_into_a_projection_pruned_afterwards() -> None:
    model = llama()
    result = prunekit.prune_blocks(model, calibration(), 1, replace="linear")
    ((_, _, name),) = result.replaced
    prunekit.prune_channels(model, {"input_ids": IDS}, 0.25)
    linear = model.get_submodule(name)
    mask = linear.weight_mask.clone()
    assert not bool(mask.all())  # the projection's input channels are masked
    masked = logits(model)
    prunekit.remove_blocks(model)
    assert torch.equal(linear.weight_mask, mask)  # the mask stays, the map is in weight_orig
    assert "weight_orig" in linear._parameters and "weight" not in linear._parameters
    assert close(logits(model), masked)
    report = prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    assert report.relative_error <= 1e-4


def test_a_map_is_not_folded_through_a_mask_of_the_outputs() -> None:
    model = llama()
    result = prunekit.prune_blocks(model, calibration(), 1, replace="linear")
    ((_, _, name),) = result.replaced
    prunekit.random_unstructured(model.get_submodule(name), "weight", amount=0.3)
    before, saved = fingerprint(model), model.config.to_dict()
    with pytest.raises(ValueError, match=rf"remove_blocks: cannot fold .* into {name}: "
                       rf"{name}\.weight is pruned with a mask that differs"):  # fmt: skip
        prunekit.remove_blocks(model)
    assert fingerprint(model) == before and model.config.to_dict() == saved
    assert prunekit.skipped_blocks(model) == {"model.layers": result.skipped}


def test_no_tokens_to_score_on_is_refused() -> None:
    model = llama()
    before = fingerprint(model)
    batches = [{"input_ids": IDS, "attention_mask": torch.zeros_like(IDS)} for _ in range(2)]
    for criterion in ("angular", "influence"):
        with pytest.raises(ValueError, match=r"prune_blocks: every attention_mask of the 2 "
                           r"calibration batches is all zero"):  # fmt: skip
            prunekit.prune_blocks(model, batches, 1, criterion=criterion)
    assert fingerprint(model) == before and prunekit.skipped_blocks(model) == {}
    batches[1]["attention_mask"][0, :3] = 1  # three tokens are enough
    assert len(prunekit.prune_blocks(model, batches, 1).skipped) == 1


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.body = nn.ModuleList([nn.Linear(8, 8), block, block, block])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.body:
            x = layer(x)
        return x


def test_one_block_object_at_several_positions_is_refused() -> None:
    model, x = Shared(), torch.randn(4, 8)
    before = fingerprint(model)
    message = r"body holds one block object at positions \[1, 2, 3\]"
    with pytest.raises(ValueError, match=rf"skip_blocks: {message}"):
        prunekit.skip_blocks(model, [1], blocks="body")
    with pytest.raises(ValueError, match=rf"prune_blocks: {message}"):
        prunekit.prune_blocks(model, [x], 1, blocks="body")
    with pytest.raises(ValueError, match=rf"remove_blocks: {message}"):
        prunekit.remove_blocks(model, blocks="body")
    assert fingerprint(model) == before and prunekit.skipped_blocks(model) == {}
