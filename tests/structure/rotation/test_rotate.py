"""rotate_hidden: the rotated model computes what the model did, the sliced one what the
rotated one computes with the dropped directions masked, it composes with prune_channels and
compact, and bad arguments leave the model as it was."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers import tiny_llm
from helpers.model_state import fingerprint
from prunekit.structure.rotation.rotate import DAMPING, refit_map

T = pytest.importorskip("transformers")

CALIBRATION = [torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(k))
               for k in range(4)]  # fmt: skip
IDS = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(9))


def close(got: Tensor, want: Tensor, tolerance: float = 1e-5) -> bool:
    """Within `tolerance` x the largest value; NaN or inf anywhere is a difference."""
    if not (bool(torch.isfinite(got).all()) and bool(torch.isfinite(want).all())):
        return False
    return float((got - want).abs().max()) <= tolerance * float(want.abs().max())


def model(tied: bool = False, family: str = "llama", bias: bool = False) -> Any:
    """A tiny causal LM with norm weights away from 1 (so folding them matters)."""
    if family == "llama":
        config: Any = T.LlamaConfig(attention_bias=bias, mlp_bias=bias)
    else:
        config = T.Qwen2Config()
    for key, value in {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "head_dim": 8,
                       "tie_word_embeddings": tied}.items():  # fmt: skip
        setattr(config, key, value)
    torch.manual_seed(0)
    built = (T.LlamaForCausalLM if family == "llama" else T.Qwen2ForCausalLM)(config).eval()
    with torch.no_grad():
        for name, p in built.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.uniform_(0.5, 1.5)
    assert (built.lm_head.weight is built.model.embed_tokens.weight) == tied
    return built


def logits(m: nn.Module, ids: Tensor = IDS) -> Tensor:
    with torch.no_grad():
        out: Tensor = m(input_ids=ids).logits
    return out


@pytest.mark.parametrize(
    ("tied", "family", "bias"),
    [(False, "llama", False), (True, "llama", False), (False, "llama", True),
     (True, "qwen2", False)],
)  # fmt: skip
def test_rotation_alone_computes_what_the_model_did(tied: bool, family: str, bias: bool) -> None:
    m = model(tied, family, bias)
    want = logits(m)
    report = prunekit.rotate_hidden(m, CALIBRATION)
    assert close(logits(m), want)
    assert (report.width_before, report.width_after, report.untied) == (32, 32, tied)
    assert report.energy == pytest.approx(1.0)
    assert m.lm_head.weight is not m.model.embed_tokens.weight or not tied
    assert not m.config.tie_word_embeddings
    # folded: every norm's weight is 1, and the stream is rotated (the embedding changed)
    assert all(bool((n.weight == 1).all()) for n in m.modules() if "RMSNorm" in type(n).__name__)
    assert not torch.allclose(
        m.model.embed_tokens.weight, model(tied, family, bias).model.embed_tokens.weight
    )


def test_a_rotated_model_keeps_its_hidden_states_in_order() -> None:
    """The directions come by decreasing use: the first kept ones carry most of it."""
    m = model()
    report = prunekit.rotate_hidden(m, CALIBRATION, 0.5)
    assert 0.5 < report.energy < 1.0
    assert report.params_after < report.params_before


@pytest.mark.parametrize("tied", [False, True])
def test_sliced_model_is_the_rotated_one_with_the_dropped_directions_masked(tied: bool) -> None:
    sliced, masked = model(tied), model(tied)
    report = prunekit.rotate_hidden(sliced, CALIBRATION, 0.25, round_to=4)
    prunekit.rotate_hidden(masked, CALIBRATION)
    kept = report.width_after
    assert kept == 24 and sliced.config.hidden_size == 24 and sliced.config.head_dim == 8
    mask = torch.ones_like(masked.model.embed_tokens.weight)
    mask[:, kept:] = 0
    prunekit.custom_from_mask(masked.model.embed_tokens, "weight", mask)
    for layer in masked.model.layers:
        for linear in (layer.self_attn.o_proj, layer.mlp.down_proj):
            rows = torch.ones_like(linear.weight)
            rows[kept:] = 0
            prunekit.custom_from_mask(linear, "weight", rows)
    assert close(logits(sliced), logits(masked))
    eps = masked.model.norm.variance_epsilon
    assert sliced.model.norm.variance_epsilon == pytest.approx(eps * 32 / 24)
    assert float(sliced.model.norm.weight.detach()[0]) == pytest.approx(math.sqrt(32 / 24))


def test_rotation_then_channels_compacts_exactly_and_saves(tmp_path: Path) -> None:
    m = model(tied=True)
    prunekit.rotate_hidden(m, CALIBRATION, 0.25)
    batches = [{"input_ids": c} for c in CALIBRATION]
    example = batches[0]
    budget = prunekit.Budget(params=0.2)
    prunekit.prune_channels(m, example, budget=budget, criterion="activation",
                            calibration=batches, compensate=True)  # fmt: skip
    masked = logits(m)
    prunekit.compact(m, example)  # checks the compacted model against the masked one
    assert close(logits(m), masked)
    rotated = model(tied=True)
    report = prunekit.rotate_hidden(rotated, CALIBRATION, 0.3)  # 22.4 kept: 24, 4 heads
    rotated.save_pretrained(tmp_path)
    loaded = T.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert report.width_after == loaded.config.hidden_size == 24
    assert close(logits(loaded), logits(rotated))


def _nan_calibration() -> list[Tensor]:
    return [torch.full((1, 4), 299)]


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"hidden": 1.0}, ValueError, "hidden=1.0"),
        ({"hidden": -0.1}, ValueError, "hidden=-0.1"),
        ({"hidden": float("nan")}, ValueError, "hidden=nan"),
        ({"hidden": "0.2"}, TypeError, "hidden"),
        ({"hidden": True}, TypeError, "hidden"),
        ({"round_to": 0}, ValueError, "round_to=0"),
        ({"round_to": 2.5}, TypeError, "round_to"),
        ({"calibration": []}, ValueError, "no batch"),
        ({"calibration": torch.zeros(1, 4, dtype=torch.long)}, TypeError, "calibration"),
    ],
)
def test_bad_arguments_are_refused_and_leave_the_model(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    m = model()
    before = fingerprint(m)
    arguments = {"calibration": CALIBRATION, **kwargs}
    with pytest.raises(error, match="rotate_hidden") as raised:
        prunekit.rotate_hidden(m, **arguments)
    assert words in str(raised.value)
    assert fingerprint(m) == before


def test_unsupported_models_are_refused() -> None:
    with pytest.raises(ValueError, match=r"rotate_hidden: unsupported model Linear"):
        prunekit.rotate_hidden(nn.Linear(4, 4), CALIBRATION)
    gpt2 = T.GPT2LMHeadModel(T.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*\['llama'"):
        prunekit.rotate_hidden(gpt2, CALIBRATION)
    base = tiny_llm.llama().model
    with pytest.raises(
        ValueError, match=r"LlamaModel has no Embedding at model.embed_tokens; expected a causal"
    ):
        prunekit.rotate_hidden(base, CALIBRATION)
    with pytest.raises(TypeError, match="rotate_hidden: invalid model of type str"):
        prunekit.rotate_hidden("model", CALIBRATION)  # type: ignore[arg-type]


def test_masked_models_are_refused() -> None:
    m = model()
    prunekit.l1_unstructured(m.model.layers[0].mlp.up_proj, "weight", 0.5)
    before = fingerprint(m)
    with pytest.raises(
        ValueError, match=r"masks installed \(model.layers.0.mlp.up_proj.weight_orig"
    ):
        prunekit.rotate_hidden(m, CALIBRATION, 0.25)
    assert fingerprint(m) == before


def test_a_failure_inside_leaves_the_model_as_it_was() -> None:
    """Hidden states that are not finite, and an error of the model's own forward."""
    m = model()
    with torch.no_grad():
        m.model.embed_tokens.weight[299] = float("nan")
    before = fingerprint(m)
    with pytest.raises(ValueError, match="hidden states of the 1 calibration batches are not"):
        prunekit.rotate_hidden(m, _nan_calibration(), 0.25)
    assert fingerprint(m) == before
    with pytest.raises(ValueError, match="cannot take batch 0") as caught:
        prunekit.rotate_hidden(m, [torch.full((1, 4), 300)], 0.25)
    assert isinstance(caught.value.__cause__, IndexError)  # the model's own error, kept
    assert fingerprint(m) == before
    copy.deepcopy(m)  # still a whole model


def test_the_refit_is_the_damped_least_squares_fit() -> None:
    """Brute force: lstsq over the tokens, with rows sqrt(damping) x (W' - W_k) appended."""
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randn(200, 6, generator=generator, dtype=torch.float64)
    tokens[:, 1] += tokens[:, 4]  # a dropped direction the kept ones predict
    full, _ = torch.linalg.qr(torch.randn(6, 6, generator=generator, dtype=torch.float64))
    weight = torch.randn(3, 6, generator=generator, dtype=torch.float64) @ full.T
    kept = 4
    fitted = (weight @ full) @ refit_map(full, kept, tokens.T @ tokens)
    inputs, target = tokens @ full[:, :kept], tokens @ weight.T
    damping = DAMPING * float((inputs.T @ inputs).diagonal().mean())
    own = (weight @ full)[:, :kept]
    rows = torch.cat([inputs, damping**0.5 * torch.eye(kept, dtype=torch.float64)])
    wanted = torch.cat([target, damping**0.5 * own.T])
    solved = torch.linalg.lstsq(rows, wanted).solution.T
    assert torch.allclose(fitted, solved, atol=1e-9)


def test_compensation_refits_the_readers_only_when_directions_go() -> None:
    alone, fitted = model(), model()
    want = logits(alone)
    prunekit.rotate_hidden(fitted, CALIBRATION, compensate=True)
    assert close(logits(fitted), want)
    sliced, fitted = model(), model()
    prunekit.rotate_hidden(sliced, CALIBRATION, 0.25, compensate=True)
    prunekit.rotate_hidden(fitted, CALIBRATION, 0.25)
    first = sliced.model.layers[0].self_attn.q_proj.weight
    assert first.shape == (32, 24) and bool(torch.isfinite(first).all())
    assert not torch.equal(first, fitted.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(sliced.model.embed_tokens.weight, fitted.model.embed_tokens.weight)
    with pytest.raises(TypeError, match=r"rotate_hidden: invalid compensate=1; expected a bool"):
        prunekit.rotate_hidden(model(), CALIBRATION, 0.25, compensate=1)  # type: ignore[arg-type]
