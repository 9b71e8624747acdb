"""JSON that strict readers take: ``json.dumps`` writes a float that is not finite as NaN,
Infinity or -Infinity, which are not JSON. Here each is null, and the object's
``not_finite`` map names where it was and what it was; ``restored`` puts them back. What
``prunekit shrink`` (report.json) and ``prunekit demo`` (results.json) write.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["NOT_FINITE", "dumps", "restored", "standard"]

NOT_FINITE = "not_finite"
"""The key under which each value that is not finite (null in its place) is named with what
it was."""


def standard(found: Mapping[str, Any]) -> dict[str, Any]:
    """`found` as standard JSON values.

    Args:
        found: plain values (dicts with str keys, lists, tuples, numbers, strings, None),
            without a key ``NOT_FINITE``.

    Returns:
        A copy of `found` with each float that is not finite None, and ``NOT_FINITE``
        mapping where it was (keys and list indices joined by dots: ``'perplexity.after'``,
        ``'exports.0.difference'``) to what it was (``'inf'``, ``'-inf'`` or ``'nan'``, which
        ``float`` reads back); empty where every value is finite.

    Raises:
        ValueError: `found` already has a key ``NOT_FINITE``.
    """
    if NOT_FINITE in found:
        raise ValueError(
            f"standard_json.standard: a key {NOT_FINITE!r} in the values given; expected "
            "none (it names the values that are not finite)"
        )
    not_finite: dict[str, str] = {}
    values: dict[str, Any] = _standard(dict(found), "", not_finite)
    values[NOT_FINITE] = not_finite
    return values


def restored(found: Mapping[str, Any]) -> dict[str, Any]:
    """The values `standard` was given, from what it gave (or that, written and read back).

    Args:
        found: what ``standard`` gave, or its JSON as ``json.load`` reads it.

    Returns:
        A copy of `found` without ``NOT_FINITE``, each value it names put back in its place.

    Raises:
        KeyError, IndexError: a place ``NOT_FINITE`` names is not in `found`.
    """
    values: dict[str, Any] = json.loads(json.dumps(found))  # a copy to restore into
    for where, value in values.pop(NOT_FINITE, {}).items():
        *path, last = where.split(".")
        inner: Any = values
        for key in path:
            inner = inner[int(key)] if isinstance(inner, list) else inner[key]
        inner[int(last) if isinstance(inner, list) else last] = float(value)
    return values


def dumps(values: Any) -> str:
    """`values` (what ``standard`` gave, or a list of such) as a JSON document, indented by
    two, with a final newline.

    Raises:
        ValueError: a float that is not finite is left in `values` (not made standard).
    """
    return json.dumps(values, indent=2, allow_nan=False) + "\n"


def _standard(value: Any, where: str, not_finite: dict[str, str]) -> Any:
    """`value` with each float that is not finite None, its place (keys and list indices
    joined by dots) and value (``'inf'``, ``'-inf'``, ``'nan'``) put in `not_finite`."""
    if isinstance(value, float) and not math.isfinite(value):
        not_finite[where] = repr(value)
        return None
    inner = f"{where}." if where else ""
    if isinstance(value, dict):
        return {k: _standard(v, f"{inner}{k}", not_finite) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_standard(v, f"{inner}{i}", not_finite) for i, v in enumerate(value)]
    return value
