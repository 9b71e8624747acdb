"""Hostile calls of prune_channels(..., compensate=True, damping='auto'): a bad damping or
calibration is named and the model left bit for bit as it was; a success is repeatable and
keeps the layers' outputs at least as well as no update on the calibration batches."""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from hostile.support import llama, refused, unchanged


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)).eval()


def batches(count: int = 4, rows: int = 16) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(rows, 8, generator=generator) for _ in range(count)]


X = batches(1)[0]

BAD_DAMPING: list[tuple[str, Any, dict[str, Any], type[BaseException] | tuple[Any, ...], str]] = [
    ("auto-upper", "AUTO", {}, ValueError, r"damping='AUTO'"),
    ("auto-space", "auto ", {}, ValueError, r"damping='auto '"),
    ("empty-str", "", {}, ValueError, r"damping=''"),
    ("number-str", "0.3", {}, (TypeError, ValueError), r"damping='0\.3'"),
    ("nan", math.nan, {}, ValueError, r"damping=nan"),
    ("inf", math.inf, {}, ValueError, r"damping=inf"),
    ("negative", -1.0, {}, ValueError, r"damping=-1\.0"),
    ("zero", 0.0, {}, ValueError, r"damping=0\.0"),
    ("bool", True, {}, (TypeError, ValueError), r"damping.*True"),
    ("complex", 0.3j, {}, (TypeError, ValueError), r"damping.*0\.3j"),
    ("list", [0.3], {}, (TypeError, ValueError), r"damping.*\[0\.3\]"),
    ("tensor", torch.tensor(0.3), {}, (TypeError, ValueError), r"damping.*tensor"),
    ("auto-without-compensation", "auto", {"compensate": False}, ValueError,
     r"damping='auto' needs compensate=True"),
    ("auto-reference", "auto", {"compensate": "reference"}, ValueError, r"damping='auto'"),
    ("auto-no-calibration", "auto", {"calibration": None}, ValueError, r"calibration"),
    ("auto-empty-calibration", "auto", {"calibration": []}, ValueError, r"calibration"),
    ("auto-nan-batch", "auto", {"calibration": [X, torch.full((16, 8), math.nan)]},
     ValueError, r"batch 1|NaN|nan"),
    ("auto-inf-batch", "auto", {"calibration": [X, torch.full((16, 8), math.inf)]},
     ValueError, r"batch 1|inf"),
    ("auto-complex-batch", "auto", {"calibration": [X.to(torch.complex64)]},
     (TypeError, ValueError), r"batch 0|complex"),
    ("auto-meta-batch", "auto", {"calibration": [X.to("meta")]}, (TypeError, ValueError),
     r"batch 0|meta"),
    ("auto-empty-batch", "auto", {"calibration": [torch.zeros(0, 8)]}, ValueError,
     r"batch 0|empty|no row"),
    ("auto-wrong-width", "auto", {"calibration": [torch.zeros(4, 9)]}, ValueError, r"batch 0"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "damping", "options", "error", "match"), BAD_DAMPING,
                         ids=[c[0] for c in BAD_DAMPING])  # fmt: skip
def test_a_bad_damping_or_calibration_is_named_and_changes_nothing(
    case: str, damping: Any, options: dict[str, Any], error: type[BaseException], match: str
) -> None:
    model = mlp()
    arguments: dict[str, Any] = {"compensate": True, "calibration": batches(), **options}
    refused(lambda: prunekit.prune_channels(model, X, 0.25, damping=damping, **arguments),
            error, match, model=model)  # fmt: skip


LLM_CALIBRATION: list[tuple[str, Callable[[], list[Any]], str]] = [
    ("out-of-vocab", lambda: [torch.tensor([[1, 2, 3000]])], r"batch 0"),
    ("negative-ids", lambda: [torch.tensor([[1, -2, 3]])], r"batch 0"),
    ("float-ids", lambda: [torch.rand(1, 6)], r"batch 0"),
    ("mask-all-zero", lambda: [{"input_ids": torch.tensor([[1, 2, 3]]),
                                "attention_mask": torch.zeros(1, 3, dtype=torch.long)}],
     r"attention_mask"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "calibration", "match"), LLM_CALIBRATION,
                         ids=[c[0] for c in LLM_CALIBRATION])  # fmt: skip
def test_calibration_a_language_model_cannot_take_is_named(
    case: str, calibration: Callable[[], list[Any]], match: str
) -> None:
    model = llama("dense")
    ids = torch.tensor([[1, 2, 3, 4]])
    refused(lambda: prunekit.prune_channels(model, ids, 0.25, compensate=True, damping="auto",
                                            calibration=calibration()),
            ValueError, match, model=model)  # fmt: skip


def _outputs(model: nn.Module, data: list[torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(x) for x in data])


def test_auto_is_repeatable_and_no_worse_than_no_update_on_calibration() -> None:
    data = batches(6)
    dense = mlp()
    reference = _outputs(dense, data)
    runs = []
    for _ in range(2):
        model = mlp()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            prunekit.prune_channels(model, X, 0.25, compensate=True, damping="auto",
                                    calibration=data)  # fmt: skip
        runs.append(model)
    assert all(
        torch.equal(a, b)
        for a, b in zip(runs[0].state_dict().values(), runs[1].state_dict().values(), strict=True)
    )
    plain = mlp()
    prunekit.prune_channels(plain, X, 0.25)
    error_auto = float((_outputs(runs[0], data) - reference).pow(2).mean())
    error_none = float((_outputs(plain, data) - reference).pow(2).mean())
    assert math.isfinite(error_auto) and error_auto <= error_none


def test_sparse_batches_compensate_as_their_dense_values() -> None:
    data = batches(4)
    found = []
    for given in (data, [b.to_sparse() for b in data]):
        model = mlp()
        prunekit.prune_channels(model, X, 0.25, compensate=True, damping="auto",
                                calibration=given)  # fmt: skip
        found.append(model.state_dict())
    for key, value in found[0].items():
        assert torch.allclose(value, found[1][key], atol=1e-6), key


@pytest.mark.parametrize("kind", ["one-batch", "one-row", "zeros", "constant"])
def test_tiny_or_degenerate_calibration_gives_finite_weights_or_a_refusal(kind: str) -> None:
    """Too little to hold a fold out, or inputs without variance: a named refusal, or an
    update with finite weights no worse than none on the batches."""
    if kind == "one-batch":
        data = batches(1)
    elif kind == "one-row":
        data = batches(2, rows=1)
    elif kind == "zeros":
        data = [torch.zeros(16, 8) for _ in range(4)]
    else:
        data = [torch.ones(16, 8) for _ in range(4)]
    model = mlp()
    before = unchanged(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            prunekit.prune_channels(model, X, 0.25, compensate=True, damping="auto",
                                    calibration=data)  # fmt: skip
    except ValueError as error:
        assert "calibration" in str(error) or "batch" in str(error), error
        assert unchanged(model) == before
        return
    assert all(bool(p.isfinite().all()) for p in model.parameters())
    plain = mlp()
    prunekit.prune_channels(plain, X, 0.25)
    reference = _outputs(mlp(), data)
    error_auto = float((_outputs(model, data) - reference).pow(2).mean())
    error_none = float((_outputs(plain, data) - reference).pow(2).mean())
    assert error_auto <= error_none * (1 + 1e-6) + 1e-12


def test_auto_on_a_model_pruned_already_changes_nothing_more() -> None:
    data = batches(4)
    model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        prunekit.prune_channels(model, X, 0.25, compensate=True, damping="auto", calibration=data)
        first = copy.deepcopy(model.state_dict())
        prunekit.prune_channels(model, X, 0.25, compensate=True, damping="auto", calibration=data)
    for key, value in model.state_dict().items():
        if key.endswith("_mask"):
            assert torch.equal(value, first[key]), key
