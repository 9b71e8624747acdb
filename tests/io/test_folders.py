"""`prunekit prune DIR -o OUT` and `prunekit report DIR` on Hugging Face model folders: the
pruned folder loads with from_pretrained (config, generation config, tokenizer come along)
and generates; single-file and sharded folders alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from prunekit.io.folders import copy_companions
from prunekit.tools.cli import main

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")


def save_llama(folder: Path, shard: str | None) -> int:
    """A small LLaMA and its tokenizer saved in `folder`; returns its parameter count."""
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    options = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(folder, **options)
    vocab = {f"w{i}": i for i in range(31)} | {"<unk>": 31}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>")
    tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text("a model card\n")
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("shard", [None, "8KB"], ids=["single", "sharded"])
def test_a_pruned_folder_loads_and_generates(
    tmp_path: Path, shard: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "model", tmp_path / "pruned"
    save_llama(source, shard)
    assert (source / "model.safetensors.index.json").exists() == (shard is not None)
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    assert main(["prune", str(source), "-o", str(out), "--global", "--amount", "0.5"]) == 0
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before  # only read
    for name in ("config.json", "generation_config.json", "tokenizer.json", "README.md"):
        assert (out / name).read_bytes() == (source / name).read_bytes()
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    q = model.model.layers[0].self_attn.q_proj.weight
    assert 0.2 < float((q == 0).float().mean()) < 0.8  # pruned (globally: not exactly half)
    assert float((model.model.norm.weight == 0).float().mean()) == 0  # norms left alone
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ids = tokenizer("w1 w2 w3", return_tensors="pt")["input_ids"]
    made = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert made.shape == (1, 6)
    capsys.readouterr()
    assert main(["report", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["tensors"]
    names = {row["name"] for row in rows}
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert "model.norm.weight" in names


def test_report_prints_a_sharded_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    count = save_llama(tmp_path, "8KB")
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 0
    assert f"{count:,} non-zero of {count:,}" in capsys.readouterr().out


def test_a_folder_without_weights_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text("{}")
    out = tmp_path / "out"
    assert main(["prune", str(tmp_path), "-o", str(out), "--amount", "0.5"]) == 1
    assert "without model.safetensors" in capsys.readouterr().err
    assert not out.exists()


def test_a_failed_copy_leaves_the_output_folder_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, out = tmp_path / "in", tmp_path / "out"
    source.mkdir()
    out.mkdir()
    for name in ("a.json", "b.json", "c.json"):
        (source / name).write_text(name)
    (source / "model.safetensors").write_text("weights are not copied")
    (out / "b.json").write_text("old")
    import shutil

    real = shutil.copyfile

    def failing(src: Path, dst: str, **kwargs: bool) -> str:
        if Path(src).name == "c.json":
            raise OSError("disk full")
        return str(real(src, dst, **kwargs))

    monkeypatch.setattr(shutil, "copyfile", failing)
    with pytest.raises(OSError, match="disk full"):
        copy_companions(source, out)
    assert sorted(p.name for p in out.iterdir()) == ["b.json"]
    assert (out / "b.json").read_text() == "old"
    monkeypatch.setattr(shutil, "copyfile", real)
    written = copy_companions(source, out)
    assert sorted(p.name for p in written) == ["a.json", "b.json", "c.json"]


@pytest.mark.parametrize("shard", [None, "8KB"], ids=["single", "sharded"])
def test_a_failed_copy_leaves_an_earlier_pruned_folder_as_it_was(
    tmp_path: Path, shard: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights are pruned before the files beside them are copied: a copy that fails
    (a full disk at the tokenizer) leaves the earlier output whole, not new weights beside
    an old config."""
    source, out = tmp_path / "model", tmp_path / "pruned"
    save_llama(source, shard)
    assert main(["prune", str(source), "-o", str(out), "--amount", "0.25"]) == 0
    (source / "README.md").write_text("a newer model card\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    import shutil

    real = shutil.copyfile

    def failing(src: Path, dst: str, **kwargs: bool) -> str:
        if Path(src).name == "tokenizer.json":
            raise OSError("disk full")
        return str(real(src, dst, **kwargs))

    monkeypatch.setattr(shutil, "copyfile", failing)
    assert main(["prune", str(source), "-o", str(out), "--amount", "0.75"]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "pruned"]
