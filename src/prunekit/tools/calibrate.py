"""``prunekit prune DIR --method wanda|sparsegpt --calibration FILE``: a text file tokenized
with the folder's tokenizer into windows, and the folder pruned block by block
(prunekit.io.streamed); ``prunekit shrink DIR --params S --streamed``: the same budget,
criterion and compensation as ``prunekit shrink``, block by block
(prunekit.export.streamed_shrink)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunekit._extras import require
from prunekit.export.streamed_shrink import (
    CRITERIA,
    ShrinkStreamedConfig,
    ShrinkStreamedReport,
    shrink_streamed,
)
from prunekit.io.files import CheckpointError
from prunekit.io.sharded import INDEX, index_of
from prunekit.io.streamed import METHODS, prune_streamed
from prunekit.tools.shrink import ShrinkConfig
from prunekit.tools.shrink_steps import read_passages, text_windows

__all__ = [
    "METHODS",
    "add_arguments",
    "calibration_windows",
    "run_shrink_streamed",
    "run_streamed",
    "shrink_folder",
    "streamed",
]

WINDOW = 512
"""Tokens per calibration window where ``--window`` is not given."""
WINDOWS = 32
"""The most calibration windows taken where ``--windows`` is not given."""

# Options of the calibrated methods, which the others do not take (flag, key): None when
# not given.
_OWN = (
    ("--calibration", "calibration"),
    ("--pattern", "pattern"),
    ("--window", "window"),
    ("--windows", "windows"),
)

# Options of the magnitude methods, which the calibrated ones do not take (flag, default).
_MAGNITUDE_ONLY: tuple[tuple[str, str, object], ...] = (
    ("--n", "n", None),
    ("--dim", "dim", None),
    ("--include", "include", []),
    ("--exclude", "exclude", []),
    ("--keep-masks", "keep_masks", False),
    ("--seed", "seed", None),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the calibrated methods on `parser` (prunekit prune's)."""
    parser.add_argument(
        "--calibration",
        metavar="FILE",
        help="wanda, sparsegpt: a text file, tokenized with the folder's tokenizer, whose "
        "first windows calibrate (the folder is pruned one decoder block at a time)",
    )
    parser.add_argument(
        "--pattern",
        help="wanda, sparsegpt: unstructured, row, or N:M such as 2:4 (AMOUNT then "
        "(M-N)/M) (default: row for wanda, unstructured for sparsegpt)",
    )
    # None when not given: the other methods refuse them rather than ignore them
    parser.add_argument(
        "--window",
        type=int,
        metavar="TOKENS",
        help=f"wanda, sparsegpt: tokens per calibration window (default {WINDOW})",
    )
    parser.add_argument(
        "--windows",
        type=int,
        metavar="COUNT",
        help=f"wanda, sparsegpt: the most calibration windows taken (default {WINDOWS})",
    )


def streamed(args: argparse.Namespace) -> bool:
    """Whether the command line asks for a calibrated method (or its options)."""
    return args.method in METHODS or any(getattr(args, key) is not None for _, key in _OWN)


def run_streamed(args: argparse.Namespace) -> int:
    """Prune the folder ``args.path`` with a calibrated method into ``args.out``.

    Raises:
        ValueError: an option the method does not take, or a missing one;
            CheckpointError: not a sharded model folder, or a calibration file that
            cannot be read.
    """
    _check(args)
    index = index_of(args.path)
    if index is None:
        raise CheckpointError(
            f"{args.path}: no {INDEX}; --method {args.method} prunes a sharded Hugging Face "
            "folder (save_pretrained(..., max_shard_size=...)) one block at a time"
        )
    window = WINDOW if args.window is None else args.window
    count = WINDOWS if args.windows is None else args.windows
    batches = calibration_windows(index.parent, args.calibration, window, count)
    done = prune_streamed(
        index.parent,
        args.out,
        args.method,
        args.amount,
        calibration=batches,
        pattern=args.pattern,
    )
    print(
        f"Pruned {len(done.pruned)} tensors ({done.numel:,} entries) of {done.blocks} blocks "
        f"with {args.method} on {len(batches)} windows: "
        f"{done.zeros / max(done.numel, 1):.1%} of them are zero. Wrote {args.out}"
    )
    return 0


def _check(args: argparse.Namespace) -> None:
    if args.method not in METHODS:  # they would be read and ignored
        given = [f"{flag} {getattr(args, key)}" for flag, key in _OWN if getattr(args, key)
                 is not None]  # fmt: skip
        raise ValueError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --method "
            f"{' or '.join(METHODS)} only (the calibration text and its windows); got "
            f"--method {args.method}, which would ignore them: expected none of "
            "--calibration, --pattern, --window, --windows with it"
        )
    if args.calibration is None:
        raise ValueError(
            f"--method {args.method} needs --calibration FILE (a text file to calibrate on)"
        )
    if args.scope not in (None, "layer") or args.global_pruning:
        raise ValueError(f"--method {args.method} prunes each matrix: expected no --scope global")
    for flag, key, default in _MAGNITUDE_ONLY:
        if getattr(args, key) != default:
            raise ValueError(f"{flag} is for the magnitude methods, not --method {args.method}")
    for flag, value in (("--window", args.window), ("--windows", args.windows)):
        if value is not None and value < 1:
            raise ValueError(f"invalid {flag} {value}; expected a count of at least 1")


def calibration_windows(folder: Path, file: str, window: int, count: int) -> list[Any]:
    """The text of `file`, tokenized by the tokenizer of `folder`, as up to `count` batches
    of `window` consecutive tokens (``{"input_ids": (1, window)}``; fewer tokens: one
    shorter window).

    Raises:
        CheckpointError: the file cannot be read, or holds no token.
    """
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{file}: cannot read the calibration text: {error}") from None
    transformers = require("transformers", "hf", "--calibration")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    if ids.numel() == 0:
        raise CheckpointError(f"{file}: holds no token to calibrate on; expected some text")
    found = [ids[i : i + window] for i in range(0, ids.numel() - window + 1, window)][:count]
    return [{"input_ids": w[None].clone()} for w in (found or [ids])]


def shrink_folder(config: ShrinkConfig, progress: bool | None = None) -> ShrinkStreamedReport:
    """``prunekit shrink SRC --streamed``: the sharded folder ``config.source`` shrunk by
    ``shrink_streamed`` to ``config.out`` under the budget, criterion, compensation and
    rounding of `config`, calibrated on the windows ``prunekit shrink`` takes from the same
    text (``shrink_steps.text_windows``).

    Args:
        config: the command's options (format 'hf' only; no distillation).
        progress: a bar on stderr (default: when stderr is a terminal).

    Returns:
        What ``shrink_streamed`` wrote.

    Raises:
        ValueError: an option streaming does not take (another format, distillation,
            --macs or --latency, a floor, a criterion not in
            ``export.streamed_shrink.CRITERIA``, evaluation text, a seed or latency runs
            given, even at their defaults: nothing is drawn at random nor timed; a dtype
            other than 'auto': each tensor is written in its stored type; an lr is
            refused by ``ShrinkConfig`` itself, with distill 0).
        CheckpointError: not a sharded model folder, or text that cannot be read, or that
            is, holds or lies inside the output.
    """
    _check_streamed_flags(config)
    budget = dataclasses.replace(config.budget, floor=0.0)  # block by block: no floor
    options = ShrinkStreamedConfig(
        budget, config.criterion, config.compensate, round_to=config.round_to or 1,
        progress=progress,
    )  # fmt: skip
    index = index_of(config.source)
    if index is None:
        raise CheckpointError(
            f"{config.source}: no {INDEX}; --streamed shrinks a sharded Hugging Face folder "
            "(save_pretrained(..., max_shard_size=...)) one block at a time"
        )
    passages = read_passages(config)  # before the model is, as prunekit shrink reads it
    transformers = require("transformers", "hf", "--streamed")
    tokenizer = transformers.AutoTokenizer.from_pretrained(index.parent)
    holder = nn.Module()  # what text_windows reads of a model: its config's positions
    holder.config = transformers.AutoConfig.from_pretrained(index.parent)
    texts = text_windows(config, tokenizer, holder, passages)
    batches = [{"input_ids": w[None]} for w in texts.calibration]  # as prunekit shrink's
    return shrink_streamed(index.parent, config.out, calibration=batches, config=options)


def _check_streamed_flags(config: ShrinkConfig) -> None:
    """Refuse, in the command line's words, a flag that ``--streamed`` does not take."""
    if config.formats != ("hf",) or config.distill:
        raise ValueError(
            "--streamed writes the hf format without distillation; expected --format hf "
            f"and --distill 0, got --format {','.join(config.formats)} --distill {config.distill}"
        )
    for flag, value in (("--macs", config.macs), ("--latency", config.latency)):
        if value is not None:
            raise ValueError(
                f"--streamed removes a share of the parameters (MACs and latency need the "
                f"whole model run); expected --params S, got {flag} {value}"
            )
    if config.floor is not None:
        raise ValueError(
            "--streamed allocates the budget without a floor; expected no --floor, got "
            f"--floor {config.floor}"
        )
    if config.criterion not in CRITERIA:
        raise ValueError(
            "--streamed scores each block from its own inputs; expected --criterion "
            f"{', '.join(CRITERIA[:-1])} or {CRITERIA[-1]}, got --criterion {config.criterion}"
        )
    if config.evaluation is not None:  # --eval-tokens is taken: it sizes the held-out end
        given = config.evaluation
        named = given if isinstance(given, Path) else f"({len(given)} passages)"
        raise ValueError(
            f"--streamed measures no perplexity; expected no --eval, got --eval {named}"
        )
    if config.dtype != "auto":
        raise ValueError(
            "--streamed writes each tensor in the type it is stored in (the source's); "
            f"expected --dtype auto, got --dtype {config.dtype}"
        )
    for flag, key, why in _UNSTREAMED:  # None where not given, even at their defaults
        value = getattr(config, key)
        if value is not None:
            raise ValueError(f"--streamed {why}; expected no {flag}, got {flag} {value}")


# Options of prunekit shrink that --streamed does not use (flag, ShrinkConfig field, why):
# None where not given (the command line's parser leaves them so too).
_UNSTREAMED: tuple[tuple[str, str, str], ...] = (
    ("--latency-runs", "latency_runs", "measures no latency"),
    ("--seed", "seed", "draws nothing at random (no distillation)"),
)


def run_shrink_streamed(config: ShrinkConfig) -> int:
    """Run ``shrink_folder`` and print the budget table and what was written."""
    done = shrink_folder(config)
    print(done.budget)
    print(
        f"params {done.params_before:,} -> {done.params_after:,} over {done.blocks} blocks "
        f"streamed. Wrote {done.index.parent}"
    )
    return 0
