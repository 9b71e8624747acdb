"""The default of `sequential`: 'layers' for SparseGPT, block by block (True) for every other
method and over ranks, one pass (False) for Wanda's global ranking. Wanda on a decoder ranks
from norms calibrated block by block, as llm-compressor's Wanda does ('layers' moved
SmolLM2-135M's perplexity on five domains both ways: benchmarks/domains_llmcompressor.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import prunekit as prune
from prunekit.whole import Config
from prunekit.whole.registry import default_sequential

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("method", "ranks", "expected"),
    [("sparsegpt", False, "layers"), ("sparsegpt", True, True), ("wanda", False, True),
     ("wanda", True, True), ("taylor", False, True), ("l1", False, True)],
)  # fmt: skip
def test_the_default_by_method_and_ranks(method: str, ranks: bool, expected: bool | str) -> None:
    assert default_sequential(method, ranks) == expected
    made = Config(method=method, amount=0.5, ranks=ranks)
    assert made.sequential is None and made.chosen_sequential == expected


def test_wanda_ranked_globally_takes_one_pass_unless_told_otherwise() -> None:
    assert default_sequential("wanda", False, "global") is False
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    other = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    other.load_state_dict(model.state_dict())
    batches = [torch.randn(5, 8) for _ in range(3)]
    prune.prune_model(model, 0.5, method="wanda", scope="global", calibration=batches)
    prune.prune_model(
        other, 0.5, method="wanda", scope="global", sequential=False, calibration=batches
    )
    masks = [(n, b) for n, b in model.named_buffers() if n.endswith("_mask")]
    assert masks
    for (name, got), want in zip(
        masks, [b for n, b in other.named_buffers() if n.endswith("_mask")], strict=True
    ):
        assert torch.equal(got, want), name
    with pytest.raises(ValueError, match=r"scope='global' .*sequential=True"):
        prune.prune_model(
            model, 0.5, method="wanda", scope="global", sequential=True, calibration=batches
        )


def _masks(pattern: str, **options: bool | str) -> dict[str, torch.Tensor]:
    """The masks Wanda leaves on a tiny Llama (a decoder: causal attention)."""
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model: nn.Module = transformers.LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, 64, (1, 24), generator=generator)} for _ in range(4)]
    prune.prune_model(model, 0.5, method="wanda", pattern=pattern, calibration=batches,
                      progress=False, **options)  # type: ignore[arg-type]  # fmt: skip
    return {n: b.clone() for n, b in model.named_buffers() if n.endswith("_mask")}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("pattern", ["row", "2:4"])
def test_wanda_on_a_decoder_calibrates_block_by_block(pattern: str) -> None:
    default = _masks(pattern)
    assert len(default) == 2 * 7  # every Linear of both blocks, not the head
    assert _same(default, _masks(pattern, sequential=True))
    # The two modes give different masks here, so the check above tells them apart.
    assert not _same(default, _masks(pattern, sequential="layers"))
