"""ShrinkConfig's checks: a seed torch cannot take is refused when made, a list of kinds is
held as a tuple (the config stays hashable), and Budget's refusals keep their mark as the
user's errors with the config named in front."""

from __future__ import annotations

from pathlib import Path

import pytest

from prunekit.core.errors import is_explained
from prunekit.tools.shrink import LR, ShrinkConfig


def made(tmp_path: Path, **options: object) -> ShrinkConfig:
    return ShrinkConfig(tmp_path / "model", tmp_path / "out", **{"params": 0.25, **options})  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [2**64, 2**70])
def test_a_seed_beyond_what_torch_takes_is_refused_when_made(tmp_path: Path, seed: int) -> None:
    with pytest.raises(ValueError, match=rf"ShrinkConfig: invalid seed={seed}"):
        made(tmp_path, seed=seed)


def test_the_largest_seed_torch_takes_is_accepted(tmp_path: Path) -> None:
    assert made(tmp_path, seed=2**64 - 1).seed == 2**64 - 1


def test_a_list_of_kinds_is_held_as_a_tuple(tmp_path: Path) -> None:
    config = made(tmp_path, kinds=["channels"])
    assert config.kinds == ("channels",)
    hash(config)


def test_a_list_of_kinds_passes_the_deci_check(tmp_path: Path) -> None:
    config = made(tmp_path, kinds=["channels"], formats=("deci",))
    assert config.kinds == ("channels",) and config.round_to == 256


def test_budget_refusals_stay_the_users_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^ShrinkConfig: invalid params=1\.5; expected") as caught:
        made(tmp_path, params=1.5)
    assert is_explained(caught.value)


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"params": 1.5}, ValueError, "invalid params=1.5; expected a float in (0, 1)"),
        ({"params": None, "macs": 0.0}, ValueError, "invalid macs=0.0; expected a float in (0, 1)"),
        ({"params": None, "latency": "0.2"}, TypeError, "invalid latency='0.2' of type str;"),
        ({"kinds": ("bogus",)}, ValueError, "invalid kinds=('bogus',); expected distinct kinds"),
        ({"kinds": ["heads", "heads"]}, ValueError, "invalid kinds=('heads', 'heads'); expected"),
        ({"kinds": ()}, ValueError, "invalid kinds=(); expected distinct kinds"),
        ({"compensate": 1}, TypeError, "invalid compensate=1; expected True or False"),
    ],
)
def test_errors_name_the_parameter_given_not_the_budget_made_of_it(
    tmp_path: Path, options: dict[str, object], error: type[Exception], words: str
) -> None:
    """The share and the kinds were refused as Budget's ('ShrinkConfig: Budget: invalid
    params=...'), naming a class the caller never made; every other error of the config
    reads 'ShrinkConfig: invalid <parameter>=<value>; expected ...', as the project's do."""
    with pytest.raises(error) as caught:
        made(tmp_path, **options)
    assert str(caught.value).startswith(f"ShrinkConfig: {words}"), str(caught.value)
    assert "Budget" not in str(caught.value) and is_explained(caught.value)


def test_the_floor_is_auto_unless_given(tmp_path: Path) -> None:
    assert made(tmp_path, params=0.5).floor is None
    assert made(tmp_path, params=0.5).budget.floor == "auto"


def test_a_floor_given_is_the_budgets(tmp_path: Path) -> None:
    assert made(tmp_path, params=0.5, floor=0.0).budget.floor == 0.0
    assert made(tmp_path, params=0.2, floor=0.3).budget.floor == 0.3
    assert made(tmp_path, params=0.2, floor="auto").budget.floor == "auto"


@pytest.mark.parametrize("floor", [-0.1, 1.0, float("nan"), "0.5", "half", True])
def test_a_bad_floor_is_refused_by_name(tmp_path: Path, floor: object) -> None:
    with pytest.raises((ValueError, TypeError), match=r"ShrinkConfig: invalid floor="):
        made(tmp_path, floor=floor)


def test_the_floor_flag_reaches_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import prunekit.tools.cli_shrink as cli_shrink
    from prunekit.tools.cli import main

    seen: list[ShrinkConfig] = []

    def capture(config: ShrinkConfig, tick: object) -> None:
        seen.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(cli_shrink, "shrink", capture)
    with pytest.raises(SystemExit):
        main(["shrink", str(tmp_path / "m"), "-o", str(tmp_path / "o"), "--params", "0.2",
              "--floor", "0.5"])  # fmt: skip
    assert seen[0].floor == 0.5 and seen[0].budget.floor == 0.5
    with pytest.raises(SystemExit):
        main(["shrink", str(tmp_path / "m"), "-o", str(tmp_path / "o"), "--params", "0.2",
              "--floor", "auto"])  # fmt: skip
    assert seen[1].floor == "auto" and seen[1].budget.floor == "auto"
    with pytest.raises(SystemExit):
        main(["shrink", str(tmp_path / "m"), "-o", str(tmp_path / "o"), "--params", "0.2"])
    assert seen[2].floor is None and seen[2].budget.floor == "auto"


def test_a_floor_flag_that_is_no_number_is_refused_by_the_parser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prunekit.tools.cli import main

    status = main(["shrink", str(tmp_path / "m"), "-o", str(tmp_path / "o"), "--params", "0.2",
                   "--floor", "half"])  # fmt: skip
    assert status == 2
    assert "argument --floor: invalid value 'half'; expected a float in [0, 1) or 'auto'" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("options", "exceeded"),
    [
        ({"length": 10**400}, "calibration_tokens=16384"),
        ({"length": 4096}, "evaluation_tokens=2048"),
        ({"length": 64, "calibration_tokens": 32}, "calibration_tokens=32"),
    ],
)
def test_a_length_beyond_the_tokens_names_length_and_the_tokens_it_exceeds(
    tmp_path: Path, options: dict[str, int], exceeded: str
) -> None:
    with pytest.raises(ValueError) as caught:
        made(tmp_path, **options)
    message = str(caught.value)
    shown = str(options["length"])[:20]
    assert message.startswith(f"ShrinkConfig: length={shown}"), message
    assert exceeded in message and "expected length" in message, message
    assert "invalid calibration_tokens=16384" not in message
    assert len(message) < 400  # a value of hundreds of digits is cut short
    assert is_explained(caught.value)


@pytest.mark.parametrize("name", ["calibration_tokens", "evaluation_tokens"])
@pytest.mark.parametrize("value", [1, 0, -5])
def test_too_few_tokens_are_refused_by_their_own_name(
    tmp_path: Path, name: str, value: int
) -> None:
    with pytest.raises(ValueError, match=rf"^ShrinkConfig: invalid {name}={value}; expected"):
        made(tmp_path, **{name: value})


@pytest.mark.parametrize("name", ["source", "out", "calibration", "evaluation"])
def test_an_empty_path_is_refused_not_taken_as_the_current_folder(
    tmp_path: Path, name: str
) -> None:
    # Path("") is ".": an unset variable in `-o "$OUT"` would make the current folder the output
    paths = {"source": tmp_path / "model", "out": tmp_path / "out", name: ""}
    with pytest.raises(ValueError, match=rf"^ShrinkConfig: invalid {name}=''; expected a path"):
        ShrinkConfig(**paths, params=0.25)  # type: ignore[arg-type]


def test_the_command_refuses_an_empty_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prunekit.tools.cli import main

    assert main(["shrink", str(tmp_path / "m"), "-o", "", "--params", "0.2"]) == 1
    assert "invalid out=''" in capsys.readouterr().err


def test_an_lr_beyond_float32_is_refused_when_made(tmp_path: Path) -> None:
    # the model is float32 while shrunk: its optimizer cannot take a larger step size
    with pytest.raises(ValueError, match=r"^ShrinkConfig: invalid lr=1e\+300; expected"):
        made(tmp_path, lr=1e300, distill=1.0)
    assert made(tmp_path, lr=1.0, distill=1.0).lr == 1.0


def test_an_lr_is_none_until_given_and_the_run_takes_the_default(tmp_path: Path) -> None:
    left_out = made(tmp_path, distill=1.0)
    assert left_out.lr is None and left_out.run_lr == LR == 5e-5
    given = made(tmp_path, distill=1.0, lr=1e-3)
    assert given.lr == given.run_lr == 1e-3


@pytest.mark.parametrize("lr", [1e-3, LR])
def test_an_lr_without_distillation_is_refused_when_made(tmp_path: Path, lr: float) -> None:
    """Nothing is distilled with distill=0, so an lr would be ignored: refused, even at its
    default (the streamed path, which never distils, takes only distill=0: refused there too)."""
    with pytest.raises(ValueError, match=rf"^ShrinkConfig: distill=0\.0 distils nothing .*; "
                       rf"expected no lr \(--lr\) .*, got lr={lr}$") as caught:  # fmt: skip
        made(tmp_path, lr=lr)
    assert is_explained(caught.value)


def test_the_command_refuses_lr_without_distill_and_help_shows_its_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from prunekit.tools import cli_shrink
    from prunekit.tools.cli import build_parser, main

    made_: list[ShrinkConfig] = []

    def caught(config: ShrinkConfig, progress: object = None) -> None:
        made_.append(config)
        raise RuntimeError("stopped")

    monkeypatch.setattr(cli_shrink, "shrink", caught)
    base = ["shrink", str(tmp_path / "m"), "-o", str(tmp_path / "out"), "--params", "0.2"]
    for extra in ([], ["--streamed"]):
        assert main([*base, *extra, "--lr", "0.001"]) == 1
        error = capsys.readouterr().err
        assert "distils nothing" in error and "got lr=0.001" in error, error
    assert main([*base, "--distill", "2", "--lr", "0.001"]) == 1
    assert main([*base, "--distill", "2"]) == 1
    assert [(c.lr, c.run_lr) for c in made_] == [(0.001, 0.001), (None, LR)]
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["shrink", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "learning rate, with --distill (default 5e-05)" in text, text
