"""Which tensors of a model a GradualPruner prunes: prune_model's selection by name.

The selection is prune_model's (``include=("*",)`` takes every floating-point parameter
of two or more dims, any other `include` selects by name, any number of dims; `exclude`
leaves names out; a MultiheadAttention's out_proj is pruned through the attention module;
a tied parameter is ranked once and masked under each of its names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from prunekit import model as whole_model

__all__ = ["Place", "Target", "select_targets"]


@dataclass(frozen=True)
class Place:
    """Where one name of a parameter is masked: installed as ``module.<leaf>`` (a dotted
    leaf for an attention's out_proj), held as ``holder.<own>``."""

    module: nn.Module
    leaf: str
    holder: nn.Module
    own: str

    def mask(self) -> Tensor | None:
        """The mask installed here (None: not pruned)."""
        return self.holder._buffers.get(self.own + "_mask")

    def parameter(self) -> nn.Parameter:
        """The Parameter: ``<own>_orig`` when pruned."""
        found = self.holder._parameters.get(self.own + "_orig")
        if found is None:
            found = self.holder._parameters[self.own]
        assert found is not None
        return found


@dataclass(frozen=True)
class Target:
    """One parameter to prune: its name in the model and its places, the first one ranked,
    the others (tied names) masked alike."""

    name: str
    places: tuple[Place, ...]

    @property
    def first(self) -> Place:
        return self.places[0]


def select_targets(model: nn.Module, include: Any, exclude: Any, owner: str) -> list[Target]:
    """The parameters of `model` that `include` and not `exclude` select, in model order."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"{owner}: invalid model of type {type(model).__name__}; expected a torch nn.Module"
        )
    try:
        found = whole_model._targets(
            model,
            whole_model._patterns(include, "include"),
            whole_model._patterns(exclude, "exclude"),
        )
    except (TypeError, ValueError) as error:
        text = str(error).removeprefix("prune_model: ")
        raise type(error)(f"{owner}: {text}") from None
    targets = []
    for t in found:
        own = t.leaf.rpartition(".")[2]
        places = [Place(t.module, t.leaf, t.holder, own)]
        places += [Place(holder, leaf, holder, leaf) for holder, leaf, _ in t.ties]
        targets.append(Target(t.name, tuple(places)))
    return targets
