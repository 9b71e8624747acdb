"""Models built without their weights: the skeleton ``load_compacted(folder)`` fills.

A skeleton is built by the model's own code with every parameter on the meta device (no
memory, no values); buffers are made as the code makes them, so the ones a save does not
hold (rotary frequencies, position ids, causal masks) keep their computed values. The code
comes from a factory passed to load_compacted, else one registered for the saved model's
class, else (for a Hugging Face model) the transformers class its config names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunekit.structure.saving.hfbuild import building_config, transformers_factory

__all__ = ["FACTORIES", "Factory", "build_skeleton", "empty_parameters", "register_factory"]

Factory = Callable[[Any], nn.Module]
"""Builds a model's structure from its saved Hugging Face config (None when it has none)."""

FACTORIES: dict[str, Factory] = {}
"""Registered factories, by the full name of the model class they build."""

_LOCK = threading.RLock()  # a factory may load another model
_META = torch.device("meta")


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_factory(model_class: type[nn.Module], factory: Factory) -> None:
    """Make ``load_compacted(folder)`` build models saved as `model_class` with `factory`.

    Args:
        model_class: the class of the saved model (an ``nn.Module`` subclass).
        factory: called with the saved Hugging Face config (a transformers config object,
            or None for a model without one) under a context that puts parameters on the
            meta device; returns the model, built by the same code as the saved one.

    Raises:
        TypeError: `model_class` is not an nn.Module subclass or `factory` is not callable.
    """
    if not isinstance(model_class, type) or not issubclass(model_class, nn.Module):
        shown = model_class if isinstance(model_class, type) else type(model_class).__name__
        raise TypeError(
            f"register_compacted_factory: invalid model_class of type {shown}; expected an "
            "nn.Module subclass (the class of the saved model, not an instance)"
        )
    if not callable(factory):
        raise TypeError(
            f"register_compacted_factory: invalid factory={factory!r}; expected a callable "
            "config -> model"
        )
    FACTORIES[class_name(model_class)] = factory


@contextmanager
def empty_parameters() -> Iterator[None]:
    """Within the block, every parameter a module registers (in this thread) is moved to
    the meta device; buffers stay where they are made. The modules' own initialisation then
    runs on meta tensors, at no cost."""
    owner = threading.get_ident()
    with _LOCK:
        original = nn.Module.register_parameter

        def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
            if param is not None and threading.get_ident() == owner and param.device != _META:
                param = nn.Parameter(param.to(_META), requires_grad=param.requires_grad)
            original(self, name, param)

        nn.Module.register_parameter = register  # type: ignore[method-assign]
        try:
            yield
        finally:
            nn.Module.register_parameter = original  # type: ignore[method-assign]


def build_skeleton(manifest: Mapping[str, Any], where: Path, factory: Factory | None) -> nn.Module:
    """The saved model's skeleton: built by `factory`, a registered one or transformers.

    Raises ValueError (naming `where`, the manifest) when none can build it.
    """
    saved = manifest.get("config")
    root = manifest["modules"].get("", {}).get("type", "?")
    if factory is None:
        factory = FACTORIES.get(root)
    if factory is None:
        if saved is None:
            raise ValueError(
                f"load_compacted: {where} holds no Hugging Face config (the model is a "
                f"{root}); expected load_compacted(folder, factory=lambda config: Model()), "
                "prunekit.register_compacted_factory(Model, factory) first, or "
                "load_compacted(model, folder) with a freshly built model"
            )
        factory = transformers_factory(root, saved, where)
    config = None
    if saved is not None:
        config = building_config(manifest, where)
    with empty_parameters():  # an error of the model's own code propagates as it is
        model = factory(config)
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"load_compacted: the factory returned a {type(model).__name__} for {where.parent}; "
            "expected an nn.Module"
        )
    return model
