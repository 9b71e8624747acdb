"""prunekit demo's results.json is standard JSON, as report.json of prunekit shrink: a value
that is not finite is null in its row, named under the row's not_finite (json.dumps wrote
NaN and Infinity, which strict readers refuse)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from prunekit.report import report
from prunekit.tools import demo

pytest.importorskip("matplotlib")


def _strict(text: str) -> Any:
    def refused(name: str) -> None:
        raise ValueError(f"not standard JSON: {name}")

    return json.loads(text, parse_constant=refused)


def test_results_json_writes_a_value_that_is_not_finite_as_null(tmp_path: Path) -> None:
    model = demo.DigitsCNN()
    row = demo.DemoRow("dense", 0.0, 0.75, 10, 10, 40, 40)
    broken = demo.DemoRow("global L1 50%", math.nan, math.inf, 5, 10, 40, 20)
    structured = demo.DemoRow("structured L2 50%", 0.5, 0.5, 5, 10, 40, 20)
    rows = [row, broken, structured]
    demo._write(tmp_path, model, report(model), rows, "global L1 50%")
    results = _strict((tmp_path / "results.json").read_text())
    assert results[0]["accuracy"] == 0.75 and results[0]["not_finite"] == {}
    assert results[1]["sparsity"] is None and results[1]["accuracy"] is None
    assert results[1]["not_finite"] == {"sparsity": "nan", "accuracy": "inf"}
    assert results[1]["nonzeros"] == 5
