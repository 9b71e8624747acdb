"""Keeps a MultiheadAttention's out_proj right when it is pruned on its own.

MultiheadAttention reads ``out_proj.weight`` without calling out_proj, so the pruning
pre-hook on out_proj never runs: its masked weight, computed once, goes stale after an
optimizer step and its graph is freed by the first backward (pytorch#69353). The hook on
out_proj cannot see its parent, so the refresh comes from the other side: a process-wide
forward pre-hook (``register_module_forward_pre_hook`` of the module's framework), put in
place the first time such an out_proj is pruned or loaded, runs out_proj's pruning hook
whenever a module holding a pruned out_proj is called. Its cost for every other module call
is one dict lookup. Pruned through the parent (``(mha, 'out_proj.weight')``), out_proj is
refreshed by the parent's own hook instead, and this one leaves it alone.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from torch import nn

from prunekit.core.backend import framework
from prunekit.core.checks import is_attention_out_proj
from prunekit.dropin.copying import KeepsHookKey
from prunekit.dropin.hooks import find_pruning_hook, pruning_hooks

__all__ = ["RefreshSubmodule", "refresh_out_proj", "watch_out_proj"]

_watching: set[str] = set()
_lock = threading.Lock()


def watch_out_proj(module: Any) -> None:
    """Make sure the process-wide refresh is in place, if `module` is an out_proj."""
    if not is_attention_out_proj(module):
        return
    kind = framework(module)
    if kind in _watching:
        return
    with _lock:
        if kind in _watching:
            return
        modules = importlib.import_module(f"{kind}.nn.modules.module")
        modules.register_module_forward_pre_hook(refresh_out_proj)
        _watching.add(kind)


def refresh_out_proj(module: nn.Module, inputs: Any) -> None:
    """Process-wide forward pre-hook: run the pruning hooks of `module`'s out_proj.

    Only for an out_proj pruned on its own: a dotted-name pruning through `module`
    installed a RefreshSubmodule on it, which refreshes the tensor already.
    """
    child = module._modules.get("out_proj")
    if child is None or not child._forward_pre_hooks or not is_attention_out_proj(child):
        return
    done = {
        h.name
        for h in module._forward_pre_hooks.values()
        if isinstance(h, RefreshSubmodule) and h.path == "out_proj"
    }
    for hook in pruning_hooks(child):
        if hook._tensor_name not in done:
            hook(child, inputs)


class RefreshSubmodule(KeepsHookKey):
    """Forward pre-hook on a parent: refreshes a pruned tensor of the child at `path`.

    For children whose forward never runs because the parent reads their weights
    directly (MultiheadAttention.out_proj, pytorch#69353): without it the child's masked
    tensor, computed once, is reused by every step and its graph freed after the first
    backward.
    """

    def __init__(self, path: str, name: str) -> None:
        self.path = path
        self.name = name

    def __call__(self, module: nn.Module, inputs: Any) -> None:
        owner = module.get_submodule(self.path)
        _, hook = find_pruning_hook(owner, self.name)
        if hook is not None:
            hook(owner, inputs)
