"""Hostile calls of prunekit.prune_streamed and of `prunekit prune DIR --method wanda|sparsegpt
--calibration FILE`: every refusal names the bad argument, batch or file and leaves the
source's files and the output location as they were; a success writes, on a repeat too, what
the in-memory prune_model computes."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import prunekit
from hostile.support import refused, tree
from prunekit.io.files import CheckpointError
from prunekit.io.streamed import prune_streamed
from prunekit.tools.cli import main

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

VOCAB = 300


def ids(*shape: int, high: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(0))


GOOD = [ids(1, 12), {"input_ids": ids(2, 8)}]

BAD_ARGUMENTS: list[tuple[str, dict[str, Any], type[BaseException] | tuple[Any, ...], str]] = [
    ("method-upper", {"method": "WANDA"}, ValueError, r"method='WANDA'"),
    ("method-none", {"method": None}, ValueError, r"method=None"),
    ("method-magnitude", {"method": "l1"}, ValueError, r"method='l1'"),
    ("amount-nan", {"amount": math.nan}, ValueError, r"amount=nan"),
    ("amount-inf", {"amount": math.inf}, ValueError, r"amount=inf"),
    ("amount-negative", {"amount": -0.1}, ValueError, r"amount=-0\.1"),
    ("amount-above-one", {"amount": 1.5}, ValueError, r"amount=1\.5"),
    ("amount-str", {"amount": "0.5"}, (TypeError, ValueError), r"amount='0\.5'"),
    ("amount-bool", {"amount": True}, (TypeError, ValueError), r"amount=True"),
    ("amount-complex", {"amount": 0.5j}, (TypeError, ValueError), r"amount=0\.5j"),
    ("damp-nan", {"method": "sparsegpt", "damp": math.nan}, ValueError, r"damp=nan"),
    ("damp-negative", {"method": "sparsegpt", "damp": -1.0}, ValueError, r"damp=-1\.0"),
    ("blocksize-zero", {"method": "sparsegpt", "blocksize": 0}, ValueError, r"blocksize=0"),
    ("blocksize-bool", {"method": "sparsegpt", "blocksize": True}, (TypeError, ValueError),
     r"blocksize=True"),
    ("sequential-false", {"sequential": False}, ValueError, r"sequential=False"),
    ("sequential-str", {"sequential": "blocks"}, ValueError, r"sequential='blocks'"),
    ("pattern-unknown", {"pattern": "diagonal"}, ValueError, r"pattern='diagonal'"),
    ("calibration-none", {"calibration": None}, TypeError, r"calibration"),
    ("calibration-empty", {"calibration": []}, ValueError, r"no batch"),
    ("calibration-str", {"calibration": ["some text"]}, (TypeError, ValueError), r"batch"),
    ("batch-empty", {"calibration": [torch.zeros((1, 0), dtype=torch.long)]}, ValueError,
     r"batch"),
    ("batch-out-of-vocab", {"calibration": [torch.tensor([[1, 2, 5000]])]}, ValueError,
     r"batch 0"),
    ("batch-negative", {"calibration": [torch.tensor([[1, -2, 3]])]}, ValueError, r"batch 0"),
    ("batch-float-nan", {"calibration": [torch.full((1, 4), math.nan)]}, (TypeError, ValueError),
     r"batch 0"),
    ("batch-complex", {"calibration": [torch.ones((1, 4), dtype=torch.complex64)]},
     (TypeError, ValueError), r"batch 0"),
    ("batch-meta", {"calibration": [torch.ones((1, 4), dtype=torch.long, device="meta")]},
     (TypeError, ValueError), r"batch 0"),
    ("batch-sparse", {"calibration": [ids(1, 4).to_sparse()]}, (TypeError, ValueError),
     r"batch 0"),
    ("batch-second-bad", {"calibration": [ids(1, 4), torch.tensor([[VOCAB]])]}, ValueError,
     r"batch 1"),
    ("batch-no-ids", {"calibration": [{"attention_mask": torch.ones(1, 4)}]},
     (TypeError, ValueError), r"batch 0"),
    ("batch-mask-all-zero", {"calibration": [{"input_ids": ids(1, 6),
                                              "attention_mask": torch.zeros(1, 6)}]},
     ValueError, r"attention_mask"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "options", "error", "match"), BAD_ARGUMENTS,
                         ids=[c[0] for c in BAD_ARGUMENTS])  # fmt: skip
def test_a_bad_argument_or_batch_is_named(
    case: str, options: dict[str, Any], error: type[BaseException], match: str,
    sharded: Path, tmp_path: Path,
) -> None:  # fmt: skip
    arguments: dict[str, Any] = {"method": "wanda", "amount": 0.5, "calibration": GOOD, **options}
    out = tmp_path / "out"
    refused(lambda: prune_streamed(sharded, out, **arguments), error, match,
            paths=(sharded, out))  # fmt: skip


# --- sources ----------------------------------------------------------------------------------


def _damage(source: Path, case: str) -> None:
    index = source / "model.safetensors.index.json"
    values = json.loads(index.read_text())
    first = next(iter(values["weight_map"]))
    if case == "no-index":
        index.unlink()
    elif case == "index-map-a-list":
        index.write_text(json.dumps({"weight_map": list(values["weight_map"])}))
    elif case == "index-missing-shard":
        values["weight_map"][first] = "model-99-of-99.safetensors"
        index.write_text(json.dumps(values))
    elif case == "index-escapes":
        values["weight_map"][first] = "../model.safetensors"
        index.write_text(json.dumps(values))
    elif case == "shard-truncated":
        shard = source / values["weight_map"]["model.layers.1.mlp.down_proj.weight"]
        shard.write_bytes(shard.read_bytes()[:-64])
    elif case == "shard-garbage":
        shard = source / values["weight_map"][first]
        shard.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    elif case == "no-config":
        (source / "config.json").unlink()
    elif case == "config-garbage":
        (source / "config.json").write_text("{garbage")
    elif case == "config-gpt2":
        config = json.loads((source / "config.json").read_text())
        config["model_type"] = "gpt2"
        (source / "config.json").write_text(json.dumps(config))
    elif case == "config-wider":
        config = json.loads((source / "config.json").read_text())
        config["intermediate_size"] = 96
        (source / "config.json").write_text(json.dumps(config))
    elif case == "config-more-layers":
        config = json.loads((source / "config.json").read_text())
        config["num_hidden_layers"] = 3
        (source / "config.json").write_text(json.dumps(config))
    elif case == "extra-stray-shard":
        (source / "stray.safetensors").write_bytes(b"junk")


SOURCES = [
    ("no-index", CheckpointError, r"index\.json"),
    ("index-map-a-list", CheckpointError, r"weight_map"),
    ("index-missing-shard", CheckpointError, r"model-99-of-99\.safetensors"),
    ("index-escapes", CheckpointError, r"expected a file name"),
    ("shard-truncated", CheckpointError, r"safetensors"),
    ("shard-garbage", CheckpointError, r"safetensors"),
    ("no-config", CheckpointError, r"config\.json"),
    ("config-garbage", (CheckpointError, ValueError), r"config\.json"),
    ("config-gpt2", ValueError, r"model_type='gpt2'"),
    ("config-wider", CheckpointError, r"stored as"),
    ("config-more-layers", CheckpointError, r"model\.layers\.2"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "error", "match"), SOURCES, ids=[c[0] for c in SOURCES])
def test_a_damaged_source_is_refused(
    case: str, error: type[BaseException], match: str, sharded: Path,
    copy_of: Callable[[Path], Path], tmp_path: Path,
) -> None:  # fmt: skip
    source = copy_of(sharded)
    _damage(source, case)
    out = tmp_path / "out"
    refused(lambda: prune_streamed(source, out, "wanda", 0.5, calibration=GOOD), error, match,
            paths=(source, out))  # fmt: skip


OUTPUTS = [
    ("out-is-the-source", r"is, holds or lies inside the input folder"),
    ("out-inside-the-source", r"is, holds or lies inside the input folder"),
    ("out-holds-the-source", r"is, holds or lies inside the input folder"),
    ("out-links-to-the-source", r"is, holds or lies inside the input folder"),
    ("out-is-a-file", r"is a file; expected a folder"),
    ("out-no-parent", r"does not exist"),
    ("out-not-writable", r"/proc/prunekit-out: the output needs .* bytes, 0 are free"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "match"), OUTPUTS, ids=[c[0] for c in OUTPUTS])
def test_an_output_it_cannot_take_is_refused(
    case: str, match: str, sharded: Path, copy_of: Callable[[Path], Path], tmp_path: Path
) -> None:
    source = copy_of(sharded)
    out = tmp_path / "place" / "out"
    out.parent.mkdir()
    if case == "out-is-the-source":
        out = source
    elif case == "out-inside-the-source":
        out = source / "pruned"
    elif case == "out-holds-the-source":
        out = tmp_path
    elif case == "out-links-to-the-source":
        out.symlink_to(source)
    elif case == "out-is-a-file":
        out.write_text("mine")
    elif case == "out-no-parent":
        out = tmp_path / "missing" / "out"
    elif case == "out-not-writable":
        out = Path("/proc/prunekit-out")
    watched = (source, out) if case != "out-not-writable" else (source,)  # /proc lists pids
    refused(lambda: prune_streamed(source, out, "wanda", 0.5, calibration=GOOD),
            CheckpointError, match, paths=watched)  # fmt: skip
    assert not Path("/proc/prunekit-out").exists()


# --- interrupted, repeated, right -------------------------------------------------------------


def test_an_interrupt_mid_way_leaves_the_old_output(
    sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prunekit.io import mapped

    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("before")
    calls: list[int] = []
    original = mapped.Writer.write

    def interrupted(self: Any, *args: Any) -> None:
        calls.append(1)
        if len(calls) == 9:  # in the second block
            raise KeyboardInterrupt
        original(self, *args)

    monkeypatch.setattr(mapped.Writer, "write", interrupted)
    refused(lambda: prune_streamed(sharded, out, "sparsegpt", 0.5, calibration=GOOD),
            KeyboardInterrupt, "", paths=(sharded, out))  # fmt: skip
    assert len(calls) == 9


def test_a_repeat_writes_the_same_and_what_prune_model_computes(
    sharded: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    source = tree(sharded)
    first = prune_streamed(sharded, out, "sparsegpt", 0.5, calibration=GOOD)
    written = tree(out)
    second = prune_streamed(sharded, out, "sparsegpt", 0.5, calibration=GOOD)
    assert tree(out) == written and first == second
    assert tree(sharded) == source
    got = transformers.LlamaForCausalLM.from_pretrained(out)
    want = transformers.LlamaForCausalLM.from_pretrained(sharded)
    prunekit.prune_model(want, 0.5, method="sparsegpt", calibration=GOOD)
    for name, tensor in got.state_dict().items():
        assert torch.equal(tensor, want.get_parameter(name).detach() if "layers" not in name
                           else _current(want, name)), name  # fmt: skip


def _current(model: torch.nn.Module, name: str) -> torch.Tensor:
    path, _, leaf = name.rpartition(".")
    value: torch.Tensor = getattr(model.get_submodule(path), leaf)
    return value.detach()


# --- the command ------------------------------------------------------------------------------

COMMANDS = [
    ("cli-text-missing", "missing", [], 1, r"missing\.txt.*cannot read"),
    ("cli-text-empty", "", [], 1, r"no token"),
    ("cli-text-binary", b"\xff\xfe\xfd", [], 1, r"cannot read"),
    ("cli-text-a-folder", "folder", [], 1, r"cannot read"),
    ("cli-window-zero", "some text here", ["--window", "0"], 1, r"--window 0"),
    ("cli-windows-negative", "some text here", ["--windows", "-1"], 1, r"--windows -1"),
    ("cli-amount-nan", "some text here", ["--amount", "nan"], 1, r"amount"),
    ("cli-no-tokenizer", "some text here", ["<no-tokenizer>"], 1, r"tokenizer"),
    ("cli-not-sharded", "some text here", ["<single>"], 1, r"index\.json"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "content", "extra", "status", "match"), COMMANDS,
                         ids=[c[0] for c in COMMANDS])  # fmt: skip
def test_the_command_refuses_with_a_message_and_no_output(
    case: str, content: Any, extra: list[str], status: int, match: str, sharded: Path,
    folder: Path, copy_of: Callable[[Path], Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    text = tmp_path / "missing.txt"
    if content == "folder":
        text.mkdir()
    elif isinstance(content, bytes):
        text.write_bytes(content)
    elif content != "missing":
        text.write_text(content)
    source = sharded
    if "<no-tokenizer>" in extra:
        source = copy_of(sharded)
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                     "special_tokens_map.json"):  # fmt: skip
            (source / name).unlink(missing_ok=True)
    if "<single>" in extra:
        source = folder
    extra = [e for e in extra if not e.startswith("<")]
    amount = [] if "--amount" in extra else ["--amount", "0.5"]
    out = tmp_path / "out"
    before = tree(source, out)
    try:
        code = main(["prune", str(source), "-o", str(out), "--method", "wanda", *amount,
                     "--calibration", str(text), *extra])  # fmt: skip
    except SystemExit as exited:
        code = exited.code
    error = capsys.readouterr().err
    assert code == status, error
    import re

    assert re.search(match, error), error
    assert tree(source, out) == before


@pytest.mark.parametrize("method", ["l1", "ln"])
@pytest.mark.parametrize("kind", ["sharded", "single"])
def test_the_command_refuses_a_seed_the_method_draws_nothing_with(
    method: str, kind: str, sharded: Path, folder: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`--seed` seeds the random method alone: with l1 or ln it was read and silently
    ignored (the run the same with any seed or none)."""
    source = sharded if kind == "sharded" else folder
    out = tmp_path / "out"
    before = tree(source, out)
    code = main(["prune", str(source), "-o", str(out), "--method", method, "--amount", "0.5",
                 "--seed", "3"])  # fmt: skip
    error = capsys.readouterr().err
    assert code == 1, error
    assert "--seed 3" in error and "--method random" in error and method in error, error
    assert tree(source, out) == before
