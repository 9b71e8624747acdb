"""A digest of every group ``channel_groups`` gives for torchvision's classification models
(slices, their indices and channels, size, kind, reason, blocks, outputs): two checkouts of
prunekit give the same groups when their digests are equal.

    PYTHONPATH=src python benchmarks/graph_digests.py --json mine.json
    PYTHONPATH=../main/src python benchmarks/graph_digests.py --against mine.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import prunekit
from helpers.vision import torchvision_models

FIXED = {"vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14", "maxvit_t"}


def digest(groups: list[prunekit.ChannelGroup]) -> str:
    found = hashlib.sha256()
    for g in groups:
        found.update(repr((g.size, g.reason, g.kind, g.blocks, g.outputs)).encode())
        for s in g.slices:
            seen = (s.module_name, s.name, s.dim, s.role, s.op, s.indices, s.channels)
            found.update(repr(seen).encode())
    return found.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--res", type=int, default=112, help="input size (ViTs, MaxViT: 224)")
    parser.add_argument("--json", help="write the digests to this file")
    parser.add_argument("--against", help="compare with the digests in this file")
    args = parser.parse_args()
    models = torchvision_models()
    names = args.models.split(",") if args.models else models.list_models(module=models)
    torch.set_num_threads(1)
    digests: dict[str, str] = {}
    for name in names:
        torch.manual_seed(0)
        model = models.get_model(name).eval()
        size = 224 if name in FIXED else args.res
        digests[name] = digest(prunekit.channel_groups(model, torch.randn(1, 3, size, size)))
        print(f"{name:<20} {digests[name][:16]}", flush=True)
        del model
    if args.json:
        Path(args.json).write_text(json.dumps(digests, indent=0))
    if args.against:
        other = json.loads(Path(args.against).read_text())
        differ = [n for n in names if other.get(n) != digests[n]]
        print(f"{len(names) - len(differ)}/{len(names)} equal")
        if differ:
            sys.exit(f"differ: {', '.join(differ)}")


if __name__ == "__main__":
    main()
