"""prunekit.export.streamed_shrink: a budget with compensation over a sharded folder, block
by block, gives the in-memory prune_channels + compact: the same units kept, the same weights; the
folder loads without prunekit; bad arguments and failures leave the output as it was."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from prunekit.export.hf_folder import MODELING_FILE
from prunekit.export.hfcheck import loaded_output
from prunekit.export.streamed_shrink import ShrinkStreamedConfig, shrink_streamed
from prunekit.io.files import CheckpointError
from prunekit.structure.budget import Budget
from prunekit.structure.compaction.compact import compact
from prunekit.structure.stages.entry import prune_channels

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

VOCAB = 96


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():  # few calibration rows: compensation warns, as in memory
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.fixture
def llama_folder(tiny_llama: Callable[..., Path]) -> Callable[..., Path]:
    """A tiny random Llama (4 query heads in 2 key/value groups, MLP 64) written as shards
    of about one matrix each (shared: read only)."""

    def folder(*, tied: bool = False, layers: int = 3) -> Path:
        return tiny_llama(VOCAB, layers, tied)

    return folder


def batches() -> list[Any]:
    torch.manual_seed(1)
    return [torch.randint(0, VOCAB, (2, 24)), {"input_ids": torch.randint(0, VOCAB, (1, 40))}]


def in_memory(folder: Path, config: ShrinkStreamedConfig, calibration: list[Any]) -> Any:
    """The in-memory run of the same options: prune_channels, then compact."""
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    chosen = prune_channels(model, calibration[0], config=config.channels(calibration))
    compact(model, calibration[0], latency_runs=0)
    return model, chosen


CASES = [
    ShrinkStreamedConfig(Budget(params=0.3)),
    ShrinkStreamedConfig(Budget(params=0.25), criterion="l2", compensate=False),
    ShrinkStreamedConfig(Budget(units=0.3), round_to=4, damping=0.1),
]


@dataclass(frozen=True)
class Shrunk:
    """One config run streamed (into `out`) and in memory, on the same folder and batches."""

    out: Path
    done: Any
    model: Any
    chosen: Any
    calibration: list[Any]


def shrunk(folder: Path, out: Path, config: ShrinkStreamedConfig) -> Shrunk:
    calibration = batches()
    done = shrink_streamed(folder, out, calibration=calibration, config=config)
    model, chosen = in_memory(folder, config, calibration)
    return Shrunk(out, done, model, chosen, calibration)


@pytest.fixture(scope="module")
def compensated(tmp_path_factory: pytest.TempPathFactory, tiny_llama: Any) -> Shrunk:
    """CASES[0] (activation scores, compensated) run once for the two tests that read it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return shrunk(tiny_llama(VOCAB, 3), tmp_path_factory.mktemp("compensated") / "out",
                      CASES[0])  # fmt: skip


@pytest.mark.parametrize("case", range(len(CASES)), ids=["activation-compensated", "l2", "units"])
def test_streamed_is_the_in_memory_result(
    tmp_path: Path, llama_folder: Callable[..., Path], request: pytest.FixtureRequest, case: int
) -> None:
    config = CASES[case]
    if case == 0:
        run: Shrunk = request.getfixturevalue("compensated")
    else:
        run = shrunk(llama_folder(tied=config.criterion == "l2"), tmp_path / "out", config)
    done, model, chosen, out = run.done, run.model, run.chosen, run.out
    assert [(p.group.name, p.units) for p in done.budget] == [
        (p.group.name, p.units) for p in chosen
    ]
    assert done.budget.rows == chosen.rows and done.budget.removed == chosen.removed
    assert done.params_after == sum(p.numel() for p in model.parameters())
    got = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    want = model.state_dict()
    assert set(got.state_dict()) == set(want)
    for name, tensor in got.state_dict().items():
        torch.testing.assert_close(tensor, want[name], rtol=1e-6, atol=1e-7, msg=name)
    ids = run.calibration[0]
    with torch.no_grad():
        torch.testing.assert_close(got.eval()(ids).logits, model(ids).logits)


def test_the_folder_loads_without_prunekit(compensated: Shrunk) -> None:
    done, out = compensated.done, compensated.out
    assert len({(layer.heads, layer.ffn) for layer in done.layers}) > 1  # widths differ
    written = json.loads((out / "config.json").read_text())
    assert written["layer_intermediate_sizes"] == [layer.ffn for layer in done.layers]
    assert (out / MODELING_FILE).is_file()
    ids = compensated.calibration[0]
    found = loaded_output(out, "AutoModelForCausalLM", True, ids)
    with torch.no_grad():
        torch.testing.assert_close(found, compensated.model(ids).logits)


BAD_CONFIGS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"budget": 0.2}, TypeError, r"ShrinkStreamedConfig: invalid budget=0.2"),
    ({"budget": Budget(macs=0.2)}, ValueError, r"invalid budget=Budget\(.*macs=0.2"),
    ({"budget": Budget(params=0.2, kinds=("hidden",))}, ValueError, r"hidden width"),
    ({"criterion": "taylor"}, ValueError, r"invalid criterion='taylor'"),
    ({"criterion": 3}, ValueError, r"invalid criterion=3"),
    ({"compensate": "reference"}, TypeError, r"invalid compensate='reference'"),
    ({"progress": "yes"}, TypeError, r"invalid progress='yes'"),
    ({"damping": -1.0}, ValueError, r"damping=-1.0"),
    ({"compensate": False, "damping": 0.1}, ValueError, r"damping"),
    ({"round_to": 0}, ValueError, r"round_to=0"),
]


@pytest.mark.parametrize(("options", "error", "match"), BAD_CONFIGS)
def test_a_bad_option_is_named(options: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ShrinkStreamedConfig(**{"budget": Budget(params=0.2), **options})


BAD_CALLS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"config": Budget(params=0.2)}, TypeError, r"expected a ShrinkStreamedConfig"),
    ({"calibration": torch.zeros(2, 4, dtype=torch.long)}, TypeError, r"invalid calibration"),
    ({"calibration": []}, ValueError, r"calibration holds no batch"),
    ({"config": ShrinkStreamedConfig(Budget(params=0.99))}, ValueError, "cannot be met"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "error", "match"), BAD_CALLS)
def test_a_bad_call_leaves_no_output(
    tmp_path: Path,
    llama_folder: Callable[..., Path],
    options: dict[str, Any],
    error: type[Exception],
    match: str,
) -> None:
    folder = llama_folder(layers=2)
    arguments = {"calibration": batches(), "config": CASES[0], **options}
    with pytest.raises(error, match=match):
        shrink_streamed(folder, tmp_path / "out", **arguments)
    assert not (tmp_path / "out").exists()


def test_not_a_streamed_family_or_folder(tmp_path: Path) -> None:
    gpt2 = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB)
    transformers.GPT2LMHeadModel(gpt2).save_pretrained(tmp_path / "gpt2", max_shard_size="20KB")
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        shrink_streamed(tmp_path / "gpt2", tmp_path / "out", calibration=batches(),
                        config=CASES[0])  # fmt: skip
    with pytest.raises(CheckpointError):
        shrink_streamed(tmp_path / "none", tmp_path / "out", calibration=batches(),
                        config=CASES[0])  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_failure_midway_leaves_the_output_as_it_was(
    tmp_path: Path, llama_folder: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = llama_folder()
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("before")
    calls: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:  # the second block: the first is written by now
            raise RuntimeError("disk on fire")
        return compact(*args, **kwargs)

    monkeypatch.setattr("prunekit.export.streamed_shrink.compact", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        shrink_streamed(folder, out, calibration=batches(), config=CASES[0])
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing staged left


def test_an_empty_out_is_refused_by_name_before_a_shard_is_read(
    empty_cwd: Path, llama_folder: Callable[..., Path]
) -> None:
    """Path('') is the current folder, which took the shrunk model unasked."""
    folder = llama_folder(layers=1)
    config = ShrinkStreamedConfig(Budget(params=0.2))
    with pytest.raises(ValueError, match=r"^shrink_streamed: invalid out=''; expected a path"):
        shrink_streamed(folder, "", calibration=batches(), config=config)
    assert list(empty_cwd.iterdir()) == []
