"""prunekit.io.streamed: Wanda and SparseGPT on a sharded Hugging Face folder, one block at a
time, give the in-memory prune_model's masks and weights; the output folder is whole."""

from __future__ import annotations

import inspect
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
from prunekit.io.files import CheckpointError
from prunekit.io.sharded import INDEX
from prunekit.io.streamed import StreamedConfig, prune_streamed
from prunekit.progress import Progress
from prunekit.tools.cli import main
from prunekit.whole import Config
from prunekit.whole.oneshot_execute import prune_block
from prunekit.whole.oneshot_plan import make_plan

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

VOCAB = 96


@pytest.fixture
def llama_folder(tiny_llama: Callable[..., Path]) -> Callable[..., Path]:
    """A tiny random Llama written as shards of about one matrix each (shared: read only)."""

    def folder(*, tied: bool = False, layers: int = 3) -> Path:
        return tiny_llama(VOCAB, layers, tied)

    return folder


def batches() -> list[Any]:
    return [torch.randint(0, VOCAB, (2, 12)), {"input_ids": torch.randint(0, VOCAB, (1, 20))}]


def in_memory(folder: Path, calibration: list[Any], **options: Any) -> Any:
    model = transformers.LlamaForCausalLM.from_pretrained(folder)
    prune.prune_model(model, 0.5, calibration=calibration, **options)
    return model


def assert_same_as_in_memory(out: Path, model: Any) -> None:
    """Every tensor of `out` is the in-memory model's (masked) tensor, bit for bit, and is
    zero exactly where its mask is."""
    got = transformers.LlamaForCausalLM.from_pretrained(out)
    masked = 0
    for name, module in model.named_modules():
        for leaf, _ in module.named_parameters(recurse=False):
            leaf = leaf.removesuffix("_orig")
            key = f"{name}.{leaf}"
            want = getattr(module, leaf)
            have = got.get_submodule(name).get_parameter(leaf).detach()
            assert torch.equal(have, want), key
            mask = module._buffers.get(f"{leaf}_mask")
            if mask is not None:
                masked += 1
                assert torch.equal(have != 0, mask != 0), key
    assert masked == 7 * len(model.model.layers)


@pytest.mark.parametrize(
    ("method", "pattern"),
    [("wanda", None), ("wanda", "unstructured"), ("wanda", "2:4"),
     ("sparsegpt", None), ("sparsegpt", "2:4")],
)  # fmt: skip
def test_streamed_masks_are_the_in_memory_ones(
    tmp_path: Path, llama_folder: Callable[..., Path], method: str, pattern: str | None
) -> None:
    folder = llama_folder(tied=method == "wanda")
    calibration = batches()
    result = prune_streamed(
        folder, tmp_path / "out", method, 0.5, calibration=calibration, pattern=pattern
    )
    model = in_memory(folder, calibration, method=method, pattern=pattern)
    assert_same_as_in_memory(tmp_path / "out", model)
    assert result.blocks == 3 and len(result.pruned) == 21
    assert result.zeros == result.numel // 2
    # The same shard files and index, and the files beside the weights.
    index = json.loads((tmp_path / "out" / INDEX).read_text())
    assert index["weight_map"] == json.loads((folder / INDEX).read_text())["weight_map"]
    assert (tmp_path / "out" / "config.json").read_bytes() == (folder / "config.json").read_bytes()


def test_sparsegpt_block_by_block(tmp_path: Path, llama_folder: Callable[..., Path]) -> None:
    folder = llama_folder()
    calibration = batches()
    prune_streamed(folder, tmp_path / "out", "sparsegpt", 0.5, calibration=calibration,
                   sequential=True)  # fmt: skip
    model = in_memory(folder, calibration, method="sparsegpt", sequential=True)
    assert_same_as_in_memory(tmp_path / "out", model)


@pytest.mark.parametrize(("method", "shown"), [("wanda", "'row'"), ("sparsegpt", "'unstructured'")])
def test_the_bar_names_the_pattern_pruned_with(
    tmp_path: Path, llama_folder: Callable[..., Path], capsys: Any, method: str, shown: str
) -> None:
    """Without pattern=, the bar names the method's own (as prune_model's), not None."""
    prune_streamed(llama_folder(), tmp_path / "out", method, 0.5, calibration=batches(),
                   progress=True)  # fmt: skip
    err = capsys.readouterr().err
    assert f"{method} {shown} streamed [" in err and "None" not in err


def test_a_failure_mid_way_leaves_no_output(
    tmp_path: Path, llama_folder: Callable[..., Path], monkeypatch: Any
) -> None:
    folder = llama_folder()
    calls = []

    def failing(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk gone")
        return prune_block(*args)

    monkeypatch.setattr("prunekit.io.streamed.prune_block", failing)
    with pytest.raises(RuntimeError, match="disk gone"):
        prune_streamed(folder, tmp_path / "out", "wanda", 0.5, calibration=batches())
    assert len(calls) == 2
    assert list(tmp_path.iterdir()) == []  # no output, no stage
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "kept.txt").write_text("before")
    calls.clear()
    with pytest.raises(RuntimeError, match="disk gone"):
        prune_streamed(folder, tmp_path / "out", "wanda", 0.5, calibration=batches())
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["kept.txt"]


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"method": "l1"}, ValueError, ["method='l1'", "wanda, sparsegpt"]),
        ({"calibration": None}, TypeError, ["calibration", "iterable of batches"]),
        ({"calibration": []}, ValueError, ["no batch"]),
        ({"sequential": False}, ValueError, ["sequential=False", "True"]),
        ({"pattern": "3:4"}, ValueError, ["NM(3, 4)", "amount=0.25"]),
        ({"pattern": "diagonal"}, ValueError, ["pattern='diagonal'", "'row'"]),
    ],
)
def test_bad_arguments_are_named(
    tmp_path: Path,
    llama_folder: Callable[..., Path],
    options: dict[str, Any],
    error: type[Exception],
    words: list[str],
) -> None:
    folder = llama_folder(layers=1)
    arguments: dict[str, Any] = {"method": "wanda", "calibration": batches(), **options}
    method = arguments.pop("method")
    with pytest.raises(error) as found:
        prune_streamed(folder, tmp_path / "out", method, 0.5, **arguments)
    for word in words:
        assert word in str(found.value)
    assert not (tmp_path / "out").exists()


def test_a_config_prunes_as_the_keywords_do(
    tmp_path: Path, llama_folder: Callable[..., Path]
) -> None:
    folder = llama_folder(layers=2)
    calibration = batches()
    prune_streamed(folder, tmp_path / "keywords", "sparsegpt", 0.5, calibration=calibration,
                   pattern="2:4", blocksize=8)  # fmt: skip
    config = StreamedConfig("sparsegpt", 0.5, pattern="2:4", blocksize=8)
    prune_streamed(folder, tmp_path / "config", calibration=calibration, config=config)
    for shard in sorted((tmp_path / "keywords").glob("*.safetensors")):
        assert shard.read_bytes() == (tmp_path / "config" / shard.name).read_bytes()


def test_at_most_eight_parameters_beside_the_config() -> None:
    names = list(inspect.signature(prune_streamed).parameters)
    assert names == ["path", "out", "method", "amount", "calibration", "config", "options"]


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: StreamedConfig("l1", 0.5), ValueError, ["method='l1'"]),
        (lambda: StreamedConfig("wanda", 1.5), ValueError, ["amount=1.5"]),
        (lambda: StreamedConfig("wanda", 0.5, sequential=False), ValueError, ["sequential"]),
        (lambda: StreamedConfig("sparsegpt", 0.5, blocksize=0), ValueError, ["blocksize=0"]),
        (lambda: StreamedConfig("sparsegpt", 0.5, damp=-1.0), ValueError, ["damp=-1.0"]),
        (lambda: StreamedConfig("wanda", 0.5, progress="yes"), TypeError, ["progress='yes'"]),
        (lambda: prune_streamed("x", "y", calibration=[], config=StreamedConfig(), amount=0.5),
         ValueError, ["config= holds every option", "amount=0.5"]),
        (lambda: prune_streamed("x", "y", calibration=[], config=StreamedConfig(), damp=0.2),
         ValueError, ["damp="]),
        (lambda: prune_streamed("x", "y", calibration=[], config="wanda"), TypeError,
         ["invalid config='wanda'", "StreamedConfig"]),
        (lambda: prune_streamed("x", "y", "wanda", 0.5, calibration=[], dampening=0.2),
         TypeError, ["unexpected keyword argument 'dampening'"]),
    ],
)  # fmt: skip
def test_the_config_is_checked_when_made(
    call: Any, error: type[Exception], words: list[str]
) -> None:
    with pytest.raises(error) as found:
        call()
    for word in words:
        assert word in str(found.value)


def test_a_family_it_does_not_stream_is_refused(tmp_path: Path) -> None:
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2", max_shard_size="20KB")
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*llama, mistral"):
        prune_streamed(tmp_path / "gpt2", tmp_path / "out", "wanda", 0.5, calibration=batches())
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json"):
        prune_streamed(tmp_path, tmp_path / "out", "wanda", 0.5, calibration=batches())
    assert not (tmp_path / "out").exists()


def test_shards_that_do_not_match_the_config_are_refused(
    tmp_path: Path, llama_folder: Callable[..., Path]
) -> None:
    folder = Path(shutil.copytree(llama_folder(layers=2), tmp_path / "dense"))
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\..*do not hold"):
        prune_streamed(folder, tmp_path / "out", "wanda", 0.5, calibration=batches())


# --- the command line ---------------------------------------------------------------------


def with_tokenizer(folder: Path) -> list[str]:
    """A word-level tokenizer of the folder's vocabulary size, saved beside the weights;
    returns its words."""
    tokenizers = pytest.importorskip("tokenizers")
    words = [f"w{i}" for i in range(VOCAB - 1)]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")
    fast.save_pretrained(folder)
    return words


def test_the_command_line_prunes_a_folder_block_by_block(
    tmp_path: Path, llama_folder: Callable[..., Path], capsys: Any
) -> None:
    folder = Path(shutil.copytree(llama_folder(), tmp_path / "dense"))
    words = with_tokenizer(folder)
    generator = torch.Generator().manual_seed(1)
    picks = torch.randint(0, len(words), (100,), generator=generator).tolist()
    text = tmp_path / "calibration.txt"
    text.write_text(" ".join(words[i] for i in picks))
    argv = ["prune", str(folder), "-o", str(tmp_path / "out"), "--method", "sparsegpt",
            "--amount", "0.5", "--pattern", "2:4", "--calibration", str(text),
            "--window", "16", "--windows", "4"]  # fmt: skip
    assert main(argv) == 0
    assert "Pruned 21 tensors" in capsys.readouterr().out
    ids = torch.tensor([[i + 1 for i in picks]])
    calibration = [{"input_ids": ids[:, i : i + 16]} for i in range(0, 64, 16)]
    model = in_memory(folder, calibration, method="sparsegpt", pattern="2:4")
    assert_same_as_in_memory(tmp_path / "out", model)
    assert (tmp_path / "out" / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--method", "wanda"], ["--method wanda needs --calibration FILE"]),
        (["--method", "magnitude"], ["invalid choice: 'magnitude'", "sparsegpt"]),
        (["--method", "l1", "--calibration", "x.txt"], ["--calibration", "got --method l1"]),
        (["--method", "wanda", "--calibration", "x.txt", "--keep-masks"], ["--keep-masks"]),
        (["--method", "wanda", "--calibration", "x.txt", "--scope", "global"], ["--scope"]),
        (["--method", "wanda", "--calibration", "missing.txt"], ["missing.txt", "cannot read"]),
    ],
)
def test_the_command_line_names_bad_arguments(
    tmp_path: Path,
    llama_folder: Callable[..., Path],
    capsys: Any,
    extra: list[str],
    words: list[str],
) -> None:
    folder = llama_folder(layers=1)
    (tmp_path / "x.txt").write_text("w1 w2 w3")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        status = main(["prune", str(folder), "-o", str(tmp_path / "out"), "--amount", "0.5",
                       *extra])  # fmt: skip
    assert status in (1, 2)
    err = capsys.readouterr().err
    for word in words:
        assert word in err
    assert not (tmp_path / "out").exists()


def test_the_command_line_needs_a_sharded_folder(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "x.txt").write_text("w1 w2 w3")
    argv = ["prune", str(tmp_path), "-o", str(tmp_path / "out"), "--amount", "0.5",
            "--method", "wanda", "--calibration", str(tmp_path / "x.txt")]  # fmt: skip
    assert main(argv) == 1
    assert "no model.safetensors.index.json; --method wanda prunes a sharded" in (
        capsys.readouterr().err
    )


def test_an_empty_out_is_refused_by_name_before_a_shard_is_read(
    empty_cwd: Path, llama_folder: Callable[..., Path]
) -> None:
    """Path('') is the current folder, which took the pruned shards unasked."""
    folder = llama_folder(layers=1)
    with pytest.raises(ValueError, match=r"^prune_streamed: invalid out=''; expected a path"):
        prune_streamed(folder, "", "wanda", 0.5, calibration=batches())
    assert list(empty_cwd.iterdir()) == []


def test_prune_block_on_inputs_of_other_batches_is_an_internal_error() -> None:
    """Its inputs are those of the plan's batches, one each, which is what lets each take
    its batch's token mask: a count that differs is a bug of its caller, raised as such (it
    replaced every mask with None, so padding counted, and went on)."""
    torch.manual_seed(0)
    layer = nn.Linear(8, 8)
    block = nn.Sequential(layer)
    batches = [
        {"x": torch.randn(2, 4, 8), "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])}
        for _ in range(2)
    ]
    plan = make_plan(block, [(layer, "weight")], Config("wanda", 0.5), batches, None)
    before = layer.weight.clone()
    nothing: dict[str, Any] = {}
    inputs = [((batches[0]["x"],), nothing)]  # one input for two batches
    with pytest.raises(AssertionError, match=r"prune_block: 1 block inputs for 2 batches"):
        prune_block(plan, block, [(layer, "weight")], inputs, Progress("", 1, False), False)
    assert torch.equal(layer.weight, before) and not hasattr(layer, "weight_mask")
