"""What a one-shot call holds: without keep_masks no layer ends with a mask and its original
values, and the undo of a failed call keeps the weights it overwrites in a temporary file
(written ahead of each change), not a copy of the model in memory."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from helpers import tiny_llm
from helpers.model_state import fingerprint
from prunekit.core import transaction as transactions
from prunekit.core.transaction import Transaction, transaction

transformers = pytest.importorskip("transformers")

CASES = [
    ("wanda", None),
    ("wanda", "2:4"),
    ("sparsegpt", None),
    ("sparsegpt", "2:4"),
    ("sparsegpt", "unstructured"),
]


def llama(layers: int = 3) -> Any:
    return tiny_llm.llama(vocab=64, layers=layers)


def batches() -> list[Any]:
    torch.manual_seed(1)
    return [torch.randint(0, 64, (2, 12)), {"input_ids": torch.randint(0, 64, (1, 20))}]


def pruned_then_removed(model: nn.Module, **options: Any) -> nn.Module:
    prunekit.prune_model(model, 0.5, calibration=batches(), **options)
    for module in model.modules():
        for name in [n[: -len("_mask")] for n in module._buffers if n.endswith("_mask")]:
            prunekit.remove(module, name)
    return model


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.named_parameters()}


@pytest.mark.parametrize(("method", "pattern"), CASES)
def test_without_keep_masks_the_result_is_the_removed_one_bit_for_bit(
    method: str, pattern: str | None
) -> None:
    model = llama()
    params = {k: id(v) for k, v in model.named_parameters()}
    want = weights(pruned_then_removed(copy.deepcopy(model), method=method, pattern=pattern))
    prunekit.prune_model(
        model, 0.5, method=method, pattern=pattern, calibration=batches(), keep_masks=False
    )
    got = weights(model)
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name].view(torch.int32), value.view(torch.int32)), name
    # the same Parameter objects (an optimizer holding them keeps working), plain: no
    # <name>_orig, no mask, no hook, no masked product kept beside them
    assert {k: id(v) for k, v in model.named_parameters()} == params
    for module in model.modules():
        assert not [n for n in module._buffers if n.endswith("_mask")]
        assert not module._forward_pre_hooks
        assert not [k for k, v in vars(module).items() if isinstance(v, torch.Tensor)]
    assert model.model.layers[0].mlp.down_proj.weight.eq(0).float().mean() == 0.5


def test_keep_masks_false_applies_to_the_magnitude_methods_and_ties() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 6), nn.Linear(6, 10, bias=False))
    model[1].weight = model[0].weight  # tied
    twin = copy.deepcopy(model)
    prunekit.prune_model(model, 0.5, keep_masks=False)
    prunekit.prune_model(twin, 0.5)
    assert model[1].weight is model[0].weight
    assert torch.equal(model[0].weight, twin[0].weight)
    assert not prunekit.is_pruned(model)
    with pytest.raises(TypeError, match=r"prune_model: invalid keep_masks='no'"):
        prunekit.prune_model(model, 0.5, keep_masks="no")  # type: ignore[arg-type]


class Interrupted(BaseException):  # as KeyboardInterrupt: not a batch error
    pass


def fail_in_the_last_block(model: Any, monkeypatch: Any) -> list[int]:
    """The last block's forward raises (after the blocks before it were pruned, and, for
    SparseGPT, updated); records the bytes the transaction held in memory then."""
    held: list[int] = []
    last = model.model.layers[-1]
    original = Transaction.rollback

    def rollback(self: Transaction) -> list[str]:
        held.append(self.held())
        return original(self)

    def boom(*args: Any) -> None:
        raise Interrupted("stop")

    monkeypatch.setattr(Transaction, "rollback", rollback)
    last.register_forward_pre_hook(boom)
    return held


@pytest.mark.parametrize("keep_masks", [True, False])
@pytest.mark.parametrize(("method", "pattern"), CASES)
def test_a_failure_in_the_last_block_is_undone_from_the_write_ahead(
    method: str, pattern: str | None, keep_masks: bool, monkeypatch: Any
) -> None:
    model = llama()
    held = fail_in_the_last_block(model, monkeypatch)
    hooks = dict(model.model.layers[-1]._forward_pre_hooks)
    before = fingerprint(model)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    with pytest.raises(Interrupted):
        prunekit.prune_model(model, 0.5, method=method, pattern=pattern,
                             calibration=batches(), keep_masks=keep_masks)  # fmt: skip
    assert fingerprint(model) == before  # every weight back, bit for bit
    assert model.model.layers[-1]._forward_pre_hooks == hooks
    # the blocks before were changed in place, yet the transaction held no copy of a
    # weight in memory: only its clones of the (small) buffers
    assert held == [buffers]


def test_write_ahead_keeps_values_on_disk_and_puts_them_back() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).to(torch.bfloat16))
    before = fingerprint(model)
    with pytest.raises(Interrupted), transaction(model) as recorded:
        recorded.write_ahead([model[0].weight, model[1].weight])
        recorded.write_ahead([model[0].weight])  # kept once: the first values
        with torch.no_grad():
            model[0].weight.mul_(0)
            model[1].weight.add_(1)
            model[0].weight.add_(2)
        assert recorded.held() == 0
        raise Interrupted
    assert fingerprint(model) == before
    with transaction(model) as recorded:
        with torch.no_grad():
            model[0].bias.zero_()
        with pytest.raises(RuntimeError, match=r"Linear.bias was written before write_ahead"):
            recorded.write_ahead([model[0].bias])


def test_the_journal_file_goes_when_the_call_ends(monkeypatch: Any) -> None:
    closed: list[int] = []
    original = transactions._Journal.close

    def close(self: Any) -> None:
        closed.append(self._file is not None)
        original(self)

    monkeypatch.setattr(transactions._Journal, "close", close)
    model = llama(layers=1)
    prunekit.prune_model(model, 0.5, method="sparsegpt", calibration=batches())
    assert closed[-1] and closed.count(True) == 1  # the call's own transaction wrote ahead
