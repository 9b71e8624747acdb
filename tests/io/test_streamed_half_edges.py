"""Hostile cases of the streamed pruning and shrinking of half-precision folders
(io.streamed.prune_streamed, export.streamed_shrink.shrink_streamed): folders of mixed
dtypes, float16 with tied embeddings, a tensor under a block that is no parameter of the
model, values the float32 compute takes beyond float16's range, a failure midway over an
earlier output."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import tiny_llm
from helpers.tiny_llm import folder_tensors as tensors
from prunekit.export.streamed_shrink import ShrinkStreamedConfig, shrink_streamed
from prunekit.io.streamed import prune_streamed
from prunekit.structure.budget import Budget

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
safetensors_torch = pytest.importorskip("safetensors.torch")
safe_open = pytest.importorskip("safetensors").safe_open

VOCAB = 96
INV_FREQ = "model.layers.0.self_attn.rotary_emb.inv_freq"


def digest(folder: Path) -> dict[str, str]:
    """Every file of `folder` (names relative to it) and the hash of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def batches() -> list[torch.Tensor]:
    torch.manual_seed(3)
    return [torch.randint(0, VOCAB, (2, 12)), torch.randint(0, VOCAB, (1, 9))]


def save(model: Any, folder: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(folder, max_shard_size="20KB")
    return folder


def shrink(path: Path, out: Path) -> Any:
    with warnings.catch_warnings():  # few calibration rows: compensation warns
        warnings.simplefilter("ignore", UserWarning)
        return shrink_streamed(path, out, calibration=batches(),
                               config=ShrinkStreamedConfig(Budget(params=0.3)))  # fmt: skip


@pytest.fixture(scope="module")
def half(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Folders of the same tiny Llama (read only): 'bf16' all bfloat16; 'mixed' the same
    with its (untied) head stored in float32; 'fp16-tied' float16 with tied embeddings."""
    root = tmp_path_factory.mktemp("streamed-half")
    model = tiny_llm.llama(vocab=VOCAB, layers=2).to(torch.bfloat16)
    save(model, root / "bf16")
    model.lm_head.float()
    save(model, root / "mixed")
    save(tiny_llm.llama(vocab=VOCAB, layers=2, tied=True).half(), root / "fp16-tied")
    return lambda name: root / name


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_folder_of_mixed_dtypes_prunes_its_blocks_as_the_uniform_one(
    half: Callable[[str], Path], tmp_path: Path, method: str
) -> None:
    """A float32 head beside bfloat16 blocks: the blocks are computed as in the all-bf16
    folder (float32), not in the dtype of whichever tensor the index lists first."""
    assert {t.dtype for t in tensors(half("mixed")).values()} == {
        torch.bfloat16,
        torch.float32,
    }
    got = prune_streamed(half("mixed"), tmp_path / "mixed", method, 0.5, calibration=batches())
    want = prune_streamed(half("bf16"), tmp_path / "bf16", method, 0.5, calibration=batches())
    assert got.pruned == want.pruned and got.zeros == want.zeros
    written, reference = (
        tensors(tmp_path / "mixed"),
        tensors(tmp_path / "bf16"),
    )
    source = tensors(half("mixed"))
    for name in got.pruned:
        assert written[name].dtype == torch.bfloat16, name
        assert torch.equal(written[name], reference[name]), name
    assert written["lm_head.weight"].dtype == torch.float32
    assert torch.equal(written["lm_head.weight"], source["lm_head.weight"])


def with_buffer(source: Path, folder: Path) -> Path:
    """`source` copied with one more tensor stored under block 0 that is no parameter of the
    model (older transformers saved the rotary frequencies so)."""
    save(transformers.LlamaForCausalLM.from_pretrained(source), folder)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    file = index["weight_map"]["model.layers.0.self_attn.q_proj.weight"]
    stored = safetensors_torch.load_file(str(folder / file))
    stored[INV_FREQ] = torch.arange(1.0, 5.0)
    safetensors_torch.save_file(stored, str(folder / file), metadata={"format": "pt"})
    index["weight_map"][INV_FREQ] = file
    index_path.write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("call", ["prune_streamed", "shrink_streamed"])
def test_a_block_tensor_that_is_no_parameter_is_copied_as_stored(
    tiny_llama: Callable[..., Path], tmp_path: Path, call: str
) -> None:
    folder = with_buffer(tiny_llama(VOCAB, 2), tmp_path / "src")
    out = tmp_path / "out"
    if call == "prune_streamed":
        prune_streamed(folder, out, "wanda", 0.5, calibration=batches())
    else:
        shrink(folder, out)
    written = tensors(out)[INV_FREQ]
    assert torch.equal(written, torch.arange(1.0, 5.0)), written


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_float16_folder_with_tied_embeddings_stays_float16_and_tied(
    half: Callable[[str], Path], tmp_path: Path, method: str
) -> None:
    source = half("fp16-tied")
    done = prune_streamed(source, tmp_path / "out", method, 0.5, calibration=batches())
    written, stored = tensors(tmp_path / "out"), tensors(source)
    assert set(written) == set(stored) and "lm_head.weight" not in written
    assert {t.dtype for t in written.values()} == {torch.float16}
    assert (tmp_path / "out" / "config.json").read_bytes() == (source / "config.json").read_bytes()
    assert done.zeros == done.numel // 2 and len(done.pruned) == 14
    for name, tensor in written.items():
        assert bool(torch.isfinite(tensor).all()), name
        if name not in done.pruned:
            assert torch.equal(tensor, stored[name]), name
        elif method == "wanda":  # kept weights bit for bit: float16 -> float32 -> float16
            kept = tensor != 0
            assert torch.equal(tensor[kept], stored[name][kept]), name
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out")
    assert model.dtype == torch.float16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_a_shrunk_float16_tied_folder_loads_with_its_config_and_dtype(
    half: Callable[[str], Path], tmp_path: Path
) -> None:
    report = shrink(half("fp16-tied"), tmp_path / "out")
    written = tensors(tmp_path / "out")
    assert {t.dtype for t in written.values()} == {torch.float16}
    assert "lm_head.weight" not in written
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["dtype"] == "float16" and config["tie_word_embeddings"] is True
    assert report.params_after < report.params_before
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out",
                                                              trust_remote_code=True)  # fmt: skip
    assert model.dtype == torch.float16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    loaded = {n: p for n, p in model.state_dict().items() if n in written}
    assert set(loaded) == set(written)
    for name, tensor in written.items():
        assert torch.equal(loaded[name], tensor), name
    assert sum(p.numel() for p in model.parameters()) == report.params_after


def test_values_beyond_float16_range_are_refused_not_written_as_inf(tmp_path: Path) -> None:
    """SparseGPT's float32 updates of weights near float16's largest value go past it; the
    cast back would write inf into the checkpoint without a word."""
    model = tiny_llm.llama(vocab=VOCAB, layers=2)
    with torch.no_grad():
        weight = model.model.layers[0].mlp.down_proj.weight
        weight.copy_(torch.sign(weight) * 6e4 * (0.5 + 0.5 * torch.rand_like(weight)))
    source = save(model.half(), tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("before")
    with pytest.raises(ValueError) as raised:
        prune_streamed(source, out, "sparsegpt", 0.5, calibration=batches())
    message = str(raised.value)
    for words in ("model.layers.0.mlp.down_proj.weight", "float16", "65504"):
        assert words in message, message
    assert digest(out) == {"keep.txt": digest(out)["keep.txt"]}
    assert (out / "keep.txt").read_text() == "before"


@pytest.mark.parametrize("call", ["prune_streamed", "shrink_streamed"])
def test_a_failure_midway_leaves_an_earlier_half_output_byte_for_byte(
    half: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    out = tmp_path / "out"

    def run(path: Path) -> None:
        if call == "prune_streamed":
            prune_streamed(path, out, "sparsegpt", 0.5, calibration=batches())
        else:
            shrink(path, out)

    run(half("bf16"))
    before = digest(out)
    writes: list[str] = []
    from prunekit.io.mapped import Writer

    real = Writer.write

    def failing(self: Writer, name: str, start: int, values: torch.Tensor) -> None:
        writes.append(name)
        if name.startswith("model.layers.1."):  # block 0 is written by now
            raise OSError("disk gone")
        real(self, name, start, values)

    monkeypatch.setattr(Writer, "write", failing)
    with pytest.raises(OSError, match="disk gone"):
        run(half("fp16-tied"))
    assert any(name.startswith("model.layers.0.") for name in writes)
    assert digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing staged left


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_weight_that_is_not_finite_is_named_by_its_path_in_the_model(
    tmp_path: Path, method: str
) -> None:
    model = tiny_llm.llama(vocab=VOCAB, layers=2).to(torch.bfloat16)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("inf")
    source = save(model, tmp_path / "src")
    with pytest.raises(ValueError) as raised:
        prune_streamed(source, tmp_path / "out", method, 0.5, calibration=batches())
    assert "'model.layers.1.mlp.down_proj.weight'" in str(raised.value)
    assert "inf" in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_a_shrunk_folder_of_mixed_dtypes_keeps_its_config_dtype(
    half: Callable[[str], Path], tmp_path: Path
) -> None:
    """The config written names the dtype of the folder (bfloat16, as its config.json says
    and most of its bytes are), not that of the first tensor its index lists (the float32
    head), and every tensor keeps its stored dtype."""
    shrink(half("mixed"), tmp_path / "out")
    source = json.loads((half("mixed") / "config.json").read_text())
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert source["dtype"] == "bfloat16"
    assert written["dtype"] == source["dtype"]
    stored = tensors(half("mixed"))
    for name, tensor in tensors(tmp_path / "out").items():
        assert tensor.dtype == stored[name].dtype, name


@pytest.mark.parametrize("call", ["prune_streamed", "shrink_streamed", "prune_sharded"])
def test_an_earlier_single_file_output_does_not_shadow_the_new_shards(
    tiny_llama: Callable[..., Path], tmp_path: Path, call: str
) -> None:
    """`out` holds an earlier save_pretrained of another model in one file: loaders read
    model.safetensors before an index, so left there it would be loaded instead of what
    the call wrote. Files that are no weights of a model stay."""
    import prunekit

    source = tiny_llama(VOCAB, 2)
    out = tmp_path / "out"
    save_single = tiny_llm.llama(vocab=VOCAB, layers=2, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_single.save_pretrained(out)
    (out / "notes.txt").write_text("mine")
    (out / "adapter_model.safetensors").write_bytes(b"not ours")
    if call == "prune_streamed":
        prune_streamed(source, out, "wanda", 0.5, calibration=batches())
    elif call == "shrink_streamed":
        shrink(source, out)
    else:
        prunekit.prune_sharded(source, out, 0.5, method="l1")
    assert not (out / "model.safetensors").exists()
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "adapter_model.safetensors").read_bytes() == b"not ours"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = {p.name for p in out.glob("model-*.safetensors")}
    assert shards == set(index["weight_map"].values())
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    written = {}
    for file in shards:
        with safe_open(str(out / file), "pt") as opened:
            written.update({n: opened.get_tensor(n) for n in opened.keys()})  # noqa: SIM118
    assert len(written) == len(index["weight_map"])
    for name, tensor in loaded.state_dict().items():
        if name in written:
            assert torch.equal(tensor, written[name]), name
