"""The install stage: the chosen units masked on every parameter slice of their groups.

Masks go on through ``prunekit.custom_from_mask``, so the model trains, reports, saves and
unprunes as any pruned model; the norms over a masked hidden width normalize over its kept
channels, and a router's masked experts get a logit of -inf, so the masked model computes
what ``compact`` makes of it. A Parameter tied to another module (a language model's head
and its embedding) gets the same mask, so the tie stays one Parameter.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from prunekit.dropin.calls import custom_from_mask
from prunekit.structure.families.experts import install_router_mask
from prunekit.structure.handlers.norms import install_kept_norm
from prunekit.structure.pruned import PrunedGroup


def install(model: nn.Module, chosen: list[PrunedGroup]) -> None:
    """Mask the units of `chosen` in `model`.

    Args:
        model: the model the groups are of.
        chosen: the groups and the units of each to mask.
    """
    masks: dict[tuple[int, str], tuple[nn.Module, str, Tensor]] = {}
    norms: dict[int, nn.Module] = {}
    routers: dict[int, nn.Module] = {}
    for pruned in chosen:
        for s in pruned.group.slices:
            if s.op == "normalize":
                norms[id(s.module)] = s.module
            if s.op == "route":
                routers[id(s.module)] = s.module
            if s.is_buffer:
                continue
            key = (id(s.module), s.name)
            if key not in masks:
                value = getattr(s.module, s.name)
                masks[key] = (s.module, s.name, torch.ones_like(value))
            positions = [p for u in pruned.units for p in s.indices[u]]
            mask = masks[key][2]
            mask.index_fill_(s.dim, torch.tensor(positions, device=mask.device), 0)
    for module in norms.values():
        install_kept_norm(module)
    for module in routers.values():
        install_router_mask(module)
    for module, name, mask in list(masks.values()):
        for holder, held in _tied(model, module, name):
            if (id(holder), held) not in masks:
                masks[(id(holder), held)] = (holder, held, mask)
    for module, name, mask in masks.values():
        custom_from_mask(module, name, mask)


def _tied(model: nn.Module, module: nn.Module, name: str) -> list[tuple[nn.Module, str]]:
    """Other modules holding the same Parameter (a language model head tied to the
    embedding): they get the same mask, so the tie stays one Parameter."""
    param = module._parameters.get(name)
    if param is None:
        return []
    return [(m, k) for m in model.modules() for k, p in m._parameters.items()
            if p is param and m is not module]  # fmt: skip
