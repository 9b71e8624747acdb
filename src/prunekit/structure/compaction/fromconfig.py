"""What a model built anew from its compacted config would differ in, checked the way
``from_pretrained`` reads a saved folder: the model's class built from a copy of the config
on the meta device (no memory, no weights), its parameters' names and shapes and its
modules' float attributes compared with the compacted model's.

One difference is folded instead of reported: an embedding that multiplies its output by a
scale fixed when it is built (Gemma's ``hidden_size ** 0.5``, a non-persistent buffer) keeps
the old scale after the hidden width is pruned, while a rebuilt one takes the new. Where the
embedding's weight is its own (not tied to the output projection), the weight takes the
ratio and the module the new scale, which computes the same; a tied weight cannot: the
difference is reported, and save_compacted records the scale the model keeps, which
load_compacted restores.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import torch
from torch import nn

from prunekit.core.naming import MASK, ORIG, stored_parameter


def build_fresh(model: nn.Module, config: Any, device: str = "meta") -> nn.Module | str | None:
    """`model`'s class built on `device` (the meta device: no memory, no weights) from
    `config` read back as ``from_pretrained`` reads a saved ``config.json`` (through its
    dict, so the config's own checks run); a line saying why building fails; None for a
    class not built from a config alone. ``compact`` checks both its config
    (``CompactReport.stale``) and a save_pretrained / from_pretrained round trip
    (``not_rebuilt``) with it."""
    if not callable(getattr(type(model), "from_pretrained", None)):
        return None
    try:
        with torch.device(device):
            fresh: nn.Module = type(model)(_read_back(config))
    except Exception as error:  # what from_pretrained would meet too: reported, not raised
        return f"building it raises {type(error).__name__}: {error}".replace("\n", " ")
    return fresh


def _read_back(config: Any) -> Any:
    """A copy of `config` as from_pretrained would read it from its saved dict (a config
    without to_dict / from_dict: a deep copy)."""
    if callable(getattr(config, "to_dict", None)) and callable(
        getattr(type(config), "from_dict", None)
    ):
        return type(config).from_dict(config.to_dict())
    return copy.deepcopy(config)


def repair(model: nn.Module, config: Any, rounds: int = 8) -> dict[str, int]:
    """Set integer fields of `config` until a model built from it has `model`'s parameter
    shapes, as far as one field at a time gets there: where a rebuilt parameter has width
    `old` and `model`'s has `new`, each field holding `old` is tried at `new`, and the one
    that leaves fewest parameters differing is kept (a field that happens to hold the same
    number, such as a position count, leaves as many and is not). Returns the fields set."""
    changed: dict[str, int] = {}
    fresh = build_fresh(model, config)
    if not isinstance(fresh, nn.Module):
        return changed
    found = shape_mismatches(model, fresh)
    for _ in range(rounds):
        if not found:
            break
        widths = Counter(
            (b, a) for _, built, mine in found if len(built) == len(mine)
            for b, a in zip(built, mine, strict=True) if b != a
        )  # fmt: skip
        best: tuple[int, str, int] | None = None
        for (old, new), _ in widths.most_common(4):
            for field in [k for k, v in vars(config).items() if type(v) is int and v == old]:
                setattr(config, field, new)
                trial = build_fresh(model, config)
                setattr(config, field, old)
                left = len(shape_mismatches(model, trial)) if isinstance(trial, nn.Module) else None
                if left is not None and left < len(found) and (best is None or left < best[0]):
                    best = (left, field, new)
        if best is None:
            break
        _, field, new = best
        setattr(config, field, new)
        changed[field] = new
        rebuilt = build_fresh(model, config)
        found = shape_mismatches(model, rebuilt) if isinstance(rebuilt, nn.Module) else []
    return changed


def mismatches(model: nn.Module, config: Any) -> int | None:
    """How many parameters of a model built from `config` differ in shape from `model`'s
    (None: it cannot be built)."""
    fresh = build_fresh(model, config)
    return len(shape_mismatches(model, fresh)) if isinstance(fresh, nn.Module) else None


def saved_shapes(module: nn.Module, *, buffers: bool = False) -> dict[str, tuple[int, ...]]:
    """The shape of each parameter of `module` (with `buffers`: of each tensor of its state
    dict, masks left out) under the name it saves with: a masked tensor's ``<name>_orig``
    as ``<name>``."""
    tensors = module.state_dict().items() if buffers else module.named_parameters()
    return {
        key.removesuffix(ORIG): tuple(value.shape)
        for key, value in tensors
        if not (buffers and key.endswith(MASK))
    }


def shape_mismatches(
    model: nn.Module, fresh: nn.Module, *, buffers: bool = False
) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """(name, shape in `fresh`, shape in `model`) of each tensor (see `saved_shapes`) both
    hold with different shapes, in `model`'s order."""
    built = saved_shapes(fresh, buffers=buffers)
    return [
        (name, built[name], shape)
        for name, shape in saved_shapes(model, buffers=buffers).items()
        if name in built and built[name] != shape
    ]


def difference(model: nn.Module, fresh: nn.Module, *, floats: bool = True) -> str | None:
    """The first way `fresh` differs from `model`: a parameter missing or of another shape,
    or (with `floats`) a float attribute of a module of the same name; None if none."""
    built = saved_shapes(fresh)
    names = saved_shapes(model)  # a tensor still masked saves under its own name
    for name, shape in names.items():
        if name not in built:
            return f"it has no {name}"
        if built[name] != shape:
            return f"{name} would be {built[name]}, not {shape}"
    extra = [name for name in built if name not in names]
    if extra:
        return f"it would have {extra[0]}, which the model has not"
    return next(iter(float_differences(model, fresh)), None) if floats else None


def float_differences(model: nn.Module, fresh: nn.Module) -> list[str]:
    """One line per float attribute that a module of `fresh` holds with another value than
    `model`'s module of the same name (an embedding's scale taken from a narrower config)."""
    found = []
    modules = dict(model.named_modules())
    for name, module in fresh.named_modules():
        mine = modules.get(name)
        for key, value in _floats(module).items():
            here = _floats(mine).get(key) if mine is not None else None
            if here is not None and here != value and (here == here or value == value):
                where = f"{name}.{key}" if name else key
                found.append(f"{where} would be {value:.6g}, not {here:.6g}")
    return found


def _floats(module: nn.Module) -> dict[str, float]:
    return {k: v for k, v in vars(module).items() if type(v) is float}


EMBED_SCALES = ("scalar_embed_scale", "embed_scale")
"""The names under which a module holds the scale of its embedding output, fixed when it is
built (a float attribute, or a one-element buffer: Gemma's ``hidden_size ** 0.5``)."""


def embed_scales(module: nn.Module) -> dict[str, float]:
    """The embedding scales `module` holds, by name (see `EMBED_SCALES`): each float
    attribute, and the value of each one-element floating buffer, of those names."""
    found: dict[str, float] = {}
    for key in EMBED_SCALES:
        value = module.__dict__.get(key)
        buffer = module._buffers.get(key)
        if type(value) is float:
            found[key] = value
        elif (
            buffer is not None
            and buffer.is_floating_point()
            and buffer.numel() == 1
            and not buffer.is_meta
        ):
            found[key] = float(buffer.item())
    return found


def set_embed_scale(module: nn.Module, key: str, value: float) -> None:
    """Give `module`'s embedding scale `key` the value `value`: a buffer is replaced by one of
    its shape, dtype and device filled with it (never written: a rollback restores it), a
    float attribute is set."""
    buffer = module._buffers.get(key)
    if buffer is not None:
        module._buffers[key] = torch.full_like(buffer, value)
    else:
        module.__dict__[key] = value


def fold_embed_scales(model: nn.Module, fresh: nn.Module) -> None:
    """Give each scaled embedding of `model` the scale it has in `fresh` (a float attribute
    of `EMBED_SCALES`; every scale the module holds takes it), its weight taking the ratio,
    where that weight is used by no other module. A tied weight keeps the old scale, which
    save_compacted records and load_compacted restores."""
    fresh_modules = dict(fresh.named_modules())
    uses: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        uses[id(param)] = uses.get(id(param), 0) + 1
    for name, module in model.named_modules():
        weight = stored_parameter(module, "weight")
        if not isinstance(module, nn.Embedding) or weight is None or uses.get(id(weight)) != 1:
            continue
        for key in EMBED_SCALES:
            old = module.__dict__.get(key)
            new = fresh_modules[name].__dict__.get(key) if name in fresh_modules else None
            if type(old) is not float or type(new) is not float or old == new or new == 0.0:
                continue
            weight.data = weight.data * (old / new)  # replaced, not written: rollback restores
            for held in embed_scales(module):
                set_embed_scale(module, held, new)
            break


def pretrained_mismatches(model: nn.Module) -> tuple[str, ...]:
    """What ``type(model).from_pretrained`` would build differently from `model` out of its
    config: one line per tensor whose shape differs and per float attribute whose value
    does (an embedding scale a tied weight could not take), or why it cannot build; empty
    when a save_pretrained / from_pretrained round trip rebuilds it. Built on the meta
    device (no memory) by the builder that checks the compacted config
    (``build_fresh``)."""
    config = getattr(model, "config", None)
    built = None if config is None else build_fresh(model, config)
    if built is None:
        return ()
    if isinstance(built, str):  # the config or the model's own constructor refuses it
        return (built,)
    found = shape_mismatches(model, built, buffers=True)
    shapes = [f"{key} is {mine}, built as {expected}" for key, expected, mine in found]
    return (*shapes, *float_differences(model, built))
