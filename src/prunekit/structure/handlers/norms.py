"""Norms over a pruned hidden width: RMSNorm traced as a whole, and masked norms that
normalize over the kept channels only.

A LayerNorm or RMSNorm takes its statistics over every channel, so zeroing channels with a
mask would change them: the masked model would not compute what the compacted one computes.
``prune_channels`` therefore installs a forward hook on each norm whose weight it masks along
the hidden width: while the weight's mask has zeros, the norm's output is recomputed by the
module's own forward on the kept channels (weight, bias and shape narrowed to them), which is
exactly what the compacted module computes, and the removed channels give 0. The hook reads
the mask at each call, so it does nothing once the mask is gone (``prunekit.remove``,
``compact``), and ``compact`` removes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.naming import stored_parameter
from prunekit.core.unsaved import register_unsaved
from prunekit.structure.handlers.module_handlers import RMS_NORMS, is_norm_module
from prunekit.structure.trace.labels import channel_ids
from prunekit.structure.trace.tracer import TRACING, ModuleHandler, Tracer


def _match_rms(module: nn.Module) -> bool:
    if type(module).__name__ not in RMS_NORMS:
        return False
    weight = stored_parameter(module, "weight")
    return weight is not None and weight.dim() == 1


def _trace_rms(tr: Tracer, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Any) -> None:  # fmt: skip
    x = args[0] if args else next(iter(kwargs.values()), None)
    labels = tr.label(x)
    owner = tr.claim(getattr(module, "weight", None))
    if labels is None or not isinstance(x, Tensor) or not isinstance(out, Tensor):
        return
    where = f"{type(module).__name__} (in {tr.names.get(id(module)) or 'the model'})"
    dims = tr.varying(labels)
    if owner is None or any(d != x.dim() - 1 for d in dims):
        tr.block(labels, f"{where} normalizes over them and more")
        return
    chan = channel_ids(tr, labels, x.dim() - 1, x.shape[-1], where)
    tr.record(owner, 0, "norm", torch.arange(len(chan)), chan, op="normalize")
    tr.normed.update(chan[chan >= 0].tolist())
    tr.set(out, labels if out.shape == labels.shape else None)


# RMSNorm traced whole (in the module handlers of ``structure.graph.tables``)
RMS_NORM_HANDLER = ModuleHandler("rms_norm", _match_rms, _trace_rms, blind=True)


def kept_norm_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                   output: Any) -> Any:  # fmt: skip
    """Forward hook: the norm's output over the kept channels of its masked weight."""
    kept = None if TRACING.get() else _kept(module)
    if kept is None:
        return None
    x = args[0] if args else next(iter(kwargs.values()))
    with _narrowed(module, kept):
        inner = type(module).forward(module, x.index_select(-1, kept))
    return torch.zeros_like(output).index_copy(-1, kept, inner.to(output.dtype))


def _kept(module: nn.Module) -> Tensor | None:
    """The kept channels of the norm's weight while its mask has zeros (else None)."""
    mask = module._buffers.get("weight_mask")
    if mask is None or mask.dim() != 1 or bool(mask.all()):
        return None
    return mask.nonzero().flatten()


def _hooked(module: nn.Module) -> bool:
    return any(hook is kept_norm_hook for hook in module._forward_hooks.values())


def narrows_norm(module: nn.Module) -> bool:
    """Whether the norm now computes over kept channels only: its hook is installed and its
    weight's mask has zeros (what a state_dict alone does not bring back)."""
    return _hooked(module) and _kept(module) is not None


register_unsaved("the masked hidden width of the norm", narrows_norm,
                 "prunekit.compact(model, inputs)")  # fmt: skip


@contextmanager
def _narrowed(module: nn.Module, kept: Tensor) -> Iterator[None]:
    """The module's weight, bias and normalized_shape narrowed to the kept channels."""
    saved: dict[str, Any] = {k: module.__dict__[k] for k in ("weight", "bias", "normalized_shape")
             if k in module.__dict__}  # fmt: skip
    try:
        for name in ("weight", "bias"):
            value = getattr(module, name, None)
            if isinstance(value, Tensor):
                module.__dict__[name] = value.index_select(0, kept)
        if "normalized_shape" in saved:
            module.__dict__["normalized_shape"] = (len(kept),)
        yield
    finally:
        for name in ("weight", "bias", "normalized_shape"):
            module.__dict__.pop(name, None)
        module.__dict__.update(saved)


def install_kept_norm(module: nn.Module) -> None:
    """Make the norm normalize over the kept channels while its weight is masked."""
    if not is_norm_module(module):
        raise ValueError(
            f"prune_channels: {type(module).__name__} normalizes a pruned hidden width, but it "
            "is no LayerNorm/RMSNorm prunekit knows how to narrow"
        )
    if not _hooked(module):
        module.register_forward_hook(kept_norm_hook, with_kwargs=True)


def remove_kept_norm(module: nn.Module) -> None:
    """Drop the hook (compaction made the norm as narrow as its kept channels)."""
    for key, hook in list(module._forward_hooks.items()):
        if hook is kept_norm_hook:
            del module._forward_hooks[key]
            module._forward_hooks_with_kwargs.pop(key, None)
            module._forward_hooks_always_called.pop(key, None)
