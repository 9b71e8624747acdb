"""save_pruned of a model whose hidden width is masked: its norms normalize over the kept
channels through a hook no state_dict holds, so the file would reload computing something
else; the call is refused, naming the norms and compact, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import prunekit
from helpers import tiny_llm
from helpers.model_state import fingerprint

pytest.importorskip("transformers")
IDS = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(0))


def test_save_pruned_refuses_a_masked_hidden_width(tmp_path: Path) -> None:
    model = tiny_llm.llama(vocab=96, layers=2)
    budget = prunekit.Budget(params=0.2, kinds=("hidden",))
    prunekit.prune_channels(model, {"input_ids": IDS}, budget=budget)
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"save_pruned: .*the masked hidden width of the norms "
                       r"model\.layers\.0\.input_layernorm.*expected prunekit\.compact\(model, "
                       r"inputs\) first"):  # fmt: skip
        prunekit.save_pruned(model, tmp_path / "model.pt")
    assert list(tmp_path.iterdir()) == [] and fingerprint(model) == before
    prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    prunekit.save_pruned(model, tmp_path / "model.pt")  # plain weights now
    assert (tmp_path / "model.pt").is_file()
