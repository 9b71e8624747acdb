"""benchmarks/run.py --quick runs end to end and prints its table (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_quick_benchmark_prints_every_case() -> None:
    proc = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for case in (
        "l1_unstructured",
        "l1 again (container)",
        "random_unstructured",
        "ln_structured Linear",
        "ln_structured Conv2d",
        "l1 per layer, ResNet-18 shapes",
        "global_unstructured",
        "no-grad forward",
        "training step",
    ):
        assert case in out, out
    assert "failed" not in out and " NO" not in out, out


def test_calibrated_benchmark_nm_part_runs_and_masks_are_exact() -> None:
    script = RUN.parent / "calibrated.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--nm-only", "--quick", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line[:3] in ("2:4", "4:8")]
    assert len(rows) == 2 and all(row.endswith("yes") for row in rows), proc.stdout
