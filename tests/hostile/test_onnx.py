"""Hostile example inputs for export(format='onnx'): inputs the check cannot compare on (NaN,
infinity, no value at all) or the model cannot take are refused naming them, before
anything is traced or written; a model in train mode is exported and checked in eval mode
and given back in train mode."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hostile.support import refused

pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

from prunekit.export import export


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 2)).eval()


def with_value(value: float) -> torch.Tensor:
    inputs = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    inputs[1, 2] = value
    return inputs


BAD: list[tuple[str, Any, type[BaseException], str]] = [
    ("nan", with_value(math.nan), ValueError, r"example_inputs\[0\] holds NaN or inf"),
    ("inf", with_value(math.inf), ValueError, r"example_inputs\[0\] holds NaN or inf"),
    ("nan-keyword", {"input": with_value(math.nan)}, ValueError,
     r"example_inputs\['input'\] holds NaN or inf"),
    ("empty-batch", torch.zeros(0, 4), ValueError, r"example_inputs\[0\] is empty"),
    ("meta", torch.zeros(3, 4, device="meta"), ValueError, r"example_inputs\[0\] is on the meta"),
    ("ints-for-a-float-model", torch.ones(3, 4, dtype=torch.long), ValueError,
     r"export\(format='onnx'\): the model cannot take example_inputs: RuntimeError"),
    ("wrong-width", torch.ones(3, 5), ValueError, r"the model cannot take example_inputs"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "inputs", "error", "match"), BAD, ids=[c[0] for c in BAD])
def test_example_inputs_the_check_cannot_use_are_refused_before_tracing(
    tmp_path: Path, case: str, inputs: Any, error: type[BaseException], match: str
) -> None:
    """NaN in the example inputs was traced and written, then refused as "ONNX Runtime's
    output differs from the model's by nan (largest output 0)"; an empty batch was
    'checked' on no value; inputs the model cannot take raised torch's own error."""
    model, path = net(), tmp_path / "net.onnx"
    refused(lambda: export(model, path, "onnx", example_inputs=inputs), error, match,
            model=model, paths=(path,))  # fmt: skip


def test_nan_inputs_are_traced_without_a_check(tmp_path: Path) -> None:
    """With verify=False nothing is compared: NaN in the inputs traces as any value does."""
    report = export(net(), tmp_path / "net.onnx", "onnx", example_inputs=with_value(math.nan),
                    verify=False)  # fmt: skip
    assert report.difference is None and (tmp_path / "net.onnx").is_file()


def test_a_model_in_train_mode_is_exported_in_eval_mode_and_given_back(tmp_path: Path) -> None:
    import onnxruntime as ort

    model = net().train()
    inputs = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))
    report = export(model, tmp_path / "net.onnx", "onnx", example_inputs=inputs)
    assert all(m.training for m in model.modules())
    assert report.difference is not None and report.difference <= 1e-4
    session = ort.InferenceSession(str(tmp_path / "net.onnx"), providers=["CPUExecutionProvider"])
    (found,) = session.run(None, {session.get_inputs()[0].name: inputs.numpy()})
    with torch.no_grad():
        expected = model.eval()(inputs)
    torch.testing.assert_close(torch.from_numpy(found), expected, rtol=1e-4, atol=1e-5)
