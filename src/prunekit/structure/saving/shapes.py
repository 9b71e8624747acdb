"""The shapes of a compacted model: described module by module, planned onto a freshly built
model, applied, and checked (the engine of ``save_compacted`` / ``load_compacted``).

Everything is checked in ``Reload.plan`` before the model changes; ``apply_reload`` only
replaces tensors by new ones (it never writes into the fresh model's own), so restoring the
modules' dicts undoes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.naming import MASK, ORIG
from prunekit.structure.compaction.fromconfig import embed_scales, set_embed_scale
from prunekit.structure.compaction.widths import implied_widths
from prunekit.structure.families.mha import CompactMultiheadAttention

__all__ = [
    "Reload", "apply_reload", "check_widths", "describe_module", "same_class", "saved_value",
    "verify",
]  # fmt: skip

_MISSING: Any = object()
_OWNER = "load_compacted"


def width_value(value: Any) -> Any:
    """`value` as JSON if it is an int or a tuple or list of ints (not bools), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return int(value)
    if isinstance(value, tuple | list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        items = [int(v) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    return None


NORM_EPS = ("eps", "variance_epsilon")
"""Float attributes of a norm that its forward reads and that a width cut changes
(``rotate_hidden`` scales a norm's epsilon with the width it keeps): saved and reloaded
beside the widths."""


def saved_value(name: str, value: Any) -> Any:
    """What save_compacted records of the attribute `name` holding `value`: a width (see
    ``width_value``), a norm's finite float epsilon, else None (not recorded)."""
    if name in NORM_EPS and type(value) is float and math.isfinite(value):
        return value
    return width_value(value)


def decoded(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"tuple"}:
        return tuple(value["tuple"])
    return value


def describe_module(module: nn.Module) -> dict[str, Any]:
    """Class, tensors (shape, dtype, parameter or buffer, persistent), width attributes and,
    where the module holds any, its embedding scales (``scales``: name -> float; see
    ``fromconfig.embed_scales``), which a module built anew would compute from its config."""
    tensors: dict[str, Any] = {}
    kinds = (("parameter", module._parameters), ("buffer", module._buffers))
    for kind, found in kinds:
        for name, value in found.items():
            if value is None:
                continue
            tensors[name] = {
                "shape": [int(n) for n in value.shape],
                "dtype": str(value.dtype).removeprefix("torch."),
                "kind": kind,
                "persistent": name not in module._non_persistent_buffers_set,
            }
    attributes = {}
    for name, value in vars(module).items():
        encoded = None if name.startswith("_") else saved_value(name, value)
        if encoded is not None:
            attributes[name] = encoded
    described = {"type": _class_name(module), "tensors": tensors, "attributes": attributes}
    scales = embed_scales(module)
    if scales:  # only where held: the entries of other modules read as before
        described["scales"] = scales
    return described


def _class_name(module: nn.Module | type[nn.Module]) -> str:
    cls = module if isinstance(module, type) else type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


COMPACTED: dict[str, tuple[type[nn.Module], type[nn.Module]]] = {
    _class_name(CompactMultiheadAttention): (nn.MultiheadAttention, CompactMultiheadAttention),
}
"""The classes ``compact`` gives a module in place, by saved name: (the class the module is
built as, the class it becomes). ``load_compacted`` gives a fresh module of the first the
second."""


def compacted_class(saved: Any, module: nn.Module) -> type[nn.Module] | None:
    """The class `module` (built fresh) takes to be what was saved as the class `saved`
    where compaction changed it in place; None for any other."""
    found = COMPACTED.get(saved) if isinstance(saved, str) else None
    return found[1] if found is not None and type(module) is found[0] else None


def same_class(saved: Any, module: nn.Module) -> bool:
    """Whether `module` (built fresh) is of the class saved as `saved`, or of the class
    compaction made that one of."""
    return saved == _class_name(module) or compacted_class(saved, module) is not None


@dataclass
class SavedTensor:
    """One tensor the fresh module must have: its saved name(s) and layout."""

    path: str
    module: nn.Module
    name: str  # the name the fresh module gets (``weight`` for a saved ``weight_orig``)
    key: str  # the name it was saved under (``weight_orig``), within its module
    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    persistent: bool


@dataclass
class Reload:
    """What load_compacted changes, all checked: tensors, attributes, embedding scales,
    config fields."""

    targets: list[SavedTensor] = field(default_factory=list)
    attributes: list[tuple[nn.Module, str, Any]] = field(default_factory=list)
    scales: list[tuple[nn.Module, str, float]] = field(default_factory=list)
    classes: list[tuple[nn.Module, type[nn.Module]]] = field(default_factory=list)
    config: list[tuple[Any, str, Any]] = field(default_factory=list)
    expected: dict[str, Any] = field(default_factory=dict)  # path -> manifest entry

    @classmethod
    def plan(
        cls,
        model: nn.Module,
        modules: Mapping[str, Any],
        state: Mapping[str, Tensor],
        config: Any,
        source: str = "",
    ) -> Reload:
        """Everything `model` must change to hold what was saved, checked first; `source`
        (the folder) is named in the errors."""
        owner = f"{_OWNER} ({source})" if source else _OWNER
        fresh = dict(model.named_modules())
        _same_modules(model, fresh, modules, owner)
        reload = cls(expected=dict(modules))
        for path, entry in modules.items():
            module = fresh[path]
            swapped = compacted_class(entry.get("type"), module)
            if swapped is not None:
                reload.classes.append((module, swapped))
            reload.targets.extend(_targets(path, module, entry, state, owner))
            for name, saved in entry.get("attributes", {}).items():
                value = decoded(saved)
                if getattr(module, name, _MISSING) != value:
                    reload.attributes.append((module, name, value))
            held = embed_scales(module)
            for name, value in entry.get("scales", {}).items():
                if name not in held:
                    raise ValueError(
                        f"{owner}: module {path or '(the model)'!r} ({type(module).__name__}) "
                        f"was saved with the embedding scale {name}={value!r}, which the "
                        "model's module does not hold; expected a model built by the same code"
                    )
                reload.scales.append((module, name, value))
        _ties(reload.targets)
        if isinstance(config, dict):
            found = getattr(model, "config", None)
            if found is not None:
                _config_changes(found, config, reload.config)
        return reload

    def configs(self) -> list[Any]:
        """The config objects the layout changes (for the transaction to keep)."""
        return list({id(obj): obj for obj, _, _ in self.config}.values())


def _same_modules(
    model: nn.Module, fresh: Mapping[str, nn.Module], saved: Mapping[str, Any], owner: str
) -> None:
    where = f"{owner} into {type(model).__name__}"
    missing = [p for p in saved if p not in fresh]
    extra = [p for p in fresh if p not in saved]
    if missing or extra:
        raise ValueError(
            f"{where}: the file's modules {missing[:5]} are not in the model, and the model's "
            f"{extra[:5]} are not in the file; expected a model built by the same code"
        )
    for path, entry in saved.items():
        if not same_class(entry.get("type"), fresh[path]):
            raise ValueError(
                f"{where}: module {path or '(the model)'!r} is a {_class_name(fresh[path])} "
                f"but was saved as a {entry.get('type')}; expected the same classes"
            )


def _targets(
    path: str, module: nn.Module, entry: Any, state: Mapping[str, Tensor], owner: str
) -> list[SavedTensor]:
    """The tensors `module` must have, checked against the file and the module."""
    saved: dict[str, Any] = entry.get("tensors", {})
    prefix = f"{path}." if path else ""
    where = f"{owner}: module {path or '(the model)'!r} ({type(module).__name__})"
    for name, info in saved.items():
        key = prefix + name
        if not info.get("persistent", True):
            continue
        found = state.get(key)
        if found is None:
            raise ValueError(f"{where}: tensor {name!r} is missing from the weights file")
        if list(found.shape) != list(info["shape"]):
            raise ValueError(
                f"{where}: tensor {name!r} is {tuple(found.shape)} in the weights file but "
                f"{tuple(info['shape'])} in the shapes file; expected the files of one save"
            )
        if str(found.dtype).removeprefix("torch.") != info["dtype"]:
            raise ValueError(
                f"{where}: tensor {name!r} is {str(found.dtype).removeprefix('torch.')} in "
                f"the weights file but {info['dtype']} in the shapes file; expected the files "
                "of one save"
            )
    pruned = {
        n[: -len(ORIG)] for n in saved if n.endswith(ORIG) and n[: -len(ORIG)] + MASK in saved
    }
    targets = []
    for name, info in saved.items():
        if name.endswith(MASK) and name[: -len(MASK)] in pruned:
            continue
        base = name[: -len(ORIG)] if name.endswith(ORIG) and name[: -len(ORIG)] in pruned else name
        shape, dtype = tuple(info["shape"]), tensor_dtype(info["dtype"])
        target = SavedTensor(
            path, module, base, name, info["kind"], shape, dtype, info.get("persistent", True)
        )
        _check_target(where, target)
        targets.append(target)
    wanted = {t.name for t in targets}
    for name, value in [*module._parameters.items(), *module._buffers.items()]:
        if value is not None and name not in wanted:
            raise ValueError(
                f"{where}: has tensor {name!r} {tuple(value.shape)} that the file does not "
                "hold; expected a model built by the same code, unpruned"
            )
    return targets


def tensor_dtype(name: Any) -> torch.dtype:
    """The torch dtype named 'float32', 'bfloat16', ..."""
    found = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(found, torch.dtype):
        raise ValueError(f"{_OWNER}: unknown dtype {name!r} in the shapes file")
    return found


def _check_target(where: str, t: SavedTensor) -> None:
    module, name = t.module, t.name
    if module._parameters.get(name + ORIG) is not None:
        raise ValueError(
            f"{where}: tensor {name!r} is pruned; expected a freshly built, unpruned model "
            f"(prunekit.remove(module, {name!r}) first)"
        )
    current = _current(t)
    is_param = name in module._parameters and module._parameters[name] is not None
    is_buffer = name in module._buffers and module._buffers[name] is not None
    if (is_param and t.kind != "parameter") or (is_buffer and t.kind != "buffer"):
        kind = "a parameter" if is_param else "a buffer"
        raise ValueError(
            f"{where}: tensor {name!r} is {kind} in the model but a {t.kind} in the file"
        )
    if current is None and name in vars(module) and vars(module)[name] is not None:
        raise ValueError(
            f"{where}: {name!r} is a plain attribute of the model's module, not a tensor; "
            f"the file holds a {t.kind} {t.shape}"
        )
    if not t.persistent and (current is None or tuple(current.shape) != t.shape):
        built = "missing" if current is None else tuple(current.shape)
        raise ValueError(
            f"{where}: buffer {name!r} is {built} in the model but was "
            f"{t.shape} when saved, and it is not saved (not persistent), so it cannot be "
            "rebuilt; expected a model whose non-persistent buffers keep their shapes"
        )


def _ties(targets: list[SavedTensor]) -> None:
    """A tensor shared by several modules of the fresh model must get one shape."""
    seen: dict[int, SavedTensor] = {}
    for t in targets:
        current = _current(t)
        if current is None:
            continue
        other = seen.setdefault(id(current), t)
        if other.shape != t.shape:
            raise ValueError(
                f"{_OWNER}: {_label(other)} and {_label(t)} share one tensor in the model but "
                f"were saved with shapes {other.shape} and {t.shape}; expected them tied"
            )


def _label(t: SavedTensor) -> str:
    return f"{t.path}.{t.name}" if t.path else t.name


def _current(t: SavedTensor) -> Tensor | None:
    found = t.module._parameters.get(t.name)
    return found if found is not None else t.module._buffers.get(t.name)


def _config_changes(config: Any, saved: Mapping[str, Any], out: list[tuple[Any, str, Any]]) -> None:
    """The width fields (ints, lists of ints) of the saved config that differ, nested
    configs included."""
    for key, value in saved.items():
        if key.startswith("_"):
            continue
        current = getattr(config, key, _MISSING)
        if isinstance(value, dict) and callable(getattr(current, "to_dict", None)):
            _config_changes(current, value, out)
            continue
        wanted = width_value(value)
        if wanted is None:
            if _epsilon(key, value) and _epsilon(key, current) and current != value:
                out.append((config, key, value))  # a norm's epsilon a width cut scaled
            continue
        if current is _MISSING or current is None or width_value(current) is not None:
            normal = list(current) if isinstance(current, tuple) else current
            if normal != value:
                out.append((config, key, value))


def _epsilon(key: str, value: Any) -> bool:
    """Whether a config field is a norm's epsilon (``rms_norm_eps``, ``layer_norm_eps``,
    ``layer_norm_epsilon``) holding a finite float."""
    named = key.endswith(("_eps", "_epsilon"))
    return named and type(value) is float and math.isfinite(value)


def apply_reload(
    model: nn.Module, reload: Reload, source: Mapping[str, Tensor] | None = None
) -> None:
    """The classes compaction gave modules in place, new tensors of the planned shapes
    (dtype, device and requires_grad of the ones they replace), then the attributes,
    embedding scales and config fields.

    With `source` (the weights file's tensors, by state_dict key), each new tensor is the
    file's own, taken as it is (no copy): what a model built with its parameters on the
    meta device needs, so that memory holds the weights once.
    """
    for module, cls in reload.classes:  # as compact changed it: same object, its class
        module.__class__ = cls
    made: dict[int, Tensor] = {}
    for t in reload.targets:
        current = _current(t)
        if current is not None and tuple(current.shape) == t.shape and not t.persistent:
            continue  # kept as built: its values are not in the file
        if current is not None and id(current) in made:
            new = made[id(current)]
        else:
            new = _new_tensor(t, current, source)
            if current is not None:
                made[id(current)] = new
        _put(t, new)
    for module, name, value in reload.attributes:
        setattr(module, name, value)
    for module, name, scale in reload.scales:
        set_embed_scale(module, name, scale)  # a buffer replaced, as the tensors above
    for config, key, value in reload.config:
        setattr(config, key, value)


def _new_tensor(
    t: SavedTensor, current: Tensor | None, source: Mapping[str, Tensor] | None
) -> Tensor:
    if source is not None:
        value = source[f"{t.path}.{t.key}" if t.path else t.key].detach()
    elif current is not None:
        value = torch.empty(t.shape, dtype=current.dtype, device=current.device)
    else:
        value = torch.empty(t.shape, dtype=t.dtype, device=_device(t.module))
    dtype = value.dtype
    if t.kind == "parameter":
        grad = dtype.is_floating_point and (current is None or current.requires_grad)
        return nn.Parameter(value, requires_grad=grad)
    return value


def _device(module: nn.Module) -> torch.device:
    for value in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
        return value.device
    return torch.device("cpu")


def _put(t: SavedTensor, new: Tensor) -> None:
    module, name = t.module, t.name
    if t.kind == "parameter":
        if name not in module._parameters:
            vars(module).pop(name, None)  # an attribute such as `self.bias = None`
        module._parameters[name] = new  # type: ignore[assignment]
    else:
        if name not in module._buffers:
            vars(module).pop(name, None)
            if not t.persistent:
                module._non_persistent_buffers_set.add(name)
        module._buffers[name] = new


def check_widths(model: nn.Module, reload: Reload, source: str = "") -> None:
    """Raise ValueError where a saved width attribute contradicts the saved tensors (a
    Linear saved with out_features=5 and a weight of 8 rows): call it once the layout is
    applied; `source` (the folder) is named in the error."""
    owner = f"{_OWNER} ({source})" if source else _OWNER
    modules = dict(model.named_modules())
    for path in reload.expected:
        module = modules[path]
        for name, implied in implied_widths(module).items():
            value = getattr(module, name, _MISSING)
            if (tuple(value) if isinstance(value, list) else value) != implied:
                shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
                raise ValueError(
                    f"{owner}: module {path or '(the model)'!r} ({type(module).__name__}) was "
                    f"saved with {name}={value!r}, but its saved tensors {shapes} make it "
                    f"{implied!r}; expected the files of one save"
                )


def verify(model: nn.Module, reload: Reload, state: Mapping[str, Tensor]) -> None:
    """Raise unless the loaded model has the file's tensors (names, shapes, values) and the
    manifest's attributes and embedding scales."""
    found = model.state_dict()
    if set(found) != set(state):
        raise RuntimeError(
            f"{_OWNER}: after loading, the model's keys differ from the file's (missing "
            f"{sorted(set(state) - set(found))[:5]}, extra {sorted(set(found) - set(state))[:5]})"
        )
    for key, value in state.items():
        mine = found[key]
        if tuple(mine.shape) != tuple(value.shape) or not torch.equal(mine, value.to(mine.dtype)):
            raise RuntimeError(
                f"{_OWNER}: tensor {key!r} is {tuple(mine.shape)} after loading but "
                f"{tuple(value.shape)} in the file, or its values differ"
            )
    modules = dict(model.named_modules())
    for path, entry in reload.expected.items():
        for name, saved in entry.get("attributes", {}).items():
            value = getattr(modules[path], name, _MISSING)
            if value != decoded(saved):
                raise RuntimeError(
                    f"{_OWNER}: attribute {name!r} of module {path!r} is {value!r} after "
                    f"loading, not {decoded(saved)!r} as saved"
                )
        for name, scale in entry.get("scales", {}).items():
            if not _holds_scale(modules[path], name, scale):
                raise RuntimeError(
                    f"{_OWNER}: the embedding scale {name!r} of module {path!r} is "
                    f"{embed_scales(modules[path]).get(name)!r} after loading, not {scale!r} "
                    "as saved"
                )


def _holds_scale(module: nn.Module, name: str, scale: float) -> bool:
    """Whether `module`'s embedding scale `name` is `scale` (a buffer: every element, in the
    buffer's dtype)."""
    buffer = module._buffers.get(name)
    if buffer is not None:
        return torch.equal(buffer, torch.full_like(buffer, scale))
    value = vars(module).get(name)
    return type(value) is float and value == scale
