"""prunekit.report: the numbers of a report, for modules and state_dicts, then its renderings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit
from prunekit.report import Report, TensorRow, human_bytes, report


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 3))


def _zeros(t: torch.Tensor) -> int:
    return int((t == 0).sum())


def test_plain_module_has_one_row_per_floating_parameter() -> None:
    model = _model()
    found = report(model)
    params = dict(model.named_parameters())
    assert [r.name for r in found.rows] == list(params)
    for row in found.rows:
        p = params[row.name]
        assert row.shape == tuple(p.shape)
        assert row.numel == p.numel()
        assert row.zeros == _zeros(p)
        assert not row.masked and row.method is None
    assert found.numel == sum(p.numel() for p in params.values())


def test_pruned_module_rows_use_mask_times_orig_and_name_the_method() -> None:
    model = _model()
    prunekit.l1_unstructured(model[0], "weight", amount=0.5)
    prunekit.random_unstructured(model[0], "weight", amount=3)
    prunekit.ln_structured(model[3], "weight", amount=1, n=2, dim=0)
    with torch.no_grad():  # orig changes after the last forward: module.weight is stale
        model[0].weight_orig.add_(1000.0)
    found = report(model)
    conv = found["0.weight"]
    assert conv.masked
    assert conv.method == "L1Unstructured(0.5)+RandomUnstructured(3)"
    assert conv.zeros == _zeros(model[0].weight_mask) == round(0.5 * 72) + 3
    linear = found["3.weight"]
    assert linear.method == "LnStructured(1)"
    assert linear.zeros == 16
    assert not found["3.bias"].masked
    assert "0.weight_orig" not in {r.name for r in found.rows}


def test_global_pruning_shows_its_masks() -> None:
    model = _model()
    pairs = [(model[0], "weight"), (model[3], "weight")]
    prunekit.global_unstructured(pairs, prunekit.L1Unstructured, amount=0.8)
    found = report(model)
    weights = [found["0.weight"], found["3.weight"]]
    assert sum(r.zeros for r in weights) == round(0.8 * (72 + 48))
    assert all(r.method == "CustomFromMask" for r in weights)
    prunekit.global_unstructured(pairs, prunekit.L1Unstructured, amount=0.5)
    prunekit.l1_unstructured(model[0], "weight", amount=1)
    assert report(model)["0.weight"].method == "CustomFromMask x2+L1Unstructured(1)"


def test_state_dict_with_masks_matches_the_module() -> None:
    model = _model()
    torch_prune.l1_unstructured(model[3], "weight", amount=0.25)
    from_module = report(model)
    from_state = report(model.state_dict())
    linear = from_state["3.weight"]
    assert linear.masked and linear.method is None
    assert linear.zeros == from_module["3.weight"].zeros == 12
    # the state_dict cannot tell buffers from parameters: BatchNorm statistics appear too
    extra = {r.name for r in from_state.rows} - {r.name for r in from_module.rows}
    assert extra == {"1.running_mean", "1.running_var"}  # num_batches_tracked is an int


def test_state_dict_after_remove_has_no_masks_but_the_same_zeros() -> None:
    model = _model()
    prunekit.l1_unstructured(model[3], "weight", amount=0.5)
    prunekit.remove(model[3], "weight")
    row = report(model.state_dict())["3.weight"]
    assert not row.masked and row.zeros == 24


def test_tied_parameters_are_reported_once() -> None:
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].weight
    assert [r.name for r in report(model).rows] == ["0.weight"]


def test_sizes_count_values_and_a_bitmap() -> None:
    t = torch.arange(20, dtype=torch.float64).reshape(4, 5)  # one zero
    row = report({"t": t})["t"]
    assert row.dense_bytes == 20 * 8
    assert row.sparse_bytes == 19 * 8 + math.ceil(20 / 8)
    assert row.sparsity == pytest.approx(1 / 20)
    half = report({"h": torch.zeros(3, dtype=torch.float16)})
    assert half.dense_bytes == 6 and half.sparse_bytes == 1 and half.sparsity == 1.0


def test_empty_tensor_has_zero_sparsity() -> None:
    assert report({"e": torch.empty(0, 3)}).sparsity == 0.0


def test_to_dict_and_json_agree_with_the_rows() -> None:
    model = _model()
    prunekit.l1_unstructured(model[0], "weight", amount=0.5)
    found = report(model)
    data = json.loads(found.to_json())
    assert data == found.to_dict()
    assert [t["name"] for t in data["tensors"]] == [r.name for r in found.rows]
    assert data["totals"]["zeros"] == sum(t["zeros"] for t in data["tensors"])
    assert data["totals"]["nonzeros"] == found.numel - found.zeros
    assert data["totals"]["masked"] == 1
    first = data["tensors"][[t["name"] for t in data["tensors"]].index("0.weight")]
    assert first["shape"] == [4, 2, 3, 3] and first["dtype"] == "float32"


def test_str_is_a_table_of_every_row_and_the_total() -> None:
    model = _model()
    prunekit.l1_unstructured(model[0], "weight", amount=0.5)
    text = str(report(model))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["tensor", "shape", "elements"]
    assert "method" in lines[0]
    for name in ("0.weight", "0.bias", "1.weight", "3.weight"):
        assert any(line.startswith(name + " ") for line in lines)
    total = [line for line in lines if line.startswith("total")]
    assert len(total) == 1 and f"{sum(p.numel() for p in model.parameters()):,}" in total[0]
    assert "L1Unstructured(0.5)" in text
    assert lines[-1].startswith("size:")


def test_str_leaves_out_the_method_column_when_no_row_has_one() -> None:
    assert "method" not in str(report(_model()))


def test_rich_table_renders_the_rows() -> None:
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(report(_model()).rich_table(title="model"))
    text = console.export_text()
    assert "3.weight" in text and "total" in text


def test_rich_table_prints_names_that_look_like_markup_as_they_are() -> None:
    from rich.console import Console

    state = {"blocks.[/].weight": torch.zeros(2, 2), "[bold]x[/bold].bias": torch.ones(3)}
    console = Console(record=True, width=120)
    console.print(report(state).rich_table(title="[model]"))
    text = console.export_text()
    assert "blocks.[/].weight" in text and "[bold]x[/bold].bias" in text and "[model]" in text


def test_plot_writes_a_png(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _model()
    prunekit.l1_unstructured(model[0], "weight", amount=0.5)
    path = report(model).plot(tmp_path / "layers.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rejects_other_inputs() -> None:
    with pytest.raises(TypeError, match=r"expected an nn\.Module or a state_dict"):
        report([torch.ones(2)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="entry 'n' has type int"):
        report({"w": torch.ones(2), "n": 3})  # type: ignore[dict-item]


def test_getitem_names_missing_tensors() -> None:
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        report(_model())["nope"]


def test_human_bytes() -> None:
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 1024**3) == "3.0 GiB"


def test_report_is_exported_and_callable_after_importing_the_module() -> None:
    import importlib

    importlib.import_module("prunekit.report")
    assert prunekit.report is report
    assert isinstance(prunekit.report(_model()), prunekit.Report)
    assert Report is prunekit.Report and TensorRow.__module__ == "prunekit.report"


def test_import_prunekit_stays_light(imported_by: dict[str, frozenset[str]]) -> None:
    assert sorted(imported_by["prunekit"] & {"rich", "matplotlib", "safetensors", "sklearn"}) == []


def test_tensorplay_models_and_state_dicts() -> None:
    tp = pytest.importorskip("tensorplay")
    state = {
        "w": tp.tensor([[0.0, 1.0], [2.0, 0.0]]),
        "v_orig": tp.ones(2, 3),
        "v_mask": tp.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]),
    }
    found = report(state)
    assert [(r.name, r.shape, r.zeros, r.masked) for r in found.rows] == [
        ("w", (2, 2), 2, False),
        ("v", (2, 3), 4, True),
    ]
    assert found["w"].dtype == "float32"
    model = tp.nn.Sequential(tp.nn.Linear(4, 3), tp.nn.Linear(3, 2))
    rows = report(model).rows
    assert [(r.name, r.numel) for r in rows] == [
        (n, p.numel()) for n, p in model.named_parameters()
    ]


class _Custom(nn.Module):
    """A model class defined outside torch, as users' models are."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 2)


def test_user_defined_model_classes() -> None:
    model = _Custom()
    prunekit.l1_unstructured(model.layer, "weight", amount=2)
    found = report(model)
    assert [r.name for r in found.rows] == ["layer.bias", "layer.weight"]
    assert found["layer.weight"].zeros == 2


def test_plot_refuses_an_empty_path_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Path('') is the current folder: refused as such, not as '[Errno 21] Is a directory'."""
    monkeypatch.chdir(tmp_path)
    found = report({"w": torch.ones(4, 4)})
    with pytest.raises(ValueError, match=r"^Report.plot: invalid path=''; expected a path"):
        found.plot("")
    assert list(tmp_path.iterdir()) == []
