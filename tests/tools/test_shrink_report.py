"""report.json is standard JSON: a value that is not finite (an infinite perplexity: a mean
loss beyond what exp can hold) is null there, with what it was under ``not_finite``, and
the report reads back as it was."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from prunekit.tools.shrink_report import Before, ExportRecord, ShrinkReport


def report(before: float = 12.5, after: float = 14.0, pruned: float = 15.0,
           difference: float | None = 1e-6) -> ShrinkReport:  # fmt: skip
    record = ExportRecord("hf", "hf", ("config.json", "model.safetensors"), "transformers",
                          difference, ("a note",))  # fmt: skip
    return ShrinkReport(
        source="src", out="out", target=("params", 0.25), achieved=0.24,
        budget_table="(table)", groups=(("model.layers.0.mlp", "mlp", 48, 32),),
        params=Before(1000.0, 760.0), macs=Before(900.0, 700.0), bytes=Before(4000.0, 3000.0),
        perplexity=Before(before, after), perplexity_pruned=pruned,
        latency_ms=Before(2.0, 1.5), latency_pairs=3, speedup=1.33, calibration=(8, 32),
        evaluation=(4, 32), distill_steps=0, distill_seconds=0.0, exports=(record,),
        text=("text.txt", "text.txt"), seconds=(("load", 0.5), ("prune", 1.25)),
        storage=("safetensors F32", "safetensors F32"),
    )  # fmt: skip


def standard(text: str) -> Any:
    """`text` read as standard JSON: Infinity, -Infinity and NaN are refused."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in report.json, which is no standard JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_finite_report_has_numbers_and_nothing_not_finite() -> None:
    found = standard(report().to_json())
    assert found["perplexity"] == {"before": 12.5, "after": 14.0, "ratio": 1.12}
    assert found["not_finite"] == {}


@pytest.mark.parametrize(
    ("before", "after", "pruned", "difference", "expected"),
    [
        (12.5, math.inf, math.inf, 1e-6,
         {"perplexity.after": "inf", "perplexity.ratio": "inf", "perplexity_pruned": "inf"}),
        (math.inf, math.inf, 15.0, 1e-6,
         {"perplexity.before": "inf", "perplexity.after": "inf", "perplexity.ratio": "nan"}),
        (12.5, math.nan, 15.0, math.inf,
         {"perplexity.after": "nan", "perplexity.ratio": "nan", "exports.0.difference": "inf"}),
    ],
)  # fmt: skip
def test_values_not_finite_are_null_with_what_they_were(
    before: float, after: float, pruned: float, difference: float, expected: dict[str, str]
) -> None:
    made = report(before, after, pruned, difference)
    text = made.to_json()
    found = standard(text)
    assert found["not_finite"] == expected
    for where in expected:
        value: Any = found
        for key in where.split("."):
            value = value[int(key)] if isinstance(value, list) else value[key]
        assert value is None
    again = ShrinkReport.from_dict(found)
    assert again.to_json() == text
    assert again.perplexity.after == after or math.isnan(after)
    assert again.perplexity.before == before and again.perplexity_pruned == pruned


def test_a_finite_report_reads_back_as_it_was() -> None:
    made = report(difference=None)
    assert ShrinkReport.from_dict(json.loads(made.to_json())) == made


def test_the_written_dtype_reads_back_and_is_said_with_the_perplexity() -> None:
    made = dataclasses.replace(report(), dtype="bfloat16")
    found = json.loads(made.to_json())
    assert found["dtype"] == "bfloat16"
    assert ShrinkReport.from_dict(found) == made
    assert made.summary()[0].endswith("tokens of text.txt; bfloat16 weights as written)")
    markdown = made.to_markdown()
    assert "of text.txt; bfloat16 weights as written, computed in float32." in markdown


def test_a_report_from_before_the_dtype_was_recorded_reads_back_without_one() -> None:
    found = json.loads(report().to_json())
    del found["dtype"]
    again = ShrinkReport.from_dict(found)
    assert again.dtype == "" and again == report()
    assert again.summary()[0].endswith("tokens of text.txt)")


def test_the_latency_says_it_was_timed_in_float32_not_in_the_type_written() -> None:
    """shrink times both models in float32 (PyTorch on the CPU), whatever type it writes:
    the figures say so, and where the weights are written in a half type, that they were
    not timed in it."""
    made = dataclasses.replace(report(), dtype="bfloat16")
    line = made.summary()[-1]
    assert line.startswith("latency ") and line.endswith(
        "median of 3 alternated pairs, 1 x 32 tokens, timed in float32, not bfloat16)"
    )
    assert "Latency: one forward of 1 x 32 tokens in float32 (PyTorch on the CPU; the " in (
        made.to_markdown()
    )
    assert "weights as written, not timed in bfloat16)" in made.to_markdown()
    plain = dataclasses.replace(report(), dtype="float32").summary()[-1]
    assert plain.endswith("1 x 32 tokens, timed in float32)")
