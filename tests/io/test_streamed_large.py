"""benchmarks/streamed_large.py's pieces on a tiny shape: the folder it writes is the
LlamaForCausalLM of its config, its block-streamed forward gives from_pretrained's logits,
and the folder prune_streamed makes from it is bf16 with half of each matrix zero."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from prunekit.io.streamed import prune_streamed

safe_open = pytest.importorskip("safetensors").safe_open

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "streamed_large.py"
SHAPE = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4}
SHAPE |= {"num_key_value_heads": 2, "vocab_size": 300}


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("streamed_large", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    b = bench()
    folder = tmp_path_factory.mktemp("large") / "dense"
    config = b.llama_config(3, **SHAPE)
    written = b.write_folder(folder, config, seed=1, shard=60_000)
    assert written == b.model_bytes(config)
    assert len(list(folder.glob("*.safetensors"))) > 3
    return folder


def test_written_folder_is_the_config_model_and_streamed_logits_match(dense: Path) -> None:
    b = bench()
    assert b.check_folder(dense)["matches"]
    model = transformers.AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32)
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    assert norms and all(bool((p == 1).all()) for p in norms)
    ids = [torch.randint(0, 300, (2, 16)), torch.randint(0, 300, (1, 5))]
    streamed = b.StreamedModel(dense).logits(ids)
    for batch, got in zip(ids, streamed, strict=True):
        with torch.no_grad():
            expected = model(input_ids=batch).logits
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
        assert got.abs().max() > 0.1  # not a degenerate forward


def test_pruned_folder_is_bf16_with_half_zeros(dense: Path, tmp_path: Path) -> None:
    b = bench()
    calibration, _, _ = b.token_ids(300)
    batches = [{"input_ids": w[None, :32]} for w in calibration]
    done = prune_streamed(dense, tmp_path / "out", "wanda", 0.5, calibration=batches)
    assert done.zeros == done.numel // 2
    check = b.check_folder(tmp_path / "out")
    assert check["matches"] and check["dtypes"] == ["BF16"]
    model = b.StreamedModel(tmp_path / "out")
    model.logits([torch.randint(0, 300, (1, 8))], count=True)
    assert model.zeros == done.zeros and model.numel == done.numel
    # the blocks ran in float32, and every kept weight is the stored bf16 one, bit for bit
    for name in done.pruned:
        old, new = stored(dense, name), stored(tmp_path / "out", name)
        assert new.dtype == torch.bfloat16
        kept = new != 0
        assert torch.equal(new[kept].view(torch.int16), old[kept].view(torch.int16))


def stored(folder: Path, name: str) -> torch.Tensor:
    for file in folder.glob("*.safetensors"):
        with safe_open(file, "pt") as opened:
            if name in opened.keys():  # noqa: SIM118 (a safe_open is not a mapping)
                return opened.get_tensor(name)
    raise KeyError(name)
