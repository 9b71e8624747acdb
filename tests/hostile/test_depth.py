"""Hostile calls of prune_blocks, skip_blocks, remove_blocks and load_compacted (after the
fixes of issue 50): every refusal names the bad argument, batch or file and leaves the model
(bit for bit, config, modes) and the folder as they were; a success computes what the model
computed with the blocks skipped, or what was saved."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from hostile.support import llama, refused, tree, unchanged
from prunekit.structure.depth import block_pruning as depth_prune

transformers = pytest.importorskip("transformers")

VOCAB = 300


def calibration(count: int = 2) -> list[dict[str, Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [{"input_ids": torch.randint(0, VOCAB, (1, 12), generator=g)} for _ in range(count)]


IDS = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(3))


def logits(model: nn.Module) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(input_ids=IDS).logits
    return out


BAD_PRUNE: list[tuple[str, dict[str, Any], type[BaseException] | tuple[Any, ...], str]] = [
    ("n-zero", {"n": 0}, ValueError, r"count=0"),
    ("n-all", {"n": 3}, ValueError, r"count=3"),
    ("n-negative", {"n": -1}, ValueError, r"count=-1"),
    ("n-bool", {"n": True}, ValueError, r"count=True"),
    ("n-float", {"n": 1.5}, ValueError, r"count=1\.5"),
    ("n-nan", {"n": math.nan}, ValueError, r"count=nan"),
    ("n-str", {"n": "1"}, ValueError, r"count='1'"),
    ("n-and-amount", {"n": 1, "amount": 0.3}, ValueError, r"exactly one"),
    ("amount-one", {"n": None, "amount": 1.0}, ValueError, r"amount=1\.0"),
    ("amount-nan", {"n": None, "amount": math.nan}, ValueError, r"amount=nan"),
    ("amount-tiny", {"n": None, "amount": 0.01}, ValueError, r"amount=0\.01.*rounds to 0"),
    ("criterion-upper", {"criterion": "ANGULAR"}, ValueError, r"criterion='ANGULAR'"),
    ("criterion-int", {"criterion": 3}, TypeError, r"criterion=3"),
    ("replace-true", {"replace": True}, ValueError, r"replace=True"),
    ("replace-upper", {"replace": "Linear"}, ValueError, r"replace='Linear'"),
    ("ridge-nan", {"ridge": math.nan}, ValueError, r"ridge=nan"),
    ("ridge-negative", {"ridge": -1.0}, ValueError, r"ridge=-1\.0"),
    ("ridge-bool", {"ridge": True}, ValueError, r"ridge=True"),
    ("blocks-missing", {"blocks": "model.nothing"}, (ValueError, AttributeError),
     r"model\.nothing"),
    ("blocks-not-a-list", {"blocks": "lm_head"}, (ValueError, TypeError), r"lm_head"),
    ("calibration-none", {"calibration": None}, ValueError, r"calibration=None"),
    ("calibration-empty", {"calibration": []}, ValueError, r"no batch"),
    ("batch-out-of-vocab", {"calibration": [{"input_ids": torch.tensor([[1, 5000]])}]},
     ValueError, r"batch 0"),
    ("batch-negative", {"calibration": [torch.tensor([[1, -5]])]}, ValueError, r"batch 0"),
    ("batch-float", {"calibration": [torch.rand(1, 5)]}, (TypeError, ValueError), r"batch 0"),
    ("batch-meta", {"calibration": [torch.ones(1, 4, dtype=torch.long, device="meta")]},
     (TypeError, ValueError), r"batch 0|meta"),
    ("batch-empty", {"calibration": [torch.zeros(1, 0, dtype=torch.long)]}, ValueError,
     r"batch 0|empty|no token"),
    ("batch-mask-zero", {"calibration": [{"input_ids": torch.tensor([[1, 2, 3]]),
                                          "attention_mask": torch.zeros(1, 3)}]},
     ValueError, r"attention_mask"),
    ("loss-nan", {"criterion": "loss", "loss": lambda out, batch: torch.tensor(math.nan)},
     ValueError, r"loss|NaN|nan"),
    ("criterion-nan", {"criterion": lambda a, b: torch.tensor(math.nan)}, ValueError,
     r"NaN|nan|score"),
    ("criterion-complex", {"criterion": lambda a, b: torch.tensor(1j)}, (TypeError, ValueError),
     r"complex|score"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "options", "error", "match"), BAD_PRUNE,
                         ids=[c[0] for c in BAD_PRUNE])  # fmt: skip
def test_prune_blocks_names_a_bad_argument_and_changes_nothing(
    case: str, options: dict[str, Any], error: type[BaseException], match: str
) -> None:
    model = llama("dense")
    arguments: dict[str, Any] = {"calibration": calibration(), "n": 1, **options}
    cal, n = arguments.pop("calibration"), arguments.pop("n")
    refused(lambda: prunekit.prune_blocks(model, cal, n, **arguments), error, match,
            model=model)  # fmt: skip


def test_prune_blocks_refuses_a_model_that_is_no_module() -> None:
    refused(lambda: prunekit.prune_blocks("model", calibration(), 1), TypeError,  # type: ignore[arg-type]
            r"model='model' is no torch\.nn\.Module")  # fmt: skip


BAD_SKIP: list[tuple[str, Any, type[BaseException], str]] = [
    ("empty", [], ValueError, r"indices=\[\]"),
    ("out-of-range", [3], ValueError, r"indices=\[3\]"),
    ("negative", [-1], ValueError, r"indices=\[-1\]"),
    ("bool", [True], ValueError, r"indices=\[True\]"),
    ("float", [1.0], ValueError, r"indices=\[1\.0\]"),
    ("repeated", [1, 1], ValueError, r"indices=\[1, 1\]"),
    ("all", [0, 1, 2], ValueError, r"every block"),
    ("str", "1", TypeError, r"indices='1'"),
    ("int", 1, TypeError, r"indices=1"),
    ("tensor", torch.tensor([1]), ValueError, r"indices="),
    ("none", None, TypeError, r"indices=None"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "indices", "error", "match"), BAD_SKIP,
                         ids=[c[0] for c in BAD_SKIP])  # fmt: skip
def test_skip_blocks_names_bad_indices_and_changes_nothing(
    case: str, indices: Any, error: type[BaseException], match: str
) -> None:
    model = llama("dense")
    refused(lambda: prunekit.skip_blocks(model, indices), error, match, model=model)


def test_skip_blocks_refuses_inputs_of_no_kind() -> None:
    model = llama("dense")
    refused(lambda: prunekit.skip_blocks(model, [1], example_inputs="ids"), TypeError,
            r"example_inputs of type str", model=model)  # fmt: skip


def test_a_skip_of_all_that_is_left_is_refused() -> None:
    model = llama("dense")
    prunekit.skip_blocks(model, [0, 1])
    refused(lambda: prunekit.skip_blocks(model, [2]), ValueError, r"every block", model=model)


REMOVE: list[tuple[str, Callable[[nn.Module], Any], type[BaseException], str]] = [
    ("nothing-skipped", lambda m: prunekit.remove_blocks(m), ValueError, r"no block"),
    ("inputs-str", lambda m: _skip_then(m, example_inputs="ids"), TypeError,
     r"example_inputs of type str"),
    ("inputs-out-of-vocab", lambda m: _skip_then(m, example_inputs={"input_ids":
                                                                     torch.tensor([[1, 5000]])}),
     ValueError, r"example_inputs"),
    ("inputs-meta", lambda m: _skip_then(m, example_inputs={"input_ids": torch.ones(
        1, 4, dtype=torch.long, device="meta")}), ValueError, r"example_inputs"),
    ("blocks-missing", lambda m: _skip_then(m, blocks="model.nothing"), (ValueError,
                                                                          AttributeError),
     r"model\.nothing"),
]  # fmt: skip


def _skip_then(model: nn.Module, **options: Any) -> Any:
    """Skip block 1 (not part of the refused call: the fingerprint is taken after it)."""
    return prunekit.remove_blocks(model, **options)


@pytest.mark.parametrize(("case", "call", "error", "match"), REMOVE, ids=[c[0] for c in REMOVE])
def test_remove_blocks_names_a_bad_call_and_changes_nothing(
    case: str, call: Callable[[nn.Module], Any], error: type[BaseException], match: str
) -> None:
    model = llama("dense")
    if case != "nothing-skipped":
        prunekit.skip_blocks(model, [1])
    refused(lambda: call(model), error, match, model=model)


@pytest.mark.parametrize("stage", ["fold", "delete", "check"])
def test_an_interrupt_inside_remove_blocks_restores_the_model(
    stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prunekit.structure.depth import remove

    model = llama("dense")
    prunekit.prune_blocks(model, calibration(), 1, replace="linear")

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    name = {"fold": "fold", "delete": "_delete", "check": "check_outputs"}[stage]
    monkeypatch.setattr(remove, name, interrupted)
    refused(lambda: prunekit.remove_blocks(model), KeyboardInterrupt, "", model=model)


def test_an_interrupt_inside_prune_blocks_restores_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    original = depth_prune.skip

    def interrupted(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(*args)

    monkeypatch.setattr(depth_prune, "skip", interrupted)
    model = llama("dense")
    refused(lambda: prunekit.prune_blocks(model, calibration(), 2, criterion="influence"),
            KeyboardInterrupt, "", model=model)  # fmt: skip


@pytest.mark.parametrize("kind", ["dense", "per-layer"])
def test_blocks_removed_compute_what_the_skipped_model_did_and_repeat(kind: str) -> None:
    model = llama(kind)
    prunekit.prune_blocks(model, calibration(), 1)
    skipped = logits(model)
    prunekit.remove_blocks(model)
    assert len(model.model.layers) == 2 == model.config.num_hidden_layers
    assert torch.allclose(logits(model), skipped, rtol=1e-5, atol=1e-5)
    refused(lambda: prunekit.remove_blocks(model), ValueError, r"no block", model=model)
    prunekit.prune_blocks(model, calibration(), 1)  # again, on what is left
    prunekit.remove_blocks(model)
    assert len(model.model.layers) == 1 == model.config.num_hidden_layers


def test_prune_blocks_twice_without_removing_is_refused() -> None:
    model = llama("dense")
    prunekit.prune_blocks(model, calibration(), 1)
    refused(lambda: prunekit.prune_blocks(model, calibration(), 1), ValueError,
            r"skipped already", model=model)  # fmt: skip


# --- load_compacted on damaged folders --------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Tensor]:
    """A per-layer compacted Llama with a block removed, saved by save_compacted, and its
    logits."""
    model = llama("per-layer")
    prunekit.skip_blocks(model, [1])
    prunekit.remove_blocks(model)
    folder = tmp_path_factory.mktemp("compacted") / "model"
    prunekit.save_compacted(model, folder)
    return folder, logits(model)


def _damage(folder: Path, case: str) -> None:
    manifest = folder / "compacted.json"
    values = json.loads(manifest.read_text())
    weights = next(p for p in folder.iterdir() if p.name.startswith("compacted.") and
                   p.suffix in (".safetensors", ".pt"))  # fmt: skip
    if case == "no-manifest":
        manifest.unlink()
    elif case == "manifest-garbage":
        manifest.write_text("{garbage")
    elif case == "manifest-a-list":
        manifest.write_text("[]")
    elif case == "modules-a-list":
        values["modules"] = []
        manifest.write_text(json.dumps(values))
    elif case == "version-99":
        values["version"] = 99
        manifest.write_text(json.dumps(values))
    elif case == "weights-truncated":
        weights.write_bytes(weights.read_bytes()[:-500])
    elif case == "weights-missing":
        weights.unlink()
    elif case == "shape-changed":
        text = manifest.read_text()
        manifest.write_text(text.replace('"out_features": 32', '"out_features": 31', 1))


DAMAGED = ["no-manifest", "manifest-garbage", "manifest-a-list", "modules-a-list",
           "version-99", "weights-truncated", "weights-missing", "shape-changed"]  # fmt: skip


@pytest.mark.parametrize("case", DAMAGED)
def test_load_compacted_refuses_a_damaged_folder_and_changes_no_model(
    case: str, saved: tuple[Path, Tensor], tmp_path: Path
) -> None:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(saved[0], folder)
    _damage(folder, case)
    if case == "shape-changed" and tree(folder) == tree(saved[0]):
        pytest.skip("no such field to damage")
    existing = llama("dense")
    refused(lambda: prunekit.load_compacted(folder, factory=lambda config: existing),
            (ValueError, OSError, RuntimeError), r"compacted|model", model=existing,
            paths=(folder,))  # fmt: skip
    target = llama("dense")
    refused(lambda: prunekit.load_compacted(target, folder), (ValueError, OSError, RuntimeError),
            r"compacted|model", model=target, paths=(folder,))  # fmt: skip


def test_load_compacted_reads_back_what_was_saved_twice(saved: tuple[Path, Tensor]) -> None:
    folder, expected = saved
    before = tree(folder)
    for _ in range(2):
        loaded = prunekit.load_compacted(folder)
        assert torch.equal(logits(loaded), expected)
        assert len(loaded.model.layers) == 2
    assert tree(folder) == before


@pytest.mark.parametrize("where", ["missing", "a-file"])
def test_load_compacted_refuses_a_path_that_is_no_folder(where: str, tmp_path: Path) -> None:
    path = tmp_path / "nothing"
    if where == "a-file":
        path.write_text("a file")
    refused(lambda: prunekit.load_compacted(path), (ValueError, OSError), r"nothing",
            paths=(path,))  # fmt: skip


def test_save_compacted_of_a_still_skipped_model_is_refused_or_right(tmp_path: Path) -> None:
    model = llama("uniform")
    prunekit.skip_blocks(model, [1])
    skipped = logits(model)
    before = unchanged(model)
    try:
        prunekit.save_compacted(model, tmp_path / "model")
    except ValueError as error:
        assert "skip" in str(error), error
        assert unchanged(model) == before and not (tmp_path / "model").exists()
        return
    loaded = prunekit.load_compacted(tmp_path / "model")
    assert torch.allclose(logits(loaded), skipped, rtol=1e-5, atol=1e-5)
