"""core.standard_json: what report.json (prunekit shrink) and results.json (prunekit demo)
are written with. A float that is not finite is null, named with what it was under
not_finite, so strict readers (which refuse NaN and Infinity) take the file; read back, the
values are restored."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from prunekit.core.standard_json import NOT_FINITE, dumps, restored, standard


def _strict(text: str) -> Any:
    """JSON as a strict reader takes it: NaN, Infinity and -Infinity refused."""

    def refused(name: str) -> None:
        raise ValueError(f"not standard JSON: {name}")

    return json.loads(text, parse_constant=refused)


def test_each_value_that_is_not_finite_is_null_and_named_where_it_was() -> None:
    found = {"a": 1.5, "b": {"c": math.inf, "d": [0.0, -math.inf, math.nan]}, "e": "inf"}
    values = standard(found)
    assert values == {
        "a": 1.5,
        "b": {"c": None, "d": [0.0, None, None]},
        "e": "inf",
        NOT_FINITE: {"b.c": "inf", "b.d.1": "-inf", "b.d.2": "nan"},
    }
    assert found["b"]["c"] == math.inf  # the values given are left as they were
    read = _strict(dumps(values))
    assert read == values
    back = restored(read)
    assert back["b"]["c"] == math.inf and back["b"]["d"][1] == -math.inf
    assert math.isnan(back["b"]["d"][2]) and NOT_FINITE not in back
    assert back["a"] == 1.5 and back["e"] == "inf"


def test_every_value_finite_gives_an_empty_map() -> None:
    values = standard({"x": [1, 2.5], "y": None})
    assert values == {"x": [1, 2.5], "y": None, NOT_FINITE: {}}
    assert restored(values) == {"x": [1, 2.5], "y": None}


def test_dumps_refuses_a_value_left_not_finite() -> None:
    # an internal bug (a value not passed through standard), never written as NaN
    with pytest.raises(ValueError, match="JSON"):
        dumps({"x": math.nan})
