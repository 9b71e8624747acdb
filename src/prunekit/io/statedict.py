"""Pruning the tensors of a state_dict without the model's code.

Each tensor is ranked by the method's criterion and pattern (prunekit.patterns, which rank
through prunekit.select) as a plain tensor: no module, no hook. The masks are the very ones
the same methods give a model's parameters, composition and global selection included; a
tensor saved under several names (tied) is ranked once and every name gets its mask. A
tensor saved as ``<name>_orig`` + ``<name>_mask`` resumes from its mask; an error about a
tensor names it (``tensor 'fc.weight': ...``).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from prunekit.core.checks import check_seed
from prunekit.core.errors import value_error
from prunekit.core.naming import MASK, Entry, entries, mask_name, orig_name, pruned_name
from prunekit.io.atomic import same_file
from prunekit.io.files import (
    CheckpointError,
    load_state_dict,
    refuse_empty_path,
    save_state_dict,
)
from prunekit.io.options import Options, Unpack, config_of
from prunekit.io.ranking import ranking, saved_mask
from prunekit.whole.config import Config
from prunekit.whole.targets import select_names, tied_in_part

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
    *args: str | float,
    config: Config | None = None,
    keep_masks: bool = False,
    seed: int | None = None,
    **options: Unpack[Options],
) -> PruneResult:
    """Return a copy of `state` with its selected tensors pruned; `state` is not changed.

    ``prune_state_dict(state, 0.5, method="l1", scope="global")`` or, the same,
    ``prune_state_dict(state, config=Config(method="l1", amount=0.5, scope="global"))``.

    Args:
        state: the state_dict; ``<name>_orig`` + ``<name>_mask`` pairs are pruned further.
        *args: the amount: a fraction in [0, 1] or a count (entries; channels for 'ln').
            The old order, the method before it (``state, 'l1', 0.5``), still works, with
            a FutureWarning.
        config: every argument of the pruning in one prunekit.whole.Config, instead of
            the amount and `options` (its method one of 'l1', 'random', 'ln'; its pattern
            'unstructured').
        keep_masks: save each pruned tensor as ``<name>_orig`` and ``<name>_mask``, as a
            pruned model saves it, instead of making the pruning permanent.
        seed: seeds the 'random' method (torch's generator is left as it was).
        **options: the fields of the Config, by keyword (see io.options.Options):
            `method` ('l1' by default, 'random', or 'ln': channels along `dim`, default
            0, ranked by the L`n` norm, default 2), `amount`, `n`, `dim`, `scope` ('layer':
            `amount` of each tensor; 'global': of all selected tensors together, 'l1' and
            'random'), `include` (globs of the tensors to prune, see
            prunekit.whole.targets.select_names; ``('*',)``: every floating-point tensor
            of 2 or more dims), `exclude` (globs of the tensors to leave out), and
            `global_pruning` (the old name of ``scope='global'``, a FutureWarning).

    Returns:
        The new state_dict and the names pruned in it.

    Raises:
        TypeError, ValueError: a bad argument, glob or tensor, or globs that select a tied
            tensor (one tensor under several names) by some of its names only (nothing
            changed).
    """
    return prune_config(state, config_of(OWNER, args, config, options), keep_masks, seed)


OWNER = "prune_state_dict"


def prune_config(
    state: Mapping[str, Tensor],
    config: Config,
    keep_masks: bool = False,
    seed: int | None = None,
) -> PruneResult:
    """prune_state_dict's work, on a checked Config (see prune_state_dict).

    Args:
        state: the state_dict (not changed).
        config: what to prune, and how.
        keep_masks: save each pruned tensor as ``<name>_orig`` and ``<name>_mask``.
        seed: seeds the 'random' method (None: torch's generator as it is).

    Returns:
        The new state_dict and the names pruned in it.

    Raises:
        TypeError, ValueError: a method or pattern a state_dict cannot take, a bad glob
            or tensor, globs that select a tied tensor by some of its names only.
    """
    rank = ranking(config)
    found = entries(state)
    targets = set(select_names(found, config.include, config.exclude))
    _refuse_stray_masks(found, targets)
    saved = {e.name: saved_mask(e) for e in found if e.mask is not None}
    _refuse_ties_in_part(found, saved, targets, config.owner)
    chosen = [e for e in found if e.name in targets]
    first = tied_names(chosen, saved)
    with seeded(seed, OWNER):
        masks = rank.masks([e for e in chosen if first[e.name] == e.name], saved, config.scope)
    masks.update({name: masks[of] for name, of in first.items() if name != of})
    out: dict[str, Tensor] = {}
    made: dict[str, Tensor] = {}  # a tied tensor's pruned values, by its first name
    for e in found:
        mask = masks.get(e.name, saved.get(e.name))
        if mask is None:
            out[e.name] = e.tensor
        elif keep_masks:
            out[orig_name(e.name)] = e.tensor
            out[mask_name(e.name)] = mask
        else:
            of = first.get(e.name, e.name)
            if of not in made:
                made[of] = mask.to(dtype=e.tensor.dtype) * e.tensor.detach()
            out[e.name] = made[of]
    return PruneResult(out, [e.name for e in chosen])


def tied_names(chosen: Sequence[Entry], saved: Mapping[str, Tensor]) -> dict[str, str]:
    """The first name of each of `chosen` among the names holding the same tensor (one
    storage, offset, shape, strides and dtype: a tied Parameter saved under each of its
    names, as torch.save keeps it) with the same saved mask, or its own name.

    The tensor is ranked once, under its first name, and that mask is every name's: a
    random draw made once, its entries counted once in a global count, as prune_model
    masks a tied Parameter.
    """
    first: dict[str, str] = {}
    seen: dict[tuple[object, ...], list[Entry]] = {}
    for e in chosen:
        first[e.name] = e.name
        t = e.tensor
        if t.numel() == 0 or t.device.type == "meta":  # no storage to share
            continue
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.shape,
               t.stride(), t.dtype)  # fmt: skip
        mask = saved.get(e.name)
        for other in seen.setdefault(key, []):
            theirs = saved.get(other.name)
            alike = (
                theirs is None if mask is None else theirs is not None and torch.equal(mask, theirs)
            )
            if alike:
                first[e.name] = other.name
                break
        else:
            seen[key].append(e)
    return first


def _refuse_ties_in_part(
    found: Sequence[Entry], saved: Mapping[str, Tensor], targets: Collection[str], owner: str
) -> None:
    """Raise if include/exclude select a tied tensor (see tied_names) by some of its names
    only: pruned under those and kept under the others, its names would hold two tensors
    (as prune_model refuses a tied Parameter selected by some of its names)."""
    names: dict[str, list[str]] = {}
    for name, first in tied_names(found, saved).items():
        names.setdefault(first, []).append(name)
    for tied in names.values():
        picked = [name for name in tied if name in targets]
        if picked and len(picked) < len(tied):
            raise tied_in_part(tied, picked, owner, "one tensor")


def prune_file(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *args: str | float,
    config: Config | None = None,
    trust_pickle: bool = False,
    keep_masks: bool = False,
    seed: int | None = None,
    **options: Unpack[Options],
) -> PruneResult:
    """Load the state_dict in `path`, prune it (see prune_state_dict), write it to `out`.

    Args:
        path: the file to read (a PyTorch state_dict file or .safetensors); only read.
        out: the file to write (.safetensors by its suffix, else torch.save); not `path`.
            It gets the whole result or, on any failure, stays as it was.
        *args: the amount (the old order, the method before it, with a FutureWarning).
        config: every argument of the pruning in one prunekit.whole.Config, instead of
            the amount and `options`.
        trust_pickle: allow a PyTorch file holding pickled objects (loading runs code
            from the file).
        keep_masks: write ``<name>_orig`` and ``<name>_mask`` (see prune_state_dict).
        seed: seeds the 'random' method.
        **options: the fields of the Config by keyword, as prune_state_dict takes them.

    Returns:
        The new state_dict and the names pruned in it.

    Raises:
        TypeError, ValueError: a bad argument, glob or tensor, or globs that select a tied
            tensor by some of its names only; CheckpointError: `out` is
            `path`, or a file that cannot be read or written (`out` left as it was).
    """
    refuse_empty_path("prune_file", "out", out)  # Path("") is ".": the current folder
    checked = config_of("prune_file", args, config, options)
    ranking(checked)  # before anything is read
    if same_file(path, out):
        raise CheckpointError(
            f"{out}: is the input file itself; expected another output file (the input is "
            "never changed)"
        )
    # Beside the tensors: their masks, and the pruned tensors to write.
    loaded = load_state_dict(path, trust_pickle=trust_pickle, headroom=3.0)
    result = prune_config(loaded, checked, keep_masks, seed)
    save_state_dict(result.state, out)
    return result


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
