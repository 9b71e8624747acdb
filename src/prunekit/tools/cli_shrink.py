"""``prunekit shrink`` and ``prunekit demo --llm`` on the command line: the arguments made
into a ``ShrinkConfig``, the pipeline run with progress bars, the results printed."""

from __future__ import annotations

import argparse
from typing import Any

from prunekit.export.api import FORMATS
from prunekit.export.request import GGUF_SOURCE, GGUF_TYPES
from prunekit.tools.calibrate import run_shrink_streamed
from prunekit.tools.console import consoles, printable, progress_bars
from prunekit.tools.demo_llm import run_llm_demo
from prunekit.tools.shrink import CRITERIA, DTYPES, LATENCY_RUNS, LR, SEED, ShrinkConfig, shrink
from prunekit.tools.shrink_report import ShrinkReport

__all__ = ["add_shrink_parser", "print_shrink", "run_llm_demo_command"]


def add_shrink_parser(commands: Any) -> None:
    """Add the ``shrink`` command to the subparsers `commands`."""
    parser = commands.add_parser(
        "shrink",
        help="make a model smaller and faster, in a format that runs without prunekit",
        description="Remove a share of a causal LM's parameters, MACs or latency (channels "
        "and heads of lowest score for their cost, the layers that read them compensated), "
        "compact it, optionally distil it, write it as FORMAT into OUT with report.json and "
        "report.md, and print the budget, the perplexity, the size and the latency before "
        "and after. SRC: a Hugging Face folder (one weights file or shards) or a GGUF file, "
        "of the Llama family (Llama, Mistral, Qwen2/3, SmolLM), with its tokenizer.",
    )
    parser.add_argument("source", metavar="SRC", help="model folder or GGUF file")
    parser.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="OUT",
        help="output folder (replaced whole, only once all is written)",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    for name, what in (
        ("params", "non-embedding parameters"),
        ("macs", "multiply-accumulates"),
        ("latency", "measured CPU time of one forward"),
    ):
        target.add_argument(
            f"--{name}", type=float, metavar="S", help=f"share of the {what} to remove, in (0, 1)"
        )
    _text_and_formats(parser)
    _pruning_options(parser)
    _run_options(parser)
    parser.set_defaults(run=_run_shrink)


def _text_and_formats(parser: argparse.ArgumentParser) -> None:
    """The text it calibrates and evaluates on, and the formats it writes."""
    parser.add_argument(
        "--calibration",
        metavar="FILE|DIR|JSONL",
        help="text to calibrate on: a file, a folder of text files, or JSON "
        "lines with a 'text' field (default: Python's help topics)",
    )
    parser.add_argument(
        "--eval",
        metavar="FILE|DIR|JSONL",
        help="text for the perplexity (default: the held-out end of the calibration text)",
    )
    parser.add_argument(
        "--format",
        type=_formats,
        default=("hf",),
        metavar="FORMAT[,FORMAT]",
        help="hf: a Hugging Face folder; deci: DeciLM block_configs; gguf: llama.cpp; onnx; "
        "several comma-separated, each then in OUT/<format> or OUT/model.<format> "
        "(default hf)",
    )
    parser.add_argument(
        "--gguf-type",
        choices=(*GGUF_TYPES, GGUF_SOURCE),
        help="tensor type of the gguf format, or 'source': each tensor in the type its GGUF "
        "source holds it in (f16 for the K and IQ types, which are not quantized here). "
        "Default: 'source' for a GGUF source with --dtype auto, re-quantized; else as "
        "--dtype: f32, f16 or bf16. Under a quantized type the perplexity is of the "
        "quantized weights",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="the floating type the model is written in (default auto: the source's, so "
        "a bfloat16 model stays bfloat16; a quantized GGUF source: float16, or bfloat16 "
        "where its float matrices are BF16); pruned in "
        "float32, rounded to it at the end, its perplexity measured as written; onnx is "
        "always float32",
    )


def _pruning_options(parser: argparse.ArgumentParser) -> None:
    """How it prunes, compensates and distils, and on how many tokens."""
    parser.add_argument(
        "--compensate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="least-squares update of the layers that read removed units (default on)",
    )
    parser.add_argument(
        "--floor",
        type=_floor,
        default=None,
        metavar="F",
        help="the least share of its units each layer's MLP width and query heads keep, in "
        "[0, 1), or 'auto' (the default: 0.9 of the highest floor the share allows; none "
        "with --streamed)",
    )
    parser.add_argument(
        "--round-to",
        type=int,
        metavar="N",
        help="keep MLP widths a multiple of N (default 1; 256 for deci, whose MLP widths "
        "are multiples of 256, and which prunes no heads; 32, the block of every quantized "
        "type, where the gguf format holds one, so that every matrix is quantized)",
    )
    parser.add_argument(
        "--distill",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="distil from the dense model on the calibration text (default 0)",
    )
    parser.add_argument(  # None when not given: ShrinkConfig refuses it given without --distill
        "--lr",
        type=float,
        metavar="RATE",
        help=f"the distillation's learning rate, with --distill (default {LR:g})",
    )
    parser.add_argument(
        "--calibration-tokens",
        type=int,
        default=16384,
        metavar="N",
        help="tokens calibrated on (default 16384)",
    )
    parser.add_argument(
        "--eval-tokens",
        type=int,
        default=2048,
        metavar="N",
        help="tokens the perplexity is measured on (default 2048)",
    )


def _run_options(parser: argparse.ArgumentParser) -> None:
    """The window length, the criterion, the latency runs and the seed."""
    parser.add_argument(
        "--length",
        type=int,
        default=256,
        metavar="N",
        help="tokens per window; also the latency's input (default 256)",
    )
    parser.add_argument(
        "--criterion",
        choices=CRITERIA,
        default="activation",
        help="what ranks the units (default activation)",
    )
    # None when not given: ShrinkConfig's defaults, and --streamed refuses them given
    parser.add_argument(
        "--latency-runs",
        type=int,
        metavar="N",
        help=f"alternated pairs timed, before against after (default {LATENCY_RUNS})",
    )
    parser.add_argument("--seed", type=int, help=f"random seed (default {SEED})")
    parser.add_argument(
        "--streamed",
        action="store_true",
        help="a sharded folder one decoder block in memory at a time (--params, hf, no "
        "perplexity or latency measured)",
    )


def _floor(text: str) -> float | str:
    """--floor's value: 'auto' or a number (ShrinkConfig checks its range)."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}; expected a float in [0, 1) or 'auto'"
        ) from None


def _formats(text: str) -> tuple[str, ...]:
    """``--format``'s value: one format or several, comma-separated, each known once."""
    names = tuple(name.strip() for name in text.split(","))
    wrong = [name for name in names if name not in FORMATS]
    if wrong or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(
            f"invalid format list {text!r}; expected distinct formats among "
            f"{', '.join(FORMATS)}, comma-separated"
        )
    return names


def _run_shrink(args: argparse.Namespace) -> int:
    config = ShrinkConfig(
        args.source,  # as typed: ShrinkConfig refuses an empty one (Path("") is ".")
        args.out,
        params=args.params,
        macs=args.macs,
        latency=args.latency,
        calibration=args.calibration,
        evaluation=args.eval,
        formats=args.format,
        gguf_type=args.gguf_type,
        compensate=args.compensate,
        round_to=args.round_to,
        distill=args.distill,
        calibration_tokens=args.calibration_tokens,
        evaluation_tokens=args.eval_tokens,
        length=args.length,
        criterion=args.criterion,
        seed=args.seed,
        latency_runs=args.latency_runs,
        lr=args.lr,
        floor=args.floor,
        dtype=args.dtype,
    )
    if args.streamed:
        return run_shrink_streamed(config)
    console, errors = consoles()
    with progress_bars(errors) as tick:
        report = shrink(config, tick)
    print_shrink(report, console)
    return 0


def print_shrink(report: ShrinkReport, console: Any) -> None:
    """Print the budget table, the before-and-after lines and the files written."""
    for line in [*report.budget_table.splitlines(), "", *report.summary()]:
        console.print(printable(line), markup=False, highlight=False, soft_wrap=True)
    console.print(
        f"Wrote to {printable(report.out)}:", markup=False, highlight=False, soft_wrap=True
    )
    for record in report.exports:
        line = f"  {record.format}: {printable(record.path)} ({record.checked})"
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print("  report.json, report.md", markup=False, highlight=False, soft_wrap=True)


def run_llm_demo_command(args: argparse.Namespace) -> int:
    """``prunekit demo --llm``: shrink the packaged SmolLM2-135M and print the outcome."""
    console, errors = consoles()
    with progress_bars(errors) as tick:
        # as typed: run_llm_demo refuses an empty one (Path("") is ".")
        report = run_llm_demo(args.out, progress=tick, seed=args.seed, distill=args.distill)
    print_shrink(report, console)
    return 0
