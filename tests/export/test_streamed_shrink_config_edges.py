"""ShrinkStreamedConfig names itself and the option set in every refusal, damping and round_to
included (they are checked again by prune_channels' ChannelConfig, whose name the user never
wrote), and refuses them as the caller's error."""

from __future__ import annotations

from typing import Any

import pytest

from prunekit import Budget
from prunekit.core.errors import is_explained
from prunekit.export import ShrinkStreamedConfig

REFUSED: list[tuple[dict[str, Any], type[Exception], str]] = [
    (
        {"damping": -1.0},
        ValueError,
        "invalid damping=-1.0; expected 'rows', 'auto' or a finite number > 0",
    ),
    ({"damping": 0.0}, ValueError, "invalid damping=0.0; expected"),
    ({"damping": float("nan")}, ValueError, "invalid damping=nan; expected"),
    ({"damping": float("inf")}, ValueError, "invalid damping=inf; expected"),
    ({"damping": "often"}, ValueError, "invalid damping='often'; expected 'rows'"),
    ({"damping": True}, TypeError, "damping must be 'rows', 'auto' or a number > 0, not bool"),
    ({"damping": [0.1]}, TypeError, "damping must be 'rows', 'auto' or a number > 0, not list"),
    ({"compensate": False, "damping": 0.1}, ValueError, "damping=0.1 needs compensate=True"),
    ({"round_to": 0}, ValueError, "invalid round_to=0; expected an int >= 1, or None"),
    ({"round_to": -8}, ValueError, "invalid round_to=-8; expected an int >= 1"),
    ({"round_to": 2.0}, ValueError, "invalid round_to=2.0; expected an int >= 1"),
    ({"round_to": True}, ValueError, "invalid round_to=True; expected an int >= 1"),
    ({"round_to": "8"}, ValueError, "invalid round_to='8'; expected an int >= 1"),
]


@pytest.mark.parametrize(("options", "error", "message"), REFUSED)
def test_damping_and_round_to_are_refused_in_the_configs_name(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        ShrinkStreamedConfig(Budget(params=0.2), **options)
    text = str(raised.value)
    assert text.startswith(f"ShrinkStreamedConfig: {message}"), text
    assert "prune_channels" not in text
    assert is_explained(raised.value)


@pytest.mark.parametrize(
    "options",
    [{"damping": 0.05}, {"damping": "auto"}, {"damping": 2}, {"round_to": 1}, {"round_to": 64}],
)
def test_what_is_allowed_is_taken_as_given(options: dict[str, Any]) -> None:
    config = ShrinkStreamedConfig(Budget(params=0.2), **options)
    for name, value in options.items():
        assert getattr(config, name) == value
