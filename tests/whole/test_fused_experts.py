"""prune_model with a calibrated method on a model whose experts are fused in 3-D Parameters
(transformers' MoE blocks, or any module of the kind): the method prunes Linear weights
only, so it leaves those dense; it says so once, naming each such tensor and what to do."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit as prune


class Experts(nn.Module):
    """Two experts fused in one 3-D Parameter, each a (hidden, hidden) matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, 8, 8) / 3)

    def forward(self, x: Tensor) -> Tensor:
        return torch.einsum("bi,eoi->bo", x, self.weight)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = nn.Linear(8, 8)
        self.experts = Experts()
        self.conv = nn.Conv1d(1, 2, 3)  # a 3-D weight that is no expert's
        self.head = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        y = self.experts(self.attn(x))
        out: Tensor = self.head(y + self.conv(y[:, None]).mean(1).mean(-1, keepdim=True))
        return out


def _batches() -> list[Tensor]:
    return [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)]


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_fused_experts_left_dense_are_named_once(method: str) -> None:
    model = Model()
    with pytest.warns(UserWarning) as caught:
        found = prune.prune_model(model, 0.5, method=method, calibration=_batches(),
                                  progress=False)  # fmt: skip
    told = [str(w.message) for w in caught if "3 dims" in str(w.message)]
    assert len(told) == 1 and all(w.filename == __file__ for w in caught)
    assert told[0].startswith(f"prune_model: method={method!r} prunes Linear weights only")
    assert "'experts.weight'" in told[0] and "conv" not in told[0]
    assert "method='l1'" in told[0] and "prune_channels" in told[0]
    assert found["attn.weight"].sparsity == 0.5  # the rest pruned as before
    assert not hasattr(model.experts, "weight_mask")


def test_no_warning_where_the_user_leaves_them_out_or_names_the_layers() -> None:
    calls: list[dict[str, Any]] = [
        {"exclude": ("experts",)},
        {"include": ("attn",)},
    ]
    for options in calls:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            prune.prune_model(Model(), 0.5, method="wanda", calibration=_batches(),
                              progress=False, **options)  # fmt: skip


def test_a_qwen3_moe_names_its_fused_experts() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=8, intermediate_size=16, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).eval()
    batches = [{"input_ids": torch.randint(0, 64, (1, 8))} for _ in range(2)]
    with pytest.warns(UserWarning, match="3 dims") as caught:
        prune.prune_model(model, 0.5, method="wanda", calibration=batches, progress=False)
    told = next(str(w.message) for w in caught if "3 dims" in str(w.message))
    assert "'model.layers.0.mlp.experts.gate_up_proj'" in told
    assert "'model.layers.0.mlp.experts.down_proj'" in told
