"""What the hostile cases share: snapshots of a model (bit for bit, config, modes) and of
files (bytes, and what lies beside them), the check that a refusal changed neither, and tiny
Llama models (dense, compacted, masked)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from helpers import tiny_llm
from helpers.model_state import fingerprint

# --- snapshots --------------------------------------------------------------------------------


def tree(*paths: Path) -> dict[str, Any]:
    """Every file under `paths` (hidden ones too) with its bytes, every folder as such, and
    each path's parent folder listing (a stage or temporary file left beside it shows)."""
    found: dict[str, Any] = {}
    for root in paths:
        parent = root.parent
        found[f"{parent}/"] = sorted(p.name for p in parent.iterdir()) if parent.is_dir() else None
        if root.is_file():
            found[str(root)] = root.read_bytes()
        elif root.is_dir():
            for path in sorted(root.rglob("*")):
                found[str(path)] = path.read_bytes() if path.is_file() else "<dir>"
        else:
            found[str(root)] = "<missing>"
    return found


def config_of(model: Any) -> str | None:
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(config, "to_dict", None)):
        return None
    return json.dumps(config.to_dict(), sort_keys=True, default=repr)


def refused(
    call: Callable[[], Any],
    error: type[BaseException] | tuple[type[BaseException], ...],
    match: str,
    *,
    model: nn.Module | None = None,
    paths: tuple[Path, ...] = (),
) -> BaseException:
    """Run `call`, which must raise `error` matching `match`, and leave `model` (parameters,
    buffers, hooks, state_dict bit for bit, config, mode) and the files under `paths` (bytes,
    and what lies beside each) exactly as they were."""
    before = _state(model, paths)
    with pytest.raises(error, match=match) as caught:
        call()
    assert _state(model, paths) == before, "a refusal changed the model or the files"
    return caught.value


def _state(model: nn.Module | None, paths: tuple[Path, ...]) -> Any:
    if model is None:
        return tree(*paths)
    modes = [m.training for m in model.modules()]
    return _fingerprint(model), config_of(model), modes, tree(*paths)


def _fingerprint(model: nn.Module) -> Any:
    """helpers.model_state's fingerprint; for tensors on the meta device (no data), their
    objects, shapes and dtypes."""
    if not any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        return fingerprint(model)
    named = [*model.named_parameters(), *model.named_buffers()]
    return [(k, id(v), tuple(v.shape), v.dtype, v.device) for k, v in named]


def unchanged(model: nn.Module) -> Any:
    """What `refused` compares, for a check that a success left the model as it was."""
    return _state(model, ())


# --- tiny models ----------------------------------------------------------------------------

_MODELS: dict[str, nn.Module] = {}


def llama(kind: str = "dense") -> nn.Module:
    """A fresh copy of a tiny Llama: 'dense', 'uniform' (compacted at one width for all
    layers), 'per-layer' (compacted at widths of its own a layer), 'masked', or 'deci'
    (dense, with an MLP 256 wide: what DeciLM states)"""
    if kind not in _MODELS:
        model = tiny_llm.llama(layers=3)
        if kind == "deci":  # MLP widths DeciLM's readers derive (multiples of 256)
            import transformers

            config = model.config
            config.intermediate_size = 256
            torch.manual_seed(0)
            model = transformers.LlamaForCausalLM(config).eval()
        ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
        import prunekit

        if kind == "uniform":
            prunekit.prune_channels(model, ids, amount=0.25)
            prunekit.compact(model, ids, latency_runs=0)
        elif kind == "per-layer":
            prunekit.prune_channels(model, ids, budget=prunekit.Budget(params=0.3))
            with pytest.warns(UserWarning):
                prunekit.compact(model, ids, latency_runs=0)
        elif kind == "masked":
            prunekit.prune_channels(model, ids, amount=0.25)
        _MODELS[kind] = model
    return copy.deepcopy(_MODELS[kind])
