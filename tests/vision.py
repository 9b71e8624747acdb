"""Import torchvision's models on the CPU build of torch.

torchvision 0.28's wheel is built for CUDA: importing it with the CPU torch fails with
"operator torchvision::nms does not exist". Its models are pure Python, so defining the two op
schemas that its import registers fake kernels for is enough.
"""

from __future__ import annotations

import contextlib
import importlib
from types import ModuleType

import torch

_SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


def define_torchvision_ops() -> None:
    """Define the op schemas torchvision's import needs. Anything that imports it after
    (transformers does, from its model classes) then works on the CPU torch."""
    for name, schema in _SCHEMAS.items():
        # an error: defined already (by an earlier call or torchvision's own ops)
        with contextlib.suppress(RuntimeError):
            torch.library.define(f"torchvision::{name}", schema)


def torchvision_models() -> ModuleType:
    """``torchvision.models``, importable without torchvision's compiled ops."""
    define_torchvision_ops()
    return importlib.import_module("torchvision.models")
