"""sequential='layers' lets go of what the block's last group does not need: the outputs
kept from the runs before are dropped before that group is pruned (the block's final run
computes them again, to the bit), and no block after the last pruned one is run."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
import prunekit.whole.oneshot_execute as execute
from helpers import tiny_llm
from prunekit.criteria.grouped import GroupedRuns


def batches(count: int = 3) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        {"input_ids": torch.randint(0, 300, (1, 12), generator=generator)} for _ in range(count)
    ]


def block_weights(layer: int) -> list[str]:
    return [
        f"model.layers.{layer}.{part}.weight"
        for part in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
        )
    ]  # fmt: skip


def pruned(model: nn.Module, method: str, include: list[str], **options: Any) -> dict[str, Any]:
    prunekit.prune_model(
        model, 0.5, method=method, calibration=batches(), include=include, progress=False,
        keep_masks=False, **options,
    )  # fmt: skip
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_the_last_group_is_pruned_with_no_output_of_the_runs_before_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_llm.llama(layers=2)
    mlp = model.model.layers[0].mlp
    outputs: list[weakref.ref[torch.Tensor]] = []
    for layer in (mlp.gate_proj, mlp.up_proj):
        layer.register_forward_hook(lambda _m, _a, out: outputs.append(weakref.ref(out)))
    alive_at_down: list[int] = []
    real = execute._sparsegpt_layers

    def sparsegpt_layers(plan: Any, targets: Any, hessian: torch.Tensor) -> None:
        if any(module is mlp.down_proj for module, _ in targets):
            alive_at_down.append(sum(ref() is not None for ref in outputs))
        real(plan, targets, hessian)

    monkeypatch.setattr(execute, "_sparsegpt_layers", sparsegpt_layers)
    pruned(model, "sparsegpt", block_weights(0) + block_weights(1), sequential="layers")
    assert outputs  # the hooks saw the runs
    assert alive_at_down == [0]


@pytest.mark.parametrize("method", ["sparsegpt", "wanda"])
def test_dropping_the_kept_outputs_changes_no_bit_of_the_result(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    include = block_weights(0) + block_weights(1)
    dropped = pruned(tiny_llm.llama(layers=2), method, include, sequential="layers")
    monkeypatch.setattr(GroupedRuns, "forget", lambda self: None)  # keep them, as before
    kept = pruned(tiny_llm.llama(layers=2), method, include, sequential="layers")
    assert dropped.keys() == kept.keys()
    for name, value in dropped.items():
        assert torch.equal(value, kept[name]), name
    assert any(
        not torch.equal(v, tiny_llm.llama(layers=2).state_dict()[k]) for k, v in kept.items()
    )


@pytest.mark.parametrize("sequential", [True, "layers"])
@pytest.mark.parametrize("method", ["sparsegpt", "wanda"])
def test_no_block_after_the_last_pruned_one_runs(method: str, sequential: bool | str) -> None:
    model = tiny_llm.llama(layers=4)
    runs = [0] * 4
    for i, block in enumerate(model.model.layers):
        block.register_forward_pre_hook(lambda *_, i=i: runs.__setitem__(i, runs[i] + 1))
    after = pruned(model, method, block_weights(1), sequential=sequential)
    assert runs[0] > 0 and runs[1] > 0  # the one before, run for the pruned one's inputs
    assert runs[2:] == [0, 0]
    # the same as when every block is run (the model's whole forward, sequential=False
    # for the pruned block's inputs only differs for the blocks after it)
    whole = tiny_llm.llama(layers=4)
    later = block_weights(1) + block_weights(3)
    reference = pruned(whole, method, later, sequential=sequential)
    for name in block_weights(1):
        assert torch.equal(after[name], reference[name]), name
