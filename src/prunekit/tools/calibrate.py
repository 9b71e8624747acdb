"""``prunekit prune DIR --method wanda|sparsegpt --calibration FILE``: a text file tokenized
with the folder's tokenizer into windows, and the folder pruned block by block
(prunekit.io.streamed)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from prunekit._extras import require
from prunekit.io.files import CheckpointError
from prunekit.io.sharded import INDEX, index_of
from prunekit.io.streamed import METHODS, prune_streamed

__all__ = ["METHODS", "add_arguments", "calibration_windows", "run_streamed", "streamed"]

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
    parser.add_argument(
        "--window",
        type=int,
        default=512,
        metavar="TOKENS",
        help="wanda, sparsegpt: tokens per calibration window (default %(default)s)",
    )
    parser.add_argument(
        "--windows",
        type=int,
        default=32,
        metavar="COUNT",
        help="wanda, sparsegpt: the most calibration windows taken (default %(default)s)",
    )


def streamed(args: argparse.Namespace) -> bool:
    """Whether the command line asks for a calibrated method (or its options)."""
    return args.method in METHODS or args.calibration is not None or args.pattern is not None


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
    batches = calibration_windows(index.parent, args.calibration, args.window, args.windows)
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
    if args.method not in METHODS:
        raise ValueError(
            f"--calibration and --pattern are for --method {' or '.join(METHODS)}; "
            f"got --method {args.method}"
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
        if value < 1:
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
