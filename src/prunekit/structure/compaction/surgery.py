"""The surgery of ``compact``: which units go, the constants they leave, and slicing tensors.

A unit goes when every slice that makes its channel (role 'out') is masked to zero there: the
channel then no longer depends on the input. What it still carries (a bias, f(0) of an
activation) reaches its consumers as a constant, which is folded into their bias.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from prunekit.dropin.calls import remove
from prunekit.structure.compaction.widths import implied_widths
from prunekit.structure.families.attention import update_modules
from prunekit.structure.families.experts import check_kept, sync_experts
from prunekit.structure.graph.graph import ChannelGroup, Slice
from prunekit.structure.handlers.norms import remove_kept_norm


@dataclass
class Removal:
    """Positions to remove per (module, tensor name, dim), and the consumers to fold."""

    removed: dict[tuple[int, str], dict[int, set[int]]] = field(default_factory=dict)
    modules: dict[tuple[int, str], tuple[nn.Module, str, str]] = field(default_factory=dict)
    consumers: list[tuple[Slice, list[int]]] = field(default_factory=list)
    outputs: dict[int, dict[int, set[int]]] = field(default_factory=dict)  # leaf -> dim -> gone
    units: int = 0
    groups: int = 0


def plan(groups: list[ChannelGroup]) -> Removal:
    """The fully masked units of the prunable groups."""
    result = Removal()
    for g in groups:
        if not g.prunable:
            continue
        makers = [s for s in g.slices if s.role == "out"]
        alive = torch.zeros(g.size, dtype=torch.bool)
        for s in makers:
            alive |= _alive(s, g.size)
        gone = torch.nonzero(~alive).flatten().tolist() if makers else []
        if not gone or len(gone) == g.size:
            continue
        result.units += len(gone)
        result.groups += 1
        for s in g.slices:
            key = (id(s.module), s.name)
            result.modules[key] = (s.module, s.name, s.module_name)
            positions = result.removed.setdefault(key, {}).setdefault(s.dim, set())
            positions.update(p for u in gone for p in s.indices[u])
            if s.role == "in":
                result.consumers.append((s, gone))
        for leaf, dim, per_unit in g.outputs:
            at = result.outputs.setdefault(leaf, {}).setdefault(dim, set())
            at.update(p for u in gone for p in per_unit[u])
    return result


def _alive(s: Slice, size: int) -> Tensor:
    """Per unit: whether the slice has an entry of it that its mask keeps (True unmasked)."""
    mask = s.module._buffers.get(s.name + "_mask")
    if mask is None:
        return torch.ones(size, dtype=torch.bool)
    per = mask.movedim(s.dim, 0).reshape(mask.shape[s.dim], -1).ne(0).any(1).cpu()
    units = torch.tensor([u for u, ps in enumerate(s.indices) for _ in ps], dtype=torch.long)
    flat = torch.tensor([p for ps in s.indices for p in ps], dtype=torch.long)
    alive = torch.zeros(size, dtype=torch.bool)
    alive[units[per[flat]]] = True
    return alive


class Capture(TorchFunctionMode):
    """Per input channel min and max of what each consumer weight reads, and its padding."""

    def __init__(self, result: Removal) -> None:
        super().__init__()
        found = {(id(s.module), s.name): (s.module, s.name) for s, _ in result.consumers}
        self.keys = list(found)
        self.consumers = list(found.values())
        self.seen: dict[tuple[int, str], list[tuple[Tensor, Tensor, Any, int]]] = defaultdict(list)

    def __torch_function__(
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:  # fmt: skip
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        conv1d = name == "addmm" and len(args) > 2  # Conv1D: addmm(bias, x, weight (in, out))
        args_read = (args[1], args[2]) if conv1d else tuple(args[:2])
        if name in ("conv1d", "conv2d", "conv3d", "linear", "addmm") and len(args_read) > 1:
            weight = args_read[1]
            at = next((k for k, (m, n) in enumerate(self.consumers) if _is(m, n, weight)), None)
            if at is not None:
                key = self.keys[at]
                x = args_read[0]
                flat = name in ("linear", "addmm")
                dim = x.dim() - 1 if flat else x.dim() - int(name[-2]) - 1
                rows = x.movedim(dim, 0).reshape(x.shape[dim], -1)
                padding = args[4] if len(args) > 4 else kwargs.get("padding", 0)
                groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
                self.seen[key].append((rows.amin(1), rows.amax(1), padding, int(groups)))
        return func(*args, **kwargs)


def _is(module: nn.Module, name: str, t: Tensor) -> bool:
    value = module.__dict__.get(name)
    return (value if isinstance(value, Tensor) else module._parameters.get(name)) is t


def folds(result: Removal, capture: Capture) -> dict[tuple[int, str], tuple[nn.Module, Tensor]]:
    """Bias additions that carry the removed channels' constants (module id, bias) -> delta."""
    deltas: dict[tuple[int, str], tuple[nn.Module, Tensor]] = {}
    for s, gone in result.consumers:
        weight = getattr(s.module, s.name)
        seen = capture.seen.get((id(s.module), s.name), [])
        channels = sorted({c for u in gone for c in s.channels[u]}) if s.channels else []
        if not seen or not channels:
            continue
        low, high, padding, groups = seen[0]
        if s.op in ("linear", "addmm"):
            read = weight.detach().ne(0).any(0 if s.op == "linear" else 1).tolist()
            channels = [c for c in channels if read[c]]
        else:
            channels = [c for c in channels if _reads(s, weight, c, groups)]
        if not channels:
            continue  # read only through masked weights: what they carry does not matter
        index = torch.tensor(channels)
        values = low[index]
        unsteady = [c for c, lo, hi in zip(channels, values, high[index], strict=False) if lo != hi]
        for other in seen[1:]:
            unsteady += [c for c in channels if other[0][c] != low[c] or other[1][c] != low[c]]
        if unsteady:
            raise ValueError(
                f"compact: input channel {unsteady[0]} of {s.qualified} still varies after "
                "masking (it is not fully masked upstream), so it cannot be removed; mask "
                "every slice of its group, as prune_channels does"
            )
        delta = _delta(s, weight, channels, values.to(weight.dtype), groups)
        if not bool((delta != 0).any()):
            continue  # zeros, or read through masked weights
        if s.op not in ("linear", "addmm") and _padded(padding):
            raise ValueError(
                f"compact: the removed input channels of {s.qualified} carry the constant "
                f"{float(values[values != 0][0]):g}, but it pads with zeros (padding="
                f"{padding}), so no bias can stand for them exactly; mask its input "
                "slices too (prune_channels does)"
            )
        key = (id(s.module), "bias")
        before = deltas.get(key, (s.module, torch.zeros_like(delta)))[1]
        deltas[key] = (s.module, before + delta)
    return deltas


def _reads(s: Slice, weight: Tensor, channel: int, groups: int) -> bool:
    """Whether the consumer's (masked) weight reads input `channel` at all."""
    w = weight.detach()
    if s.op == "linear":
        return bool(w[:, channel].any())
    if s.op == "addmm":
        return bool(w[channel].any())
    per, opg = w.shape[1], w.shape[0] // groups
    g = channel // per
    return bool(w[g * opg : (g + 1) * opg, channel % per].any())


def _padded(padding: Any) -> bool:
    if isinstance(padding, str):
        return padding != "valid"
    values = (padding,) if isinstance(padding, int) else tuple(padding)
    return any(int(v) != 0 for v in values)


def _delta(s: Slice, weight: Tensor, channels: list[int], values: Tensor, groups: int) -> Tensor:
    """What the constant inputs add to each output of the consumer."""
    w = weight.detach()
    if s.op == "linear":
        return w[:, channels] @ values
    if s.op == "addmm":
        return values @ w[channels]
    per, opg = w.shape[1], w.shape[0] // groups
    summed = w.reshape(w.shape[0], per, -1).sum(2)  # (out, in per group)
    out = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
    for c, v in zip(channels, values, strict=False):
        g = c // per
        out[g * opg : (g + 1) * opg] += v * summed[g * opg : (g + 1) * opg, c % per]
    return out


def apply(result: Removal, deltas: dict[tuple[int, str], tuple[nn.Module, Tensor]],
          model: nn.Module | None = None) -> None:  # fmt: skip
    """Fold the constants, then slice every tensor of the plan and update module attributes
    (of every module of `model`, given: attention heads, hidden sizes)."""
    check_kept(result.removed, result.modules)
    for module, delta in deltas.values():
        _add_to_bias(module, delta)
    touched: dict[int, nn.Module] = {}
    tied: dict[int, tuple[dict[int, set[int]], nn.Parameter, nn.Parameter]] = {}
    for key, dims in result.removed.items():
        module, name, qualified = result.modules[key]
        _slice(module, name, dims, tied, qualified)
        touched[id(module)] = module
    for module in touched.values():
        _update_attributes(module)
        remove_kept_norm(module)
    if model is not None:
        for m in model.modules():  # other holders of a sliced tied Parameter
            for k, p in list(m._parameters.items()):
                found = tied.get(id(p)) if p is not None else None
                if found is not None and found[2] is p:
                    m._parameters[k] = found[1]
        update_modules(model)
        sync_experts(model)


def _add_to_bias(module: nn.Module, delta: Tensor) -> None:
    orig = module._parameters.get("bias_orig")
    if orig is not None:
        mask = module._buffers["bias_mask"]
        assert mask is not None
        value = mask * orig.detach() + delta
        module._parameters["bias_orig"] = nn.Parameter(value, orig.requires_grad)
        kept = torch.where(delta != 0, torch.ones_like(mask), mask)
        module._buffers["bias_mask"] = kept
        module.__dict__["bias"] = kept * value
        return
    bias = module._parameters.get("bias")
    if bias is None:
        module._parameters["bias"] = nn.Parameter(delta.clone())
        return
    module._parameters["bias"] = nn.Parameter(bias.detach() + delta, bias.requires_grad)


def narrow(t: Tensor, dims: dict[int, set[int]]) -> Tensor:
    for dim, gone in sorted(dims.items()):
        keep = [i for i in range(t.shape[dim]) if i not in gone]
        t = t.index_select(dim, torch.tensor(keep, device=t.device, dtype=torch.long))
    return t


def _slice(module: nn.Module, name: str, dims: dict[int, set[int]],
           tied: dict[int, tuple[dict[int, set[int]], nn.Parameter, nn.Parameter]],
           qualified: str) -> None:  # fmt: skip
    if name in module._buffers and not name.endswith("_mask"):
        module._buffers[name] = narrow(module._buffers[name], dims)  # type: ignore[arg-type]
        return
    orig = module._parameters.get(name + "_orig")
    key = name if orig is None else name + "_orig"
    old = module._parameters[key]
    assert old is not None
    new = _shared(old, dims, tied, f"{qualified}.{name}")
    module._parameters[key] = new
    if orig is None:
        return
    mask = narrow(module._buffers[name + "_mask"], dims)  # type: ignore[arg-type]
    module._buffers[name + "_mask"] = mask
    module.__dict__[name] = mask * new
    if bool(mask.all()):
        remove(module, name)


def _shared(old: nn.Parameter, dims: dict[int, set[int]],
            tied: dict[int, tuple[dict[int, set[int]], nn.Parameter, nn.Parameter]],
            where: str) -> nn.Parameter:  # fmt: skip
    """The sliced Parameter; a Parameter held by several modules (tied) is sliced once and
    stays one Parameter."""
    found = tied.get(id(old))
    if found is None:
        new = nn.Parameter(narrow(old.detach(), dims), old.requires_grad)
        tied[id(old)] = (dims, new, old)
        return new
    if found[0] != dims:
        raise ValueError(
            f"compact: {where} is tied to another module's parameter, but the channels "
            "removed from the two differ; prune the tied tensors together (prune_channels does)"
        )
    return found[1]


def _update_attributes(module: nn.Module) -> None:
    """The width attributes the sliced tensors fix; first a depthwise convolution's groups
    and a GroupNorm's group count, which keep their channels per group."""
    weight = getattr(module, "weight", None)
    if isinstance(module, nn.modules.conv._ConvNd) and isinstance(weight, Tensor):
        old_out, old_groups = module.out_channels, module.groups
        if weight.shape[1] == 1 and old_groups > 1 and module.in_channels == old_groups:
            module.groups = weight.shape[0] // (old_out // old_groups)
    elif isinstance(module, nn.GroupNorm) and isinstance(weight, Tensor):
        module.num_groups = weight.shape[0] // (module.num_channels // module.num_groups)
    for name, value in implied_widths(module).items():
        setattr(module, name, value)
