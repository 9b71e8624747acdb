"""A number argument too large for a float (an int of hundreds of digits) is checked like
any other: refused with the argument's name where the range is finite, never an
OverflowError from inside the check."""

from __future__ import annotations

import math

import pytest

import prunekit
from prunekit.core.checks import check_number

HUGE = 10**400


def test_a_huge_int_outside_a_finite_range_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"owner: invalid seconds=1000.*; expected a finite float"):
        check_number(HUGE, "seconds", "owner", "a finite float > 0", lambda v: 0 < v < math.inf)
    with pytest.raises(ValueError, match=r"owner: invalid low=-1000.*; expected an int >= 1"):
        check_number(-HUGE, "low", "owner", "an int >= 1", lambda v: v >= 1, integral=True)


def test_a_huge_int_inside_an_open_range_passes() -> None:
    check_number(HUGE, "steps", "owner", "an int >= 1", lambda v: v >= 1, integral=True)


def test_a_public_call_names_the_huge_argument() -> None:
    with pytest.raises(ValueError, match=r"SparseGPT: invalid damp=1000.*; expected a finite"):
        prunekit.SparseGPT(damp=HUGE)
