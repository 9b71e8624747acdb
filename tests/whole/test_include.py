"""`include=` narrows a method's own targets (matrix weights of the layers it handles); a
tensor outside them (a norm, a bias) is pruned when named exactly; module names (PEFT's
target_modules style) select the weights inside those modules."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import prunekit as prune
from helpers.model_state import fingerprint
from prunekit.core.naming import entries
from prunekit.io.statedict import prune_state_dict
from prunekit.whole.targets import select_names

transformers = pytest.importorskip("transformers")


def llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def batches() -> list[torch.Tensor]:
    return [torch.randint(0, 64, (2, 8)) for _ in range(2)]


def pruned(report: prune.Report) -> list[str]:
    return [row.name for row in report.rows if row.masked]


LINEARS = [
    f"model.layers.{i}.{name}.weight"
    for i in range(2)
    for name in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    )
]  # fmt: skip


@pytest.mark.parametrize("method", ["wanda", "sparsegpt", "taylor"])
def test_calibrated_glob_prunes_the_linears_under_it_not_the_norms(method: str) -> None:
    model = llama()
    kwargs = {"loss": lambda out, batch: out.logits.float().pow(2).mean()}
    found = prune.prune_model(
        model,
        0.5,
        method=method,
        calibration=batches(),
        include=("model.layers.*",),
        **(kwargs if method == "taylor" else {}),
    )
    assert sorted(pruned(found)) == sorted(LINEARS)
    assert found[LINEARS[0]].sparsity == 0.5


def test_l1_glob_leaves_norms_and_biases_alone() -> None:
    model = llama()
    found = prune.prune_model(model, 0.5, method="l1", include=("model.layers.*",))
    assert sorted(pruned(found)) == sorted(LINEARS)
    assert not any("norm" in name for name in pruned(found))


def test_an_exact_name_prunes_a_one_dim_tensor() -> None:
    model = llama()
    name = "model.layers.0.input_layernorm.weight"
    found = prune.prune_model(model, 0.5, include=("model.layers.0.*", name))
    assert name in pruned(found)
    assert "model.layers.1.input_layernorm.weight" not in pruned(found)
    assert found[name].sparsity == 0.5


def test_an_exact_one_dim_name_is_refused_by_a_calibrated_method_and_nothing_changes() -> None:
    model = llama()
    before = fingerprint(model)
    with pytest.raises(
        ValueError,
        match=r"'weight' of LlamaRMSNorm \('model.layers.0.input_layernorm'\)",
    ):
        prune.prune_model(
            model,
            0.5,
            method="wanda",
            calibration=batches(),
            include=("model.layers.0.input_layernorm.weight",),
        )
    assert fingerprint(model) == before


@pytest.mark.parametrize(
    ("include", "expected"),
    [
        (("q_proj", "v_proj"), [n for n in LINEARS if "q_proj" in n or "v_proj" in n]),
        (("model.layers.1.mlp",), [n for n in LINEARS if n.startswith("model.layers.1.mlp")]),
        (("model.layers.*.self_attn.o_proj",), [n for n in LINEARS if "o_proj" in n]),
        (("self_attn",), [n for n in LINEARS if "self_attn" in n]),
    ],
)
def test_module_names_select_the_weights_inside(
    include: tuple[str, ...], expected: list[str]
) -> None:
    for method in ("l1", "wanda"):
        model = llama()
        calibration = batches() if method == "wanda" else None
        found = prune.prune_model(
            model, 0.5, method=method, calibration=calibration, include=include
        )
        assert sorted(pruned(found)) == sorted(expected), method


def test_exclude_takes_module_names() -> None:
    model = llama()
    found = prune.prune_model(model, 0.5, include=("model.layers.*",), exclude=("mlp",))
    assert sorted(pruned(found)) == sorted(n for n in LINEARS if "mlp" not in n)


def test_calibrated_head_is_pruned_when_named_exactly() -> None:
    model = llama()
    found = prune.prune_model(
        model, 0.5, method="wanda", calibration=batches(), include=("lm_head.weight",)
    )
    assert pruned(found) == ["lm_head.weight"]


def test_a_glob_matching_no_target_but_one_dim_tensors_still_selects_them_with_a_warning() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    with pytest.warns(FutureWarning, match=r"'\*.bias'.*exact"):
        found = prune.prune_model(model, 0.5, include=("*.bias",))
    assert pruned(found) == ["0.bias", "1.bias", "2.bias"]


def test_a_module_name_with_no_target_is_refused() -> None:
    model = llama()
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"'norm' selects no weight.*model.norm.weight"):
        prune.prune_model(model, 0.5, include=("norm",))
    assert fingerprint(model) == before


def test_select_names_on_a_state_dict() -> None:
    state = {
        "layers.0.attn.weight": torch.randn(4, 4),
        "layers.0.attn.bias": torch.randn(4),
        "layers.0.norm.weight": torch.randn(4),
        "head.weight": torch.randn(2, 4),
    }
    found = entries(state)
    assert select_names(found, ["layers.*"]) == ["layers.0.attn.weight"]
    assert select_names(found, ["attn"]) == ["layers.0.attn.weight"]
    assert select_names(found, ["layers.*", "layers.0.norm.weight"]) == [
        "layers.0.attn.weight",
        "layers.0.norm.weight",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning where a glob narrows
        select_names(found, ["layers.0.*"])
    result = prune_state_dict(state, 0.5, method="l1", include=["layers.*"])
    assert result.pruned == ["layers.0.attn.weight"]
