"""A digest of every group of every torchvision classification model, to compare two builds
of the graph: a faster grouping must give the very same groups (slices, indices, reasons,
order) on all of them, not only on the few tests/helpers/graph_frozen.json freezes.

    PYTHONPATH=src python benchmarks/graph_digest.py --out new.json
    PYTHONPATH=/other/checkout/src python benchmarks/graph_digest.py --out old.json
    python benchmarks/graph_digest.py --compare old.json new.json

Inputs as ``structure.py --graphs`` builds them (112x112, 224x224 for the fixed-size models).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import prunekit
from helpers.graph_frozen import digest, form
from helpers.vision import torchvision_models
from structure import FIXED


def digests(names: list[str], res: int) -> dict[str, list[str]]:
    """name -> one digest per group, in the groups' order."""
    models = torchvision_models()
    found = {}
    for name in names:
        torch.manual_seed(0)
        model = models.get_model(name).eval()
        size = 224 if name in FIXED else res
        groups = prunekit.channel_groups(model, torch.randn(1, 3, size, size))
        found[name] = [digest(line) for line in form(model, groups)]
        print(f"{name}: {len(groups)} groups", flush=True)
    return found


def compare(old: dict[str, list[str]], new: dict[str, list[str]]) -> list[str]:
    """Where the two differ: the first differing group of each model."""
    problems = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a is None or b is None:
            problems.append(f"{name}: in one file only")
            continue
        for k, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                problems.append(f"{name}: group {k} differs")
                break
        else:
            if len(a) != len(b):
                problems.append(f"{name}: {len(b)} groups (before: {len(a)})")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the digests here")
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--res", type=int, default=112)
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    args = parser.parse_args()
    if args.compare:
        old, new = (json.loads(Path(p).read_text()) for p in args.compare)
        problems = compare(old, new)
        print("\n".join(problems) or f"all {len(new)} models: every group identical")
        sys.exit(1 if problems else 0)
    models = torchvision_models()
    names = args.models.split(",") if args.models else models.list_models(module=models)
    found = digests(names, args.res)
    if args.out:
        Path(args.out).write_text(json.dumps(found, indent=0))


if __name__ == "__main__":
    main()
