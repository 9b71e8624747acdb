"""A number argument too large for a float (an int of hundreds of digits) is checked like
any other: refused with the argument's name where the range is finite, never an
OverflowError from inside the check."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import prunekit
from prunekit.core.checks import check_number
from prunekit.core.errors import is_explained

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


LONGER = 10**5000  # past Python's limit on the digits an int is printed with (4300)


@pytest.mark.parametrize("value", [LONGER, -LONGER], ids=["long", "long-negative"])
def test_an_int_too_long_to_print_is_refused_by_name_with_its_size(value: int) -> None:
    with pytest.raises(ValueError, match=r"^owner: invalid low=.*5001 digits.*; expected an int"):
        check_number(value, "low", "owner", "an int in [1, 10]", lambda v: 1 <= v <= 10,
                     integral=True)  # fmt: skip


@pytest.mark.parametrize("name", ["seed", "length", "floor", "params", "lr"])
def test_a_config_names_an_int_too_long_to_print(name: str, tmp_path: Path) -> None:
    from prunekit.tools.shrink import ShrinkConfig

    options = {"params": 0.25, name: LONGER}
    with pytest.raises(ValueError, match=rf"^ShrinkConfig: .*\b{name}=.*5001 digits") as caught:
        ShrinkConfig(tmp_path / "model", tmp_path / "out", **options)  # type: ignore[arg-type]
    assert is_explained(caught.value)
