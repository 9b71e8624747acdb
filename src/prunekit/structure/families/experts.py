"""Routed experts of mixture-of-experts blocks as units: traced, masked and compacted.

Hugging Face's MoE blocks hold their experts fused in one module: 3-D parameters
``gate_up_proj`` (experts, 2 x inner, hidden) and ``down_proj`` (experts, hidden, inner),
indexed by the top-k expert indices a router gives; the router's ``weight`` (experts,
hidden) makes one logit per expert. Both modules are traced as a whole. The router's rows
become the units of a group of kind 'experts' (the router hands its ids on through the
indices tensor it returns), joined by each expert's weights along the expert dim; the inner
width, the same channel in every expert, is a group of channels; the hidden width is read by
the router and the experts and made by ``down_proj``'s rows. A shared expert is an ordinary
MLP beside them: it is no unit of the experts group.

Masking an expert zeroes its weights and router row, and a router hook makes its logit
``-inf`` while the row is masked: the router's softmax then gives it probability 0, its top-k
never picks it (while at least top-k others remain) and a renormalization of the top-k
weights runs over the experts it did pick, which is exactly what the router without that
expert computes. That holds for the routers listed in ``ROUTERS`` (logits from ``linear(x,
weight)``, then softmax and top-k in either order, renormalized or not); a router that adds
a bias to the scores after them (DeepSeek-V3's) would still pick a masked expert, so it is
not listed and its experts are left alone with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from prunekit.core.unsaved import register_unsaved
from prunekit.structure.trace.labels import along, channel_ids
from prunekit.structure.trace.tracer import ModuleHandler, Tracer

# routers whose logits are linear(x, weight), then softmax and top-k (renormalized or not),
# or top-k of the logits, then softmax or sigmoid over the chosen (Cohere2-MoE)
ROUTERS = {
    "MixtralTopKRouter", "OlmoeTopKRouter", "Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter",
    "FlexOlmoTopKRouter", "MellumTopKRouter", "Cohere2MoeTopKRouter",
}  # fmt: skip


def _hf(module: nn.Module) -> bool:
    return type(module).__module__.startswith("transformers.")


def is_router(module: nn.Module) -> bool:
    if type(module).__name__ not in ROUTERS or not _hf(module):  # cheap: every module is asked
        return False
    weight = getattr(module, "weight", None)
    return (
        isinstance(weight, Tensor) and weight.dim() == 2
        and isinstance(getattr(module, "top_k", None), int)
    )  # fmt: skip


def is_experts(module: nn.Module) -> bool:
    """Fused experts: gate_up_proj (E, 2 x inner, hidden) and down_proj (E, hidden, inner),
    gate and up concatenated, not transposed, without biases."""
    if not _hf(module):  # cheap: every module is asked
        return False
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not (isinstance(gate_up, Tensor) and isinstance(down, Tensor)):
        return False
    plain = getattr(module, "is_concatenated", True) and not getattr(module, "is_transposed", False)
    if not plain or getattr(module, "has_bias", False) or not getattr(module, "has_gate", True):
        return False
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[1] % 2:
        return False
    e, inner2, hidden = gate_up.shape
    return tuple(down.shape) == (e, hidden, inner2 // 2)


def _where(tr: Tracer, module: nn.Module) -> str:
    return f"{type(module).__name__} (in {tr.names.get(id(module)) or 'the model'})"


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], k: int, name: str) -> Any:
    return args[k] if len(args) > k else kwargs.get(name)


def _trace_router(tr: Tracer, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  out: Any) -> None:  # fmt: skip
    x = _arg(args, kwargs, 0, "hidden_states")
    weight = getattr(module, "weight")  # noqa: B009  (typed as Any)
    owner = tr.claim(weight)
    labels = tr.label(x)
    indices = out[2] if isinstance(out, tuple) and len(out) == 3 else None
    where = _where(tr, module)
    if (
        owner is None or not isinstance(x, Tensor) or not isinstance(indices, Tensor)
        or x.shape[-1] != weight.shape[1]
    ):  # fmt: skip
        tr.block(labels, f"{where}: its routing is not understood")
        return
    hidden, count = weight.shape[1], weight.shape[0]
    chan = channel_ids(tr, labels, x.dim() - 1, hidden, where)
    positions = torch.arange(hidden)
    tr.record(owner, 1, "in", positions, chan, positions, op="linear")
    ids = tr.new_ids(count)
    tr.record(owner, 0, "out", torch.arange(count), ids, op="route")
    tr.experts.update(ids.tolist())
    tr.routes[id(indices)] = (indices, ids)


def _trace_experts(tr: Tracer, module: nn.Module, args: tuple[Any, ...],
                   kwargs: dict[str, Any], out: Any) -> None:  # fmt: skip
    x = _arg(args, kwargs, 0, "hidden_states")
    index = _arg(args, kwargs, 1, "top_k_index")
    gate_up, down = getattr(module, "gate_up_proj"), getattr(module, "down_proj")  # noqa: B009
    owners = tr.claim(gate_up), tr.claim(down)
    labels = tr.label(x)
    count, inner2, hidden = gate_up.shape
    route = tr.routes.get(id(index)) if isinstance(index, Tensor) else None
    where = _where(tr, module)
    why = None
    if owners[0] is None or owners[1] is None:
        why = "its weights are no model parameters"
    elif route is None or route[0] is not index or len(route[1]) != count:
        why = "its expert indices come from no router prunekit knows (ROUTERS)"
    elif not isinstance(x, Tensor) or not isinstance(out, Tensor) or x.shape[-1] != hidden:
        why = "its inputs are not understood"
    if why is not None:
        tr.block(labels, f"{where}: {why}")
        return
    assert route is not None
    for owner in owners:
        tr.record(owner, 0, "out", torch.arange(count), route[1])
    inner = tr.new_ids(inner2 // 2)
    tr.record(owners[0], 1, "out", torch.arange(inner2), torch.cat([inner, inner]))
    steps = torch.arange(len(inner))
    tr.record(owners[1], 2, "in", steps, inner, steps, op="experts")
    chan = channel_ids(tr, labels, x.dim() - 1, hidden, where)
    positions = torch.arange(hidden)
    tr.record(owners[0], 2, "in", positions, chan, positions, op="experts")
    made = tr.new_ids(hidden)
    tr.record(owners[1], 1, "out", positions, made)
    tr.set(out, along(made, out.dim() - 1, out.shape))


# a router and its experts, each traced whole (in the module handlers of ``structure.graph.tables``)
ROUTER_HANDLER = ModuleHandler("router", is_router, _trace_router)
EXPERTS_HANDLER = ModuleHandler("experts", is_experts, _trace_experts)


class _MaskedLogits(TorchFunctionMode):
    """Within a router's forward: the logits its weight makes are -inf for masked experts."""

    def __init__(self, router: nn.Module, gone: Tensor) -> None:
        super().__init__()
        self.router, self.gone = router, gone

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        weight = args[1] if len(args) > 1 else (kwargs or {}).get("weight")
        if getattr(func, "__name__", "") == "linear" and weight is getattr(self.router, "weight"):  # noqa: B009
            out = out.masked_fill(self.gone.to(out.device), float("-inf"))
        return out


class RouterMask:
    """The hooks of a router with masked experts: while rows of its weight's mask are all
    zero, its forward runs with those experts' logits at -inf. They read the mask at each
    call, so they do nothing once the mask is gone."""

    def __init__(self) -> None:
        self.active: list[_MaskedLogits | None] = []

    def enter(self, module: nn.Module, args: Any) -> None:
        gone = _gone(module)
        mode = None
        if gone is not None:
            mode = _MaskedLogits(module, gone)
            mode.__enter__()  # type: ignore[no-untyped-call]
        self.active.append(mode)

    def leave(self, module: nn.Module, args: Any, output: Any) -> None:
        mode = self.active.pop() if self.active else None
        if mode is not None:
            mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]


def _gone(router: nn.Module) -> Tensor | None:
    """Which experts the router's weight mask removes whole (all-zero rows), if any."""
    mask = router._buffers.get("weight_mask")
    if mask is None or mask.dim() != 2:
        return None
    gone = ~mask.ne(0).any(1)
    return gone if bool(gone.any()) else None


def _mask_of(hook: Any) -> RouterMask | None:
    owner = getattr(hook, "__self__", None)
    return owner if isinstance(owner, RouterMask) else None


def _hooked(router: nn.Module) -> bool:
    return any(_mask_of(h) is not None for h in router._forward_pre_hooks.values())


def drops_experts(router: nn.Module) -> bool:
    """Whether the router now leaves masked experts out of its top-k: its hooks are installed
    and its weight's mask removes whole experts (what a state_dict alone does not bring
    back)."""
    return _hooked(router) and _gone(router) is not None


register_unsaved("the masked experts of the router", drops_experts,
                 "prunekit.compact(model, inputs)")  # fmt: skip


def install_router_mask(module: nn.Module) -> None:
    """Make the router drop its masked experts from the top-k (once per router)."""
    if _hooked(module):
        return
    hooks = RouterMask()
    module.register_forward_pre_hook(hooks.enter)
    module.register_forward_hook(hooks.leave, always_call=True)


def remove_router_mask(module: nn.Module) -> None:
    for table in (module._forward_pre_hooks, module._forward_hooks):
        for key, hook in list(table.items()):
            if _mask_of(hook) is not None:
                del table[key]
                module._forward_hooks_always_called.pop(key, None)


def top_k(router: nn.Module) -> int:
    return int(getattr(router, "top_k"))  # noqa: B009


def kernel_step(group: Any) -> int:
    """The multiple that the units a group keeps must make for the kernels that read them:
    where the group runs along the rows of a fused experts module's weights (its inner
    width, or the hidden width its rows and columns span), grouped_mm reads those rows only
    in multiples of 16 bytes (4 float32 channels, 8 half ones); else 1."""
    step = 1
    for s in group.slices:
        module = s.module
        if s.dim != 0 and not s.is_buffer and is_experts(module):
            size = getattr(module, s.name).element_size()
            need = 16 // math.gcd(16, size)
            step = step * need // math.gcd(step, need)
    return step


def width_step(group: Any, round_to: int | None) -> int:
    """The multiple of kept units for `group`: for channels and hidden widths, `round_to`
    where the caller gives one, else what the kernels reading the group need
    (kernel_step); heads and experts are counted one by one."""
    if group.kind not in ("channels", "hidden"):
        return 1
    return round_to if round_to is not None else kernel_step(group)


def unaligned_experts(model: nn.Module) -> list[str]:
    """One line per fused experts module of `model` whose inner width makes rows that are no
    multiple of 16 bytes, which grouped_mm (the experts' kernel) refuses; with the
    ``round_to`` that avoids it."""
    found = []
    for name, module in model.named_modules():
        if is_experts(module):
            down = getattr(module, "down_proj")  # noqa: B009
            size = down.element_size()
            for what, width in (("an inner", int(down.shape[2])), ("a hidden", int(down.shape[1]))):
                if width * size % 16:
                    found.append(
                        f"{name} keeps {what} width of {width} ({width * size} bytes a row, "
                        f"where grouped_mm needs a multiple of 16: prune it with "
                        f"round_to={16 // math.gcd(16, size)})"
                    )
    return found


def sync_experts(model: nn.Module) -> None:
    """After compaction: expert counts and widths of every router and experts module, and
    the ``num_experts`` of a module holding routers that all keep one count (a causal LM's,
    read by its load-balancing loss); the router hooks go once no expert is masked.

    Raises:
        ValueError: a router is left with fewer experts than it picks per token.
    """
    for name, module in model.named_modules():
        if is_router(module):
            weight = getattr(module, "weight")  # noqa: B009
            count = int(weight.shape[0])
            if count < top_k(module):
                raise ValueError(
                    f"compact: the router {name} would keep {count} experts, fewer than the "
                    f"{top_k(module)} it picks per token (top_k); mask fewer of its experts"
                )
            _set(module, num_experts=count, hidden_dim=int(weight.shape[1]))
            if "weight_mask" not in module._buffers:
                remove_router_mask(module)
        elif is_experts(module):
            count, inner2, hidden = getattr(module, "gate_up_proj").shape  # noqa: B009
            _set(module, num_experts=count, intermediate_dim=inner2 // 2, hidden_dim=hidden)
    for module in model.modules():
        if is_router(module) or is_experts(module):
            continue
        if isinstance(getattr(module, "num_experts", None), int):
            routers = [r for r in module.modules() if is_router(r)]
            counts = {int(getattr(r, "weight").shape[0]) for r in routers}  # noqa: B009
            if len(counts) == 1:
                _set(module, num_experts=counts.pop())


def check_kept(removed: dict[Any, dict[int, set[int]]], modules: dict[Any, Any]) -> None:
    """Before compaction changes anything: refuse to leave a router fewer experts than its
    top-k. `removed`/`modules`: the positions to remove and their (module, name, qualified).

    Raises:
        ValueError: naming the router, the experts it would keep and its top-k.
    """
    for key, dims in removed.items():
        module, name, qualified = modules[key]
        if name == "weight" and 0 in dims and is_router(module):
            count = int(getattr(module, "weight").shape[0]) - len(dims[0])  # noqa: B009
            if count < top_k(module):
                where = qualified or "the model"
                raise ValueError(
                    f"compact: the router {where} would keep {count} experts, fewer than the "
                    f"{top_k(module)} it picks per token (top_k); mask fewer of its experts"
                )


def _set(module: nn.Module, **values: int) -> None:
    for name, value in values.items():
        if isinstance(getattr(module, name, None), int):
            setattr(module, name, value)


def expert_widths(modules: Iterable[nn.Module]) -> dict[str, list[int]]:
    """The expert count of each router and the inner width of each experts module."""
    found: dict[str, list[int]] = {"experts": [], "expert_inner": []}
    for module in modules:
        if is_router(module):
            found["experts"].append(int(getattr(module, "weight").shape[0]))  # noqa: B009
        elif is_experts(module):
            found["expert_inner"].append(int(getattr(module, "gate_up_proj").shape[1]) // 2)  # noqa: B009
    return found


def router_of(group: Any) -> tuple[str, nn.Module] | None:
    """The router (name, module) of a group of kind 'experts'."""
    for s in group.slices:
        if s.op == "route":
            return s.module_name, s.module
    return None


def experts_limit(groups: list[Any], order: list[int] | None) -> float:
    """The largest share of experts a call may mask and leave every router its top-k.

    `groups`: the experts groups; `order`: with scope 'global', the index of the group of
    each unit as they are ranked together (lowest first), else None (each group loses the
    share of its own experts).
    """
    spare = []
    for group in groups:
        found = router_of(group)
        spare.append(group.size - (top_k(found[1]) if found is not None else 1))
    if order is None:
        shares = [n / g.size for n, g in zip(spare, groups, strict=True) if g.size]
        return min(shares, default=0.0)
    taken = [0] * len(groups)
    for position, k in enumerate(order):
        taken[k] += 1
        if taken[k] > spare[k]:
            return position / len(order)
    return (len(order) - 1) / len(order) if order else 0.0


def check_expert_counts(
    chosen: list[tuple[Any, int]], share: float, limit: float, scope: str = "layer"
) -> None:
    """Refuse a choice that leaves a router fewer unmasked experts than its top-k.

    `chosen`: (group, units it would have masked in all) per experts group; `limit`: the
    largest share allowed (see experts_limit), named in the message.

    Raises:
        ValueError: naming the router, the share, and the largest share allowed.
    """
    for group, masked in chosen:
        found = router_of(group)
        if found is None:
            continue
        name, router = found
        left, k = group.size - masked, top_k(router)
        if left < k:
            ranked = " with the units of all routers ranked together" if scope == "global" else ""
            raise ValueError(
                f"prune_channels: invalid experts={share!r}: the router {name} would keep "
                f"{left} of its {group.size} experts, fewer than the {k} it picks per token "
                f"(top_k); expected experts <= {limit:g} for this model{ranked}"
            )
