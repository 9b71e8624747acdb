"""What ``remove_blocks`` checks before it returns: a model built anew from the updated
config has the kept layers' structure, and the model computes what it computed with the
blocks skipped.

The structure check builds the model's class twice on the meta device (no memory, no
weights), as ``from_pretrained`` builds it from a saved config (``compaction.fromconfig``):
from the config before the removal and from the config after it. Each kept block must be
built after as it was built before at its old position (the same submodules of the same
classes, parameters and buffers of the same names and shapes, the same plain attributes
but its index), and the model outside the blocks alike (but for counts of layers). The
structure of the two built models is compared, not that of the model itself, so a model
compacted earlier (widths its config cannot express) is checked all the same.

A difference outside the blocks is no refusal by itself: what a model builds once for all
its layers may follow the kinds of layer left, such as Gemma 3's rotary tables of each
attention kind or Qwen2's sliding-window mask, and lack what no kept layer uses. Then the
model built from the updated config is built for real on the model's device, given this
model's state dict (strictly: every tensor, none missing, of the same shapes, as
``from_pretrained`` loads the saved weights) and run on the example inputs
(``check_reloaded``): the removal is accepted where it computes what the model computed
with the blocks skipped, and refused naming the difference otherwise, or where there are
no example inputs to run. That build holds a second copy of the model's weights while it
runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.difference import largest_over
from prunekit.core.errors import value_error
from prunekit.core.example_inputs import ExampleInputs
from prunekit.structure.compaction.fromconfig import build_fresh
from prunekit.structure.depth.layerconfig import position_fields
from prunekit.structure.depth.outputs import TOLERANCE, outputs_of

__all__ = ["built", "check_rebuilt", "check_reloaded", "index_attributes", "reloaded"]

_OWNER = "remove_blocks"
_INDEX = "layer_idx"
"""The attribute under which Hugging Face's modules hold their layer's index."""


def built(model: nn.Module, config: Any) -> nn.Module | None:
    """`model`'s class built on the meta device from `config` (None: it cannot be)."""
    if config is None:
        return None
    fresh = build_fresh(model, config)
    return fresh if isinstance(fresh, nn.Module) else None


def check_rebuilt(model: nn.Module, before: nn.Module, config: Any, path: str,
                  kept: list[int]) -> str | None:  # fmt: skip
    """Refuse (ValueError naming the difference and the config's positional fields) where a
    model built from the updated `config` differs from `before` (built from the old one)
    in the kept blocks of the ModuleList at `path`.

    Returns:
        How it differs outside that list (None: it does not), for ``check_reloaded``.
    """
    after = built(model, config)
    if after is None:
        raise value_error(
            f"{_OWNER}: {type(model).__name__} cannot be built from its updated config "
            f"({_why(model, config)}); the model is unchanged"
        )
    why, inside = _difference(before, after, path, kept, len(kept))
    if why is not None and inside:
        raise _refusal(config, why, "")
    return why


def check_reloaded(model: nn.Module, config: Any, inputs: ExampleInputs | None,
                   reference: list[Tensor] | None, why: str) -> None:  # fmt: skip
    """Accept a model built from the updated `config` that differs from this one outside
    the blocks (`why`, from ``check_rebuilt``) where, built for real and given `model`'s
    state dict, it computes on `inputs` the `reference` outputs (those with the blocks
    skipped), within ``outputs.TOLERANCE`` of the largest.

    Raises:
        ValueError: no example inputs to run it on, weights it does not take, or outputs
            that differ (each named with `why`).
    """
    if reference is None:
        raise _refusal(config, why, "; and there are no example inputs to run it on "
                       "(example_inputs=) to show it computes the same")  # fmt: skip
    try:
        fresh = reloaded(model, config)
    except (RuntimeError, ValueError) as error:  # load_state_dict's refusal, named
        raise _refusal(config, why, f"; and it does not take this model's weights "
                       f"({' '.join(str(error).split())[:300]})") from None  # fmt: skip
    try:
        found = outputs_of(fresh, inputs)
    except Exception as error:
        raise _refusal(config, why, f"; loaded with this model's weights, it cannot run the "
                       f"example inputs ({type(error).__name__}: {error})") from error  # fmt: skip
    if [t.shape for t in found] != [t.shape for t in reference]:
        raise _refusal(config, why, "; loaded with this model's weights, it returns outputs "
                       f"of other shapes {[tuple(t.shape) for t in found]}")  # fmt: skip
    diff, scale = largest_over(zip(reference, found, strict=True))
    if not diff <= TOLERANCE * scale:  # NaN is a difference
        raise _refusal(config, why, f"; loaded with this model's weights, it differs from it "
                       f"by {diff:.3g} on the example inputs (largest output {scale:.3g}; "
                       f"tolerance {TOLERANCE:g} x that)")  # fmt: skip


def reloaded(model: nn.Module, config: Any) -> nn.Module:
    """`model`'s class built from `config` as from_pretrained reads it, on `model`'s device
    and in its floating type, holding `model`'s state dict (loaded strictly), in eval mode.

    Raises:
        RuntimeError: the state dict does not fit it (missing, unexpected, other shapes).
        ValueError: it cannot be built.
    """
    first = next(iter(model.parameters()), None)
    device = str(first.device) if first is not None else "cpu"
    fresh = build_fresh(model, config, device=device)
    if not isinstance(fresh, nn.Module):
        raise value_error(f"{_OWNER}: {fresh or 'no class built from a config alone'}")
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    fresh.to(dtype).load_state_dict(model.state_dict(), strict=True)
    return fresh.eval()


def _refusal(config: Any, why: str, more: str) -> ValueError:
    fields = ", ".join(position_fields(config)) or "none found"
    return value_error(
        f"{_OWNER}: a model built from the updated config (as from_pretrained builds "
        f"it) would differ from this one: {why}{more}; config fields that may depend on "
        f"layer positions: {fields}; expected a config that describes the kept layers "
        "(other blocks to remove); the model and its config are unchanged"
    )


def index_attributes(before: nn.Module | None, path: str) -> set[tuple[str, str]]:
    """The int attributes (module name inside a block, attribute) that hold their block's
    position in every block of the list at `path` of `before` (built from the config):
    ``layer_idx``, and a family's own (BigBird's ``seed``). Removal renumbers them, as a
    model built from the updated config numbers them; without `before`, ``layer_idx``."""
    found = {("*", _INDEX)}
    if before is None:
        return found
    blocks = before.get_submodule(path)
    assert isinstance(blocks, nn.ModuleList)
    first = dict(blocks[0].named_modules())
    for name, module in first.items():
        for key, value in vars(module).items():
            if type(value) is int and value == 0 and all(
                _held(block, name, key) == i for i, block in enumerate(blocks)
            ):  # fmt: skip
                found.add((name, key))
    return found


def _held(block: nn.Module, name: str, key: str) -> Any:
    try:
        return vars(block.get_submodule(name)).get(key)
    except AttributeError:
        return None


def _why(model: nn.Module, config: Any) -> str:
    found = build_fresh(model, config)
    return found if isinstance(found, str) else "no class built from a config alone"


def _difference(before: nn.Module, after: nn.Module, path: str, kept: list[int],
                count: int) -> tuple[str | None, bool]:  # fmt: skip
    """How the model built after differs from the one built before (None: alike), and
    whether the difference is in the block list (else outside it)."""
    old, new = before.get_submodule(path), after.get_submodule(path)
    assert isinstance(old, nn.ModuleList)
    if not isinstance(new, nn.ModuleList) or len(new) != count:
        held = len(new) if isinstance(new, nn.ModuleList) else 0
        return f"{path} would hold {held} blocks, not {count}", True
    indexed = index_attributes(before, path)
    for j, i in enumerate(kept):
        why = _module_difference(old[i], new[j], f"{path}.{i}", f"{path}.{j}", (i, j), indexed)
        if why is not None:
            return why, True
    return _outer_difference(before, after, path, (len(old), kept)), False


def _outer_difference(before: nn.Module, after: nn.Module, path: str,
                      kept: tuple[int, list[int]]) -> str | None:  # fmt: skip
    outer_old = {n: m for n, m in before.named_modules() if not _inside(n, path)}
    outer_new = {n: m for n, m in after.named_modules() if not _inside(n, path)}
    for name in [*outer_old, *(n for n in outer_new if n not in outer_old)]:
        if name not in outer_old or name not in outer_new:
            return f"it would {'have' if name in outer_new else 'lack'} {name}"
        why = _own_difference(outer_old[name], outer_new[name], name, kept=kept)
        if why is not None:
            return why
    return None


def _inside(name: str, path: str) -> bool:
    return name == path or name.startswith(path + ".")


def _module_difference(old: nn.Module, new: nn.Module, old_name: str, new_name: str,
                       index: tuple[int, int],
                       indexed: set[tuple[str, str]]) -> str | None:  # fmt: skip
    olds, news = dict(old.named_modules()), dict(new.named_modules())
    for name in [*olds, *(n for n in news if n not in olds)]:
        where = f"{new_name}.{name}" if name else new_name
        if name not in news:
            return f"{where} would be missing (it is {old_name}.{name} now)"
        if name not in olds:
            return f"it would have {where}, which {old_name} has not"
        keys = {key for module, key in indexed if module in ("*", name)}
        why = _own_difference(olds[name], news[name], where, index=index, indexed=keys)
        if why is not None:
            return f"{why} (it is {old_name}{'.' + name if name else ''} now)"
    return None


def _own_difference(old: nn.Module, new: nn.Module, where: str,
                    index: tuple[int, int] = (-1, -1), indexed: set[str] | None = None,
                    kept: tuple[int, list[int]] = (-1, [])) -> str | None:  # fmt: skip
    """How `new` itself (not its submodules) differs from `old`: its class, its parameters'
    and buffers' names and shapes, its plain attributes (an index or a layer count that
    follows the removal is no difference, nor are a layer count and a list of one entry per
    layer that follow it: `kept` holds the old count and the kept positions)."""
    if type(old) is not type(new):
        return f"{where} would be {type(new).__name__}, not {type(old).__name__}"
    for kind in ("_parameters", "_buffers"):
        mine, theirs = getattr(old, kind), getattr(new, kind)
        for key in [*mine, *(k for k in theirs if k not in mine)]:
            a, b = mine.get(key), theirs.get(key)
            shape_a = None if a is None else tuple(a.shape)
            shape_b = None if b is None else tuple(b.shape)
            if shape_a != shape_b:
                return f"{where}.{key} would be {shape_b}, not {shape_a}"
    for key, value in vars(old).items():
        if key.startswith("_") or key == "training" or not _plain(value):
            continue
        other = vars(new).get(key, value)
        if other == value or (key in (indexed or ()) and (value, other) == index):
            continue
        if _follows(value, other, *kept):
            continue
        return f"{where}.{key} would be {other!r}, not {value!r}"
    return None


def _follows(value: Any, other: Any, count: int, kept: list[int]) -> bool:
    """Whether `other` is `value` (a count of `count` layers, or a list of one entry per
    layer) for the `kept` layers."""
    if isinstance(value, int) and value == count:
        return bool(other == len(kept))
    if isinstance(value, list | tuple) and len(value) == count:
        return isinstance(other, list | tuple) and list(other) == [value[i] for i in kept]
    return False


def _plain(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, bool | int | float | str)
