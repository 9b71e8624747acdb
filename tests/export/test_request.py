"""prunekit.export.request: the report's text."""

from __future__ import annotations

from pathlib import Path

from prunekit.export.request import ExportReport


def test_a_report_reads_with_and_without_a_difference() -> None:
    checked = ExportReport("onnx", Path("m.onnx"), ("m.onnx",), "onnxruntime 1.31.1", 2.5e-7)
    assert str(checked).splitlines() == [
        "onnx: m.onnx (1 files)",
        "checked by onnxruntime 1.31.1: max relative difference 2.50e-07",
    ]
    read_back = ExportReport("gguf", Path("m.gguf"), ("m.gguf",), "gguf's reader", None, ("x",))
    assert str(read_back).splitlines() == [
        "gguf: m.gguf (1 files)", "checked by gguf's reader (no outputs compared)", "x",
    ]  # fmt: skip
    assert str(ExportReport("hf", Path("out"), ("a", "b"))) == "hf: out (2 files)"
