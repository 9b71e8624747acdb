"""Saving and loading pruned models: state dicts with or without the pruning, atomic files.

A pruned tensor ``<name>`` is stored as ``<name>_orig`` (its values) and ``<name>_mask``
(0s and 1s), the format torch.nn.utils.prune uses too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from prunekit.core.backend import framework, is_module, is_tensor
from prunekit.core.checks import check_binary_mask, is_attention_out_proj
from prunekit.core.errors import describe, type_error, value_error
from prunekit.core.naming import MASK, mask_name, orig_name, pruned_name
from prunekit.core.transaction import transaction
from prunekit.core.unsaved import refuse_unsaved
from prunekit.dropin.hooks import pruning_hooks, torch_pruned
from prunekit.dropin.install import install, refresh_masked
from prunekit.dropin.torch_methods import CustomFromMask
from prunekit.io.files import EXTRA_STATE, load_state_dict, refuse_empty_path, save_state_dict

if TYPE_CHECKING:  # what nn.Module.load_state_dict returns
    from torch.nn.modules.module import _IncompatibleKeys

__all__ = [
    "load_pruned",
    "load_pruned_state_dict",
    "permanent_state_dict",
    "refresh_pruned",
    "refuse_meta",
    "save_pruned",
]

StateDict = Mapping[str, Tensor]


def pruned_tensors(model: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
    """Yield (prefix, module, name) for every pruned tensor, under every prefix it has:
    pruned by prunekit, or by torch.nn.utils.prune itself (whose hooks keep the same
    ``<name>_orig`` and ``<name>_mask``)."""
    for path, module in model.named_modules(remove_duplicate=False):
        prefix = path + "." if path else ""
        names = [h._tensor_name for h in pruning_hooks(module)] + torch_pruned(module)
        for name in names:
            if name is not None:
                yield prefix, module, name


def refresh_pruned(model: nn.Module) -> None:
    """Recompute ``module.<name>`` = mask * orig for every pruned tensor of `model`.

    Needed only after ``<name>_orig`` or ``<name>_mask`` was changed in a way the hooks
    cannot see (a write through ``.data``), or to have ``module.<name>`` follow a
    dtype or device move before the next forward.

    Args:
        model: a model, pruned or not.
    """
    for module in model.modules():
        refresh_masked(module)


def permanent_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """A plain state_dict of `model` with every pruning made permanent; `model` is not changed.

    Each ``<name>_orig`` / ``<name>_mask`` pair becomes ``<name>`` = mask * orig, so the
    result loads into an unpruned copy of the model (tensors pruned by
    torch.nn.utils.prune itself too). Other entries are the model's own
    (detached) tensors, as in state_dict().

    Args:
        model: a model, pruned or not.

    Returns:
        The state_dict, keyed as the unpruned model's.

    Raises:
        ValueError: the model holds skipped blocks, masked experts or a masked hidden
            width, which act through forward hooks no state_dict holds (loaded into an
            unpruned copy, it would compute something else): naming them and the call to
            make first (``prunekit.remove_blocks(model)``, ``prunekit.compact(model,
            inputs)``).
    """
    refuse_unsaved(model, "permanent_state_dict")
    state = dict(model.state_dict())
    for prefix, _, name in pruned_tensors(model):
        key = prefix + name
        orig = state.pop(orig_name(key), None)
        mask = state.pop(mask_name(key), None)
        if orig is not None and mask is not None:
            state[key] = mask.to(dtype=orig.dtype) * orig
    return state


def load_pruned_state_dict(
    model: nn.Module, state_dict: StateDict, strict: bool = True
) -> _IncompatibleKeys:
    """Load a state_dict with ``_orig``/``_mask`` entries, pruning `model` to match.

    Tensors of `model` not yet pruned get the saved mask exactly (through CustomFromMask);
    pruned ones keep their hooks and take the saved mask and values. Keys, entries and
    shapes are checked before anything changes: on error `model` is left as it was. A
    module's extra state (``get_extra_state``: ``<prefix>._extra_state``, any object) loads
    as ``load_state_dict`` loads it.

    Args:
        model: the model to load into, pruned or not (a fresh, unpruned one is fine).
        state_dict: the entries, ``<name>_orig`` and ``<name>_mask`` for pruned tensors (as
            a pruned model's state_dict, or ``torch.nn.utils.prune``'s, holds them).
        strict: require the keys to be exactly the model's, as ``load_state_dict`` does.

    Returns:
        What ``nn.Module.load_state_dict`` returns (missing and unexpected keys when not
        strict).

    Raises:
        TypeError: `state_dict` is not a mapping, a key is no str, an entry is no tensor
            (but the extra state of a module of `model` that has one), or a saved mask
            would prune a parameter that is not floating-point.
        ValueError: a mask holds values other than 0 and 1, an entry is on the meta device
            (no values; unless the model's tensor is too) or is not dense (sparse, nested,
            or quantized where the model's tensor is not).
        RuntimeError: missing or unexpected keys (when strict), an entry naming a submodule
            the model does not have (when strict), or shapes that differ.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"load_pruned_state_dict: invalid state_dict of type {type(state_dict).__name__}; "
            "expected a mapping of names to tensors"
        )
    own = model.state_dict()
    _check_entries(own, state_dict)
    installs = _installs(model, state_dict, strict)
    _check_keys(model, own, state_dict, installs, strict)
    with transaction(m for target, _, _, owner in installs.values() for m in (target, owner)):
        for target, name, mask, _ in installs.values():
            install(target, name, CustomFromMask(mask))
        result: _IncompatibleKeys = model.load_state_dict(state_dict, strict=strict)
    refresh_pruned(model)
    return result


Install = tuple[nn.Module, str, Tensor, nn.Module]


def _check_entries(own: StateDict, state_dict: StateDict) -> None:
    """Refuse, before anything changes, an entry ``load_state_dict`` would fail to copy
    after copying the others: a key that is no str, a value that is no tensor (but a
    module's extra state, where `own`, the model's state_dict, holds one under that key),
    a tensor on the meta device (where the model's is not) or one that is not dense
    (nested, sparse, or quantized where the model's is not)."""
    where = "load_pruned_state_dict"
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise type_error(
                f"{where}: invalid key {key!r} of type {type(key).__name__}; expected str "
                "keys (the tensors' names), as model.state_dict() holds them"
            )
        mine = own.get(key, own.get(pruned_name(key) or key))
        if not isinstance(value, Tensor):
            if is_tensor(value):  # another framework's tensor: its own load checks it
                continue
            if key.endswith(EXTRA_STATE) and key in own and not isinstance(mine, Tensor):
                continue  # a module's extra state: set_extra_state takes any object
            raise type_error(
                f"{where}: entry {key!r} has type {type(value).__name__}; expected a tensor "
                "(or the extra state of a module that has one, under <prefix>._extra_state)"
            )
        if value.is_meta and not (isinstance(mine, Tensor) and mine.is_meta):
            raise value_error(
                f"{where}: entry {key!r} is on the meta device, with no values to load; "
                "expected tensors holding values (a state_dict of a model that was built "
                "with its weights)"
            )
        kind = _unusual(value, mine)
        if kind is not None:
            raise value_error(
                f"{where}: entry {key!r} is a {kind} tensor; expected dense tensors, as "
                "model.state_dict() holds them (value.to_dense() first)"
            )


def _installs(
    model: nn.Module, state_dict: StateDict, strict: bool
) -> dict[tuple[int, str], Install]:
    """The tensors to prune before loading: saved as pruned, plain in `model`.

    Values are (module to install on, name, mask, module holding the tensor); they differ
    for MultiheadAttention.out_proj, pruned through its parent (see install()).
    """
    found: dict[tuple[int, str], Install] = {}
    for key, mask in state_dict.items():
        pruned = pruned_name(key, MASK)
        if pruned is None or orig_name(pruned) not in state_dict:
            continue
        check_binary_mask(mask, f"load_pruned_state_dict: entry {key!r}")
        path, _, name = pruned.rpartition(".")
        try:
            module = model.get_submodule(path)
        except AttributeError:
            if strict:
                raise RuntimeError(
                    f"load_pruned_state_dict: entry {key!r} names a submodule {path!r} that "
                    f"{type(model).__name__} does not have; expected keys of this model "
                    "(or strict=False to skip them)"
                ) from None
            continue
        if name not in module._parameters or module._parameters[name] is None:
            continue  # already pruned, or no such parameter: _check_keys reports it
        target, dotted = module, name
        if is_attention_out_proj(module) and path:
            parent, _, child = path.rpartition(".")
            target, dotted = model.get_submodule(parent), f"{child}.{name}"
        found.setdefault((id(module), name), (target, dotted, mask, module))
    return found


def _check_keys(
    model: nn.Module,
    own: StateDict,
    state_dict: StateDict,
    installs: Mapping[tuple[int, str], Install],
    strict: bool,
) -> None:
    """Raise before loading if keys (when strict) or shapes do not match; `own` is the
    model's state_dict (a module's extra state has no shape)."""
    expected = {key: _shape(t) for key, t in own.items()}
    for path, module in model.named_modules(remove_duplicate=False):
        prefix = path + "." if path else ""
        for (owner, name), _ in installs.items():
            if owner == id(module) and prefix + name in expected:
                shape = expected.pop(prefix + name)
                expected[prefix + orig_name(name)] = expected[prefix + mask_name(name)] = shape
    where = f"load_pruned_state_dict into {type(model).__name__}"
    if strict:
        missing = sorted(set(expected) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(expected))
        if missing or unexpected:
            raise RuntimeError(
                f"{where}: missing keys {missing}, unexpected keys {unexpected}; expected "
                "the model's keys, with <name>_orig and <name>_mask for pruned tensors"
            )
    wrong = [
        f"{key}: saved {_shape(t)}, model {expected[key]}"
        for key, t in state_dict.items()
        if key in expected and _shape(t) != expected[key]
    ]
    if wrong:
        raise RuntimeError(f"{where}: shapes differ ({'; '.join(wrong)}); expected equal shapes")
    paths = {id(m): p for p, m in model.named_modules(remove_duplicate=False)}
    for module_id, name in installs:
        module = installs[(module_id, name)][3]
        param = module._parameters[name]
        if param is not None and not param.is_floating_point():
            raise TypeError(
                f"{describe(module, name, paths.get(module_id))} has dtype {param.dtype}; "
                "expected a floating-point parameter"
            )


def _unusual(value: Tensor, mine: object) -> str | None:
    """What sets a saved tensor apart from a dense one that copies into the model's
    (nested, sparse; quantized where the model's is not), or None."""
    if value.is_nested:
        return "nested"
    if value.layout != torch.strided:
        return str(value.layout).removeprefix("torch.")
    if value.is_quantized and not (isinstance(mine, Tensor) and mine.is_quantized):
        return "quantized"
    return None


def _shape(value: object) -> tuple[int, ...] | None:
    """A tensor's shape; None for a module's extra state (any object)."""
    return tuple(value.shape) if isinstance(value, Tensor) else None


def save_pruned(model: nn.Module, path: str | os.PathLike[str], permanent: bool = False) -> Path:
    """Save `model`'s state_dict to `path` atomically (safetensors if it ends in .safetensors).

    With ``permanent=True`` the pruning is made permanent in the file (for deployment:
    loads into an unpruned model with load_state_dict); `model` itself is not changed.
    A model that computes through hooks no file holds (skipped blocks, masked experts, a
    masked hidden width) is refused: remove or compact those first.

    Args:
        model: a torch model, pruned or not.
        path: the file to write; a ``.safetensors`` suffix writes safetensors (needs
            ``prunekit[cli]``; tensors only, so no module's extra state), anything else
            ``torch.save``'s format. Written to a temporary file beside it and renamed
            into place.
        permanent: write mask * orig under the plain names instead of the masks.

    Returns:
        The path written.

    Raises:
        TypeError: `model` is a TensorPlay model (save its state_dict with
            ``tensorplay.save`` instead).
        ValueError: the model holds skipped blocks, masked experts or a masked hidden
            width, which act through forward hooks no state_dict holds (reloaded, the
            model would compute something else): naming them and the call to make first
            (``prunekit.remove_blocks(model)``, ``prunekit.compact(model, inputs)``);
            nothing is written; a tensor on the meta device (no values to write); or an
            empty `path` (Path('') is the current folder);
            prunekit.io.files.CheckpointError (a ValueError) for a .safetensors `path` and
            a module's extra state (no tensor), the file left as it was.
    """
    _refuse_tensorplay(model, "save_pruned", "tensorplay.save(model.state_dict(), path)")
    refuse_empty_path("save_pruned", "path", path)
    refuse_unsaved(model, "save_pruned")
    state = permanent_state_dict(model) if permanent else model.state_dict()
    refuse_meta(state, "save_pruned")
    return save_state_dict(state, path)


def refuse_meta(state: StateDict, owner: str) -> None:
    """Refuse a state_dict about to be written that holds a tensor on the meta device (a
    shape without values): a file would hold no weights for it.

    Args:
        state: what is to be written.
        owner: the public call, named first in the message.

    Raises:
        ValueError: naming `owner` and the first such entry.
    """
    for key, value in state.items():
        if isinstance(value, Tensor) and value.is_meta:
            raise value_error(
                f"{owner}: the model's {key!r} is on the meta device (a shape without "
                "values), so no file can hold its weights; expected a model with its "
                "weights loaded"
            )


def load_pruned(
    model: nn.Module, path: str | os.PathLike[str], strict: bool = True
) -> _IncompatibleKeys:
    """Load a file written by save_pruned (or any state_dict file) into `model`.

    PyTorch files are read with ``weights_only=True`` (the extra state of a module that has
    one, under ``<prefix>._extra_state``, comes back too); see load_pruned_state_dict for
    the rest.

    Args:
        model: the model to load into, pruned or not.
        path: a PyTorch state_dict file or a ``.safetensors`` file.
        strict: require the keys to be exactly the model's.

    Returns:
        What ``nn.Module.load_state_dict`` returns.

    Raises:
        TypeError: `model` is a TensorPlay model (use ``load_pruned_state_dict(model,
            tensorplay.load(path))``).
        prunekit.io.files.CheckpointError: a ValueError: the file is missing or cannot be
            read as a state_dict (its message says why).
        RuntimeError: keys or shapes do not match (see load_pruned_state_dict).
    """
    _refuse_tensorplay(model, "load_pruned", "load_pruned_state_dict(model, tensorplay.load(path))")
    found = load_state_dict(path, extra_state=True)  # what save_pruned wrote, extra state too
    return load_pruned_state_dict(model, found, strict=strict)


def _refuse_tensorplay(model: Any, where: str, instead: str) -> None:
    """Checkpoint files hold torch tensors: a tensorplay model cannot go through them."""
    if is_module(model) and framework(model) == "tensorplay":
        raise TypeError(
            f"{where}: invalid model {type(model).__name__} of tensorplay; prunekit's checkpoint "
            "files hold torch tensors, so expected a torch model. For a tensorplay model use "
            f"{instead}"
        )
