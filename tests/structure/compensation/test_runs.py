"""Compensation block by block runs each layer of a block once per calibration batch (the
consumers of one block measured on grouped runs of it), and gives, bit for bit, what one
pass of the whole model per consumer gives."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from prunekit.structure.compensation import compensate as compensation
from prunekit.structure.stages import compensate_layers as structure_prune

transformers = pytest.importorskip("transformers")


def llama(heads: int = 4, kv: int = 2) -> Any:
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def calibration(count: int = 4) -> list[Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (2, 16), generator=g) for _ in range(count)]


def compensated(model: nn.Module, batches: list[Tensor], **options: Any) -> list[str]:
    done: list[str] = []
    original = compensation.compensate_groups

    def spy(*args: Any, **kwargs: Any) -> list[str]:
        done.extend(original(*args, **kwargs))
        return done

    structure = structure_prune.compensate_groups
    structure_prune.compensate_groups = spy  # type: ignore[assignment]
    try:
        prunekit.prune_channels(model, batches[0], calibration=batches, compensate=True,
                                **options)  # fmt: skip
    finally:
        structure_prune.compensate_groups = structure  # type: ignore[assignment]
    return done


def bits_equal(a: nn.Module, b: nn.Module) -> None:
    one, two = a.state_dict(), b.state_dict()
    assert one.keys() == two.keys()
    for key, value in one.items():
        assert torch.equal(value.view(torch.int32), two[key].view(torch.int32)), key


OPTIONS = [
    {"amount": 0.5, "heads": 0.5},
    {"amount": 0.5, "heads": 0.5, "damping": "auto"},
    {"amount": 0.25},
]


@pytest.mark.parametrize("options", OPTIONS)
def test_block_runs_give_the_whole_model_runs_result_bit_for_bit(
    options: dict[str, Any], monkeypatch: Any
) -> None:
    model = llama()
    twin = copy.deepcopy(model)
    done = compensated(model, calibration(), **options)
    monkeypatch.setattr(compensation, "_blocks", lambda *args: None)  # a model pass each
    assert compensated(twin, calibration(), **options) == done
    if "heads" in options:
        assert "model.layers.0.self_attn.o_proj" in done
    assert "model.layers.2.mlp.down_proj" in done
    bits_equal(model, twin)


def test_each_layer_of_a_block_runs_once_per_batch(monkeypatch: Any) -> None:
    model = llama()
    batches = calibration(5)
    calls: Counter[str] = Counter()
    names = {m: n for n, m in model.named_modules()}
    original = compensation.compensate_groups
    linear = nn.Linear.forward

    def computed(self: nn.Linear, x: Tensor) -> Tensor:  # not a call replayed from memory
        calls[names[self]] += 1
        return linear(self, x)

    def counted(*args: Any, **kwargs: Any) -> list[str]:
        with monkeypatch.context() as patched:
            patched.setattr(nn.Linear, "forward", computed)
            return original(*args, **kwargs)

    monkeypatch.setattr(structure_prune, "compensate_groups", counted)
    prunekit.prune_channels(model, batches[0], 0.5, heads=0.5, calibration=batches,
                            compensate=True)  # fmt: skip
    # one pass of the model on the first batch finds the forward order; then, in each
    # block before the last, every Linear computes once on each batch (it computed up to
    # three times: for the attention's output, for the MLP's down projection, and for the
    # block's outputs)
    for index in (0, 1):
        for leaf in ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"):
            assert calls[f"model.layers.{index}.{leaf}"] == 1 + len(batches), (index, leaf)


class Crossed(nn.Module):
    """Two branches whose producers both run before either consumer: the second consumer's
    producer has finished before the first consumer is called."""

    def __init__(self) -> None:
        super().__init__()
        self.a1, self.b1 = nn.Linear(8, 12), nn.Linear(8, 12)
        self.a2, self.b2 = nn.Linear(12, 8), nn.Linear(12, 8)

    def forward(self, x: Tensor) -> Tensor:
        h, g = torch.relu(self.a1(x)), torch.tanh(self.b1(x))
        y = x + self.a2(h)
        return y + self.b2(g)


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Crossed() for _ in range(3))

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_block_whose_producers_run_early_is_measured_run_by_run(monkeypatch: Any) -> None:
    replayed: list[bool] = []
    original = compensation._replayable

    def spy(*args: Any) -> bool:
        replayed.append(original(*args))
        return replayed[-1]

    monkeypatch.setattr(compensation, "_replayable", spy)
    model = Blocks().eval()
    twin = copy.deepcopy(model)
    g = torch.Generator().manual_seed(2)
    batches = [torch.randn(16, 8, generator=g) for _ in range(3)]
    done = compensated(model, batches, amount=0.5)
    assert replayed == [False, False, False]
    assert len(done) == 6
    monkeypatch.setattr(compensation, "_blocks", lambda *args: None)
    assert compensated(twin, batches, amount=0.5) == done
    bits_equal(model, twin)
