"""Bit-exact fingerprints of a model: to show a failed call changed nothing."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


def bits(t: Tensor) -> tuple[Any, ...]:
    """Shape, dtype and raw bytes of `t` (NaN-safe, unlike torch.equal)."""
    raw = t.detach().cpu().clone().contiguous().reshape(-1).view(torch.uint8)
    return (tuple(t.shape), str(t.dtype), bytes(raw.tolist()))


def fingerprint(model: nn.Module) -> dict[str, Any]:
    """Every Parameter/buffer/hook object and value, and the state_dict, of `model`."""
    out: dict[str, Any] = {}
    for path, m in model.named_modules():
        hooks = []
        for key, hook in m._forward_pre_hooks.items():
            methods = tuple(id(x) for x in getattr(hook, "_pruning_methods", ()))
            hooks.append((key, id(hook), type(hook).__name__, methods))
        out[path] = {
            "params": [
                (k, id(v), None if v is None else bits(v)) for k, v in m._parameters.items()
            ],
            "buffers": [(k, id(v), None if v is None else bits(v)) for k, v in m._buffers.items()],
            "hooks": hooks,
            "load_hooks": [(k, id(h)) for k, h in m._load_state_dict_post_hooks.items()],
            "attrs": [(k, id(v), bits(v)) for k, v in m.__dict__.items() if isinstance(v, Tensor)],
        }
    out["<state_dict>"] = [(k, bits(v)) for k, v in model.state_dict().items()]
    return out
