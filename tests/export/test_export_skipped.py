"""export of a model whose blocks are skipped: a format rebuilt from its weights and config
would reload the blocks computing again, so the call is refused up front, naming the blocks
and the call that removes them, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import prunekit
from helpers import tiny_llm
from helpers.model_state import fingerprint
from prunekit.export import export

T = pytest.importorskip("transformers")
IDS = torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("verify", [True, False])
def test_export_refuses_skipped_blocks_by_name(tmp_path: Path, verify: bool) -> None:
    model = tiny_llm.llama(vocab=96, layers=3)
    prunekit.skip_blocks(model, [1])
    before, config = fingerprint(model), model.config.to_dict()
    with pytest.raises(ValueError, match=r"export: .*the skipped block model\.layers\.1: "
                       r".*expected prunekit\.remove_blocks\(model\) first"):  # fmt: skip
        export(model, tmp_path / "hf", "hf", verify=verify)
    assert list(tmp_path.iterdir()) == []
    assert fingerprint(model) == before and model.config.to_dict() == config


def test_the_removed_blocks_export_and_reload_to_what_the_skipped_model_computed(
    tmp_path: Path,
) -> None:
    model = tiny_llm.llama(vocab=96, layers=3)
    prunekit.skip_blocks(model, [1])
    with torch.no_grad():
        skipped = model(IDS).logits
    prunekit.remove_blocks(model)
    export(model, tmp_path / "hf", "hf", example_inputs={"input_ids": IDS})
    loaded = T.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        assert float((loaded(IDS).logits - skipped).abs().max()) <= 1e-5
