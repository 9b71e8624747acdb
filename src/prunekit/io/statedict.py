"""Pruning the tensors of a state_dict without the model's code.

Each tensor is ranked by the method's criterion and pattern (prunekit.patterns, which rank
through prunekit.select) as a plain tensor: no module, no hook. The masks are the very ones
the same methods give a model's parameters, composition and global selection included. A
tensor saved as ``<name>_orig`` + ``<name>_mask`` resumes from its mask; an error about a
tensor names it (``tensor 'fc.weight': ...``).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from prunekit.core.errors import type_error, value_error
from prunekit.core.naming import MASK, Entry, entries, mask_name, orig_name, pruned_name
from prunekit.io.atomic import same_file
from prunekit.io.files import CheckpointError, load_state_dict, save_state_dict
from prunekit.io.ranking import Ranking, ranking, saved_mask
from prunekit.whole.targets import ALL, select_names
from prunekit.whole.vocabulary import scope_from

__all__ = [
    "Entry",
    "PruneResult",
    "entries",
    "prune_file",
    "prune_state_dict",
]


@dataclass(frozen=True)
class PruneResult:
    """The new state_dict and the names of the tensors pruned in it."""

    state: dict[str, Tensor]
    pruned: list[str] = field(default_factory=list)


def prune_state_dict(
    state: Mapping[str, Tensor],
    method: str,
    amount: float,
    *,
    n: Any = None,
    dim: int | None = None,
    scope: str = "layer",
    include: Sequence[str] = ALL,
    exclude: Sequence[str] = (),
    keep_masks: bool = False,
    seed: int | None = None,
    global_pruning: bool | None = None,
) -> PruneResult:
    """Return a copy of `state` with its selected tensors pruned; `state` is not changed.

    Args:
        state: the state_dict; ``<name>_orig`` + ``<name>_mask`` pairs are pruned further.
        method: 'l1', 'random' (unstructured) or 'ln' (channels along `dim`, default 0,
            ranked by the L`n` norm, default 2).
        amount: a fraction in [0, 1] or a count (entries; channels for 'ln').
        n: 'ln' only: the norm order.
        dim: 'ln' only: the axis of the channels.
        scope: 'layer' (`amount` of each tensor) or 'global' (of all selected tensors
            together; 'l1' and 'random').
        include: globs of the tensors to prune (see prunekit.whole.targets.select_names;
            ``('*',)``: every floating-point tensor of 2 or more dims).
        exclude: globs of the tensors to leave out.
        keep_masks: save each pruned tensor as ``<name>_orig`` and ``<name>_mask``, as a
            pruned model saves it, instead of making the pruning permanent.
        seed: seeds the 'random' method (torch's generator is left as it was).
        global_pruning: the old name of ``scope='global'`` (a FutureWarning).

    Returns:
        The new state_dict and the names pruned in it.

    Raises:
        TypeError, ValueError: a bad argument, glob or tensor (nothing changed).
    """
    scope = scope_from("prune_state_dict", scope, global_pruning)
    rank = ranking(method, amount, n, dim, scope)
    found = entries(state)
    targets = set(select_names(found, include, exclude))
    _refuse_stray_masks(found, targets)
    saved = {e.name: saved_mask(e) for e in found if e.mask is not None}
    chosen = [e for e in found if e.name in targets]
    with seeded(seed, "prune_state_dict"):
        masks = rank.masks(chosen, saved, scope)
    out: dict[str, Tensor] = {}
    for e in found:
        mask = masks.get(e.name, saved.get(e.name))
        if mask is None:
            out[e.name] = e.tensor
        elif keep_masks:
            out[orig_name(e.name)] = e.tensor
            out[mask_name(e.name)] = mask
        else:
            out[e.name] = mask.to(dtype=e.tensor.dtype) * e.tensor.detach()
    return PruneResult(out, [e.name for e in chosen])


def prune_file(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    method: str,
    amount: float,
    *,
    trust_pickle: bool = False,
    **options: Any,
) -> PruneResult:
    """Load the state_dict in `path`, prune it (see prune_state_dict), write it to `out`.

    `path` is only read: `out` may not be the same file. `out` gets the whole result or,
    on any failure, stays as it was.
    """
    old = options.pop("global_pruning", None)
    scope = scope_from("prune_file", options.pop("scope", "layer"), old)
    check_method(method, amount, options.get("n"), options.get("dim"), scope)
    if same_file(path, out):
        raise CheckpointError(
            f"{out}: is the input file itself; expected another output file (the input is "
            "never changed)"
        )
    # Beside the tensors: their masks, and the pruned tensors to write.
    loaded = load_state_dict(path, trust_pickle=trust_pickle, headroom=3.0)
    result = prune_state_dict(loaded, method, amount, scope=scope, **options)
    save_state_dict(result.state, out)
    return result


def check_method(method: str, amount: float, n: Any, dim: int | None, scope: str) -> Ranking:
    """The ranking of `method` (see io.ranking.ranking), checked before anything is read.

    Raises:
        TypeError, ValueError: an unknown method, a bad amount, norm order or dim.
    """
    return ranking(method, amount, n, dim, scope)


def _refuse_stray_masks(found: Sequence[Entry], targets: Collection[str]) -> None:
    """Raise if a tensor to prune is named as a pruning mask (``<n>_mask``) with no
    ``<n>_orig`` beside it: a mask, not a weight, that pruning would corrupt."""
    for e in found:
        base = pruned_name(e.name, MASK)
        if e.name in targets and e.mask is None and base is not None:
            raise value_error(
                f"{e.name!r} is named as the mask of a pruned {base!r}, but "
                f"{orig_name(base)!r} is not beside it, so it is a mask without its "
                f"weights, not a weight to prune; expected the pair {orig_name(base)!r} "
                f"and {e.name!r}, or leave it out (exclude={e.name!r})"
            )


SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed takes


def check_seed(seed: Any, where: str, what: str = "seed") -> None:
    """Raise unless `seed` is None or an int torch.manual_seed takes; the error begins with
    `where` (if any) and calls the seed `what`.

    Raises:
        TypeError: not an int; ValueError: out of SEED_RANGE (both name `where` and `what`).
    """
    if seed is None:
        return
    low, high = SEED_RANGE
    allowed = f"expected an int in [-2**63, 2**64 - 1] = [{low}, {high}]"
    head = f"{where}: invalid {what}" if where else f"invalid {what}"
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise type_error(f"{head}={seed!r} of type {type(seed).__name__}; {allowed}")
    if not low <= seed <= high:
        raise value_error(f"{head}={seed}, out of range; {allowed}")


@contextmanager
def seeded(seed: int | None, owner: str) -> Iterator[None]:
    """Seed torch's random generator inside the block, restoring its state after; a bad
    `seed` is a ValueError naming `owner`."""
    check_seed(seed, owner)
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
