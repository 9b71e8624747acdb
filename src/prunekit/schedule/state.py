"""A GradualPruner's state_dict: what it holds, the checks on loading it, and rewinding.

The state is plain numbers, strings and tensors (masks as bool), so
``torch.load(path, weights_only=True)`` reads it. Loading checks everything before
anything changes: the same set-up (schedule, method, pattern, scope, targets), a sparsity
not above final_amount, and masks of the targets' shapes.
"""

from __future__ import annotations

import base64
import binascii
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from prunekit.core.checks import check_binary_mask, check_kind
from prunekit.core.errors import runtime_error, type_error, value_error

if TYPE_CHECKING:
    from prunekit.schedule.pruner import GradualPruner

__all__ = ["check_state", "from_json_state", "json_state", "pruner_state", "rewound_state"]

VERSION = 1


def setup(pruner: GradualPruner) -> dict[str, Any]:
    """What must agree between the pruner that saved a state and the one loading it."""
    t = pruner.timetable
    shape = "callable" if t.shape is None else t.shape.__name__
    return {
        "final_amount": t.final_amount,
        "initial_amount": t.initial_amount,
        "start_step": t.start_step,
        "end_step": t.end_step,
        "every": t.every,
        "schedule": shape,
        "method": pruner.label,
        "pattern": _described(pruner.pattern),  # the label says 'L1' for rows and N:M too
        "targets": [target.name for target in pruner.targets],
    }


def _described(pattern: object) -> str:
    """`pattern` as text equal in any process: its repr, or its class where the repr holds
    an address (a pattern of the user's without a repr of its own)."""
    text = repr(pattern)
    return type(pattern).__qualname__ if " at 0x" in text else text


LATER = ("pattern",)
"""Set-up keys added after version 1 was written: a state saved without one still loads."""


def pruner_state(
    pruner: GradualPruner, masks: Mapping[str, Tensor], generator: Tensor
) -> dict[str, Any]:
    return {
        "version": VERSION,
        "steps": pruner.steps,
        "amount": pruner.amount,
        "generator": generator.clone(),
        "masks": {name: mask.detach().ne(0) for name, mask in masks.items()},
        "setup": setup(pruner),
    }


def json_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A pruner's `state` (its state_dict) as JSON, masks named but not held: what a
    checkpoint that holds the model (whose buffers are the masks) needs beside it."""
    generator = state["generator"].numpy().tobytes()
    return {
        "version": state["version"],
        "steps": state["steps"],
        "amount": state["amount"],
        "generator": base64.b64encode(generator).decode("ascii"),
        "masks": sorted(state["masks"]),
        "setup": dict(state["setup"]),
    }


def from_json_state(saved: Any, masks: Mapping[str, Tensor], where: str) -> dict[str, Any]:
    """The state_dict `saved` (from json_state) stands for, with `masks` (the model's, by
    target name) for the ones it names; check_state checks the rest on loading."""
    names = saved.get("masks") if isinstance(saved, Mapping) else None
    encoded = saved.get("generator") if isinstance(saved, Mapping) else None
    try:
        raw = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else b""
        generator = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    except (ValueError, binascii.Error):
        generator = None
    if generator is None or not isinstance(names, list) or not all(n in masks for n in names):
        raise value_error(
            f"{where}: invalid saved pruner state {str(saved)[:200]!r}; expected a mapping "
            f"with 'generator' (base64) and 'masks' (names among {sorted(masks)[:5]})"
        )
    return {**saved, "generator": generator, "masks": {n: masks[n] for n in names}}


def check_state(
    pruner: GradualPruner, state: Any, shapes: list[torch.Size], owner: str
) -> tuple[int, float, Tensor, dict[str, Tensor]]:
    """(steps, amount, generator state, masks by name) of `state`, every part checked."""
    where = f"{owner}.load_state_dict"
    if not isinstance(state, Mapping):
        raise type_error(
            f"{where}: invalid state of type {type(state).__name__}; expected the dict "
            "that GradualPruner.state_dict() returns"
        )
    missing = [
        k for k in ("version", "steps", "amount", "generator", "masks", "setup") if k not in state
    ]
    if missing or state["version"] != VERSION:
        raise value_error(
            f"{where}: the state lacks {missing} or has version {state.get('version')!r}; "
            f"expected a GradualPruner state_dict of version {VERSION}"
        )
    mine = setup(pruner)
    for key, value in mine.items():
        if key in LATER and isinstance(state["setup"], Mapping) and key not in state["setup"]:
            continue
        saved = state["setup"].get(key) if isinstance(state["setup"], Mapping) else None
        if saved != value:
            raise value_error(
                f"{where}: the state was saved with {key}={saved!r}; this pruner has "
                f"{key}={value!r}; expected a pruner set up as the one that saved it"
            )
    steps, amount, generator = state["steps"], state["amount"], state["generator"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise value_error(f"{where}: invalid steps={steps!r}; expected an int >= 0")
    final = pruner.timetable.final_amount  # no update goes past it: a state above is no state
    if isinstance(amount, bool):
        raise type_error(
            f"{where}: invalid amount={amount!r} of type bool; expected a float in "
            f"[0, final_amount={final}]"
        )
    if not isinstance(amount, numbers.Real) or not 0 <= float(amount) <= final:
        raise value_error(
            f"{where}: invalid amount={amount!r}; expected a float in [0, final_amount={final}]"
        )
    if not isinstance(generator, Tensor) or generator.dtype != torch.uint8:
        raise value_error(f"{where}: invalid generator state; expected a uint8 tensor")
    try:  # on a scratch generator: the pruner's own is set only once all is checked
        torch.Generator().set_state(generator)
    except RuntimeError as error:
        raise value_error(
            f"{where}: invalid generator state of {generator.numel()} bytes ({error}); "
            "expected the state torch.Generator().get_state() returns"
        ) from None
    masks = _masks(state["masks"], pruner, shapes, where)
    _check_all_masks(masks, pruner, steps, float(amount), where)
    return steps, float(amount), generator, masks


def _check_all_masks(
    masks: Mapping[str, Tensor], pruner: GradualPruner, steps: int, amount: float, where: str
) -> None:
    """A pruner holds the masks of all its targets from its first update (or prepare) on,
    and none before: a state holding some, or none once an update has come, was not saved
    by one (loaded, the targets it leaves out would stay unpruned at its sparsity)."""
    names = [t.name for t in pruner.targets]
    missing = [name for name in names if name not in masks]
    if masks and missing:
        raise value_error(
            f"{where}: the state holds no mask for {missing}; expected the masks of every "
            f"target ({names}), as a pruner saves them once it has updated"
        )
    if not masks and (amount > 0 or steps >= pruner.timetable.start_step):
        raise value_error(
            f"{where}: the state holds no masks at step {steps} (amount {amount:g}); expected "
            f"the masks of {names}, which a pruner holds from its first update (step "
            f"{pruner.timetable.start_step}) on"
        )


def _masks(
    masks: Any, pruner: GradualPruner, shapes: list[torch.Size], where: str
) -> dict[str, Tensor]:
    if not isinstance(masks, Mapping):
        raise value_error(f"{where}: invalid masks; expected a dict of name -> mask")
    known = {t.name: shape for t, shape in zip(pruner.targets, shapes, strict=True)}
    for name, mask in masks.items():
        if name not in known:
            raise value_error(
                f"{where}: the state holds a mask for {name!r}, which this pruner does not "
                f"prune; expected masks of {list(known)}"
            )
        if not isinstance(mask, Tensor) or tuple(mask.shape) != tuple(known[name]):
            raise value_error(
                f"{where}: the mask of {name!r} has shape "
                f"{tuple(getattr(mask, 'shape', ()))}; expected {tuple(known[name])}"
            )
        check_kind(mask, where, f"the mask of {name!r}")
        check_binary_mask(mask, f"{where}: the mask of {name!r}")  # 0.5 is no 'kept'
    return {name: mask.ne(0) for name, mask in masks.items()}


def rewound_state(
    model: nn.Module, state_dict: Mapping[str, Tensor], owner: str
) -> dict[str, Tensor]:
    """`state_dict` with keys as the pruned `model` has them and its masks as they are now."""
    where = f"{owner}.rewind"
    if not isinstance(state_dict, Mapping):
        raise type_error(
            f"{where}: invalid state_dict of type {type(state_dict).__name__}; expected a "
            "mapping of names to tensors, e.g. model.state_dict() taken before training"
        )
    current = model.state_dict()
    result = dict(state_dict)
    for key in current:
        if not key.endswith("_mask"):
            continue
        base = key[: -len("_mask")]
        if base in result and base + "_orig" not in result:
            result[base + "_orig"] = result.pop(base)
        result[key] = current[key]  # the masks are never rewound
    missing = [k for k in current if k not in result]
    extra = [k for k in result if k not in current]
    if missing or extra:
        raise runtime_error(
            f"{where}: Missing key(s) {missing[:5]}, unexpected key(s) {extra[:5]} in the "
            "state_dict; expected the keys of the model's state_dict (nothing was rewound)"
        )
    for key, value in result.items():
        check_kind(value, where, f"state_dict[{key!r}]", real=not current[key].is_complex())
        if not isinstance(value, Tensor) or value.shape != current[key].shape:
            found = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise runtime_error(
                f"{where}: size mismatch for {key!r}: {found} in the state_dict, "
                f"{tuple(current[key].shape)} in the model (nothing was rewound)"
            )
    return result
