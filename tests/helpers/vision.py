"""Import torchvision's models on the CPU build of torch, without letting anything else see it.

torchvision 0.28's wheel on the index is built for CUDA: importing it with the CPU torch fails
with "operator torchvision::nms does not exist", and transformers and Lightning import it
whenever it can be found. So `make setup` installs it apart, in ``<venv>/vision`` (not in
site-packages), and only the callers of :func:`torchvision_models` (the vision tests and
benchmarks/structure.py) reach it: its models are pure Python, so defining the two op schemas
its import registers fake kernels for, then putting that folder on ``sys.path``, is enough.
A torchvision importable already (a CUDA torch with the `vision` extra) is used as it is.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

_SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}

# where `make setup` installs torchvision (`pip install --target`): beside the venv's bin/
FOLDER = Path(sys.prefix) / "vision"


def define_torchvision_ops() -> None:
    """Define the op schemas torchvision's import needs (a no-op where they exist)."""
    for name, schema in _SCHEMAS.items():
        # an error: defined already (by an earlier call or torchvision's own ops)
        with contextlib.suppress(RuntimeError):
            torch.library.define(f"torchvision::{name}", schema)


def torchvision_models() -> ModuleType:
    """``torchvision.models``, from ``<venv>/vision`` unless importable already.

    Raises:
        ImportError: torchvision is neither importable nor in ``<venv>/vision``.
    """
    define_torchvision_ops()
    if importlib.util.find_spec("torchvision") is None and FOLDER.is_dir():
        sys.path.append(str(FOLDER))
    return importlib.import_module("torchvision.models")
