"""Saving a compacted model with its shapes, and rebuilding it from its folder alone or into
a freshly built model.

``save_compacted(model, folder)`` writes the weights (``compacted.safetensors`` where
safetensors is installed, else ``compacted.pt``) and ``compacted.json``: for every module
its class, the shape and dtype of each of its parameters and buffers, and its integer (and
tuple of integers) attributes, which fix its widths (in/out features, channels, groups,
num_features, normalized_shape, num_heads, head_dim, ...); for a module that holds an
embedding scale (a float attribute or one-element buffer named ``scalar_embed_scale`` or
``embed_scale``: Gemma's ``hidden_size ** 0.5``), its value, which a module built anew from
the narrower config would not have (compaction keeps the old one where the embedding's
weight is tied and cannot take the ratio); and the model's Hugging Face config where it has
one. ``load_compacted(folder)`` builds the model with its parameters on the meta device
(skeleton.py) and gives it those shapes, scales and the file's tensors;
``load_compacted(fresh, folder)`` gives a freshly built model of the same code those
shapes, attributes, scales and config fields. Either way the weights load strictly and
everything is checked. Per-layer widths need no config field that can hold them. A file
written before scales were saved (no ``scales``) loads as it did.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from prunekit.core.errors import value_error
from prunekit.core.transaction import transaction
from prunekit.core.unsaved import refuse_unsaved
from prunekit.io.atomic import atomic_folder, atomic_path
from prunekit.io.checkpoint import load_pruned_state_dict, refuse_meta
from prunekit.io.files import EXTRA_STATE, load_state_dict, refuse_empty_path, save_state_dict
from prunekit.structure.graph.graph import check_model
from prunekit.structure.saving.manifest import FORMAT, MANIFEST, VERSION, read_manifest
from prunekit.structure.saving.shapes import (
    Reload,
    apply_reload,
    check_widths,
    describe_module,
    same_class,
    saved_value,
    verify,
)
from prunekit.structure.saving.skeleton import Factory, build_skeleton

__all__ = ["MANIFEST", "load_compacted", "save_compacted"]


def save_compacted(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Write `model` (compacted, pruned or not) to the folder `path`, made if missing.

    The weights go to ``compacted.safetensors`` (or ``compacted.pt`` without safetensors)
    as ``model.state_dict()`` holds them (``<name>_orig`` and ``<name>_mask`` for tensors
    still masked); the shapes, width attributes, embedding scales (``scalar_embed_scale``,
    ``embed_scale``: the values the model computes with, which a model rebuilt from the
    compacted config would not have) and config to ``compacted.json``. The folder is
    written as a whole (staged beside it and swapped in; its other files kept), so a
    failure or a kill leaves the old save, loadable, or the new one.

    Weight masks are saved and come back exactly, but three masked states act through
    forward hooks that no file holds: masked experts (their router's hook keeps them out of
    the top-k), a masked hidden width (its norms' hooks normalize over the kept channels)
    and skipped blocks. Reloaded, such a model would compute something else, so it is
    refused before anything is written: compact it first (``prunekit.compact(model,
    inputs)``; ``prunekit.remove_blocks(model)`` for skipped blocks), then save it.

    Args:
        model: the model to save, compacted or with masks still on; ``load_compacted``
            rebuilds it from the saved class name, config and shapes (a Hugging Face class,
            or the factory ``register_compacted_factory`` registered), or loads into a model
            built fresh by the same code.
        path: the folder to write; made with its parents if missing, and its other files
            kept.

    Returns:
        The folder, as a ``Path``.

    Raises:
        TypeError: `model` is no torch module.
        ValueError: the model holds masked experts, a masked hidden width or skipped blocks
            (naming the routers, norms or blocks, and what to call first), a tensor on
            the meta device (no values to write), a module with extra state that is no
            tensor (``get_extra_state``: the weights file holds
            tensors only), or `path` is a file or empty (Path('') is the current folder);
            the folder and the model are left as they were.
    """
    check_model(model, "save_compacted")
    refuse_unsaved(model, "save_compacted")
    refuse_empty_path("save_compacted", "path", path)  # Path("") is ".": the current folder
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"save_compacted: path={str(path)!r} is a file; expected a folder")
    state = model.state_dict()
    refuse_meta(state, "save_compacted")
    _refuse_extra_state(model, state)
    folder.parent.mkdir(parents=True, exist_ok=True)
    weights = "compacted.safetensors" if _has_safetensors() else "compacted.pt"
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "weights": weights,
        "model": type(model).__qualname__,
        "modules": {name: describe_module(m) for name, m in model.named_modules()},
        "config": _config_dict(model),
    }
    with atomic_folder(folder) as stage:  # weights and manifest replace the old pair whole
        save_state_dict(state, stage / weights)
        with atomic_path(stage / MANIFEST) as temp, open(temp, "w", encoding="utf-8") as out:
            json.dump(manifest, out, indent=1)  # replaces the linked old file, never into it
    return folder


def _refuse_extra_state(model: nn.Module, state: dict[str, Any]) -> None:
    """Refuse a module's extra state that is no tensor: the weights file holds tensors only
    (and compacted.json none of it), so it would not come back."""
    for key, value in state.items():
        if isinstance(value, Tensor):
            continue
        path = key.rpartition(".")[0]  # the prefix of the module that wrote the entry
        module = dict(model.named_modules()).get(path)
        where = f"module {path!r}" if path else "the model"
        kind = f" ({type(module).__name__})" if module is not None else ""
        what = "extra state (get_extra_state)" if key.endswith(EXTRA_STATE) else "an entry"
        raise value_error(
            f"save_compacted: {where}{kind} holds {what} of type {type(value).__name__} "
            f"under {key!r}, which the "
            "weights file (tensors only) cannot hold; expected modules whose state is all "
            "tensors (save such a model's state_dict with prunekit.save_pruned to a .pt file)"
        )


def load_compacted(
    model: nn.Module | str | os.PathLike[str],
    path: str | os.PathLike[str] | None = None,
    *,
    factory: Factory | None = None,
) -> nn.Module:
    """Rebuild what save_compacted wrote: ``load_compacted(folder)`` alone, or into a model
    built fresh by the same code, ``load_compacted(model, folder)``.

    ``load_compacted(folder)`` builds the model itself, with its parameters on the meta
    device (no memory): by `factory` if given, else by the factory registered for the saved
    model's class (``register_compacted_factory``), else, for a Hugging Face model, by the
    transformers class of the saved model (or of its config's ``architectures``) from the
    saved config. Every module then takes its saved shapes, the file's tensors become the
    parameters (read once: memory holds the compacted weights, never the dense ones), tied
    parameters stay tied, embeddings take their saved scales, and the model is returned in
    eval mode, as ``from_pretrained`` returns one. This rebuilds what ``from_pretrained``
    cannot: heads cut while the hidden width is kept, widths that differ per layer, an
    embedding scale kept where a tied weight could not take the ratio.

    ``load_compacted(model, folder)``: every module of `model` takes the saved shapes (its
    tensors replaced by new ones of those shapes, dtypes and devices kept), attributes,
    embedding scales and config fields; `model` keeps its mode, and is left exactly as it
    was on any error.

    Either way the weights are loaded strictly (tensors saved masked are pruned to the saved
    masks) and everything is checked against the files.

    Args:
        model: the folder, or a model built fresh by the same code as the saved one.
        path: the folder, when `model` is a model.
        factory: for ``load_compacted(folder)``: a callable that gets the saved Hugging
            Face config (a transformers config object; None for a model without one) and
            returns the model, e.g. ``lambda config: BertModel(config,
            add_pooling_layer=False)`` or ``lambda config: Net()``.

    Returns:
        The loaded model: `model`, or the one built.

    Raises:
        FileNotFoundError: the folder lacks compacted.json or the weights it names.
        ValueError: the files disagree (a tensor's shape or dtype, a width attribute that
            contradicts the tensors), a saved embedding scale is not a finite float or is
            one the model's module does not hold, the model differs from the saved one, or
            no factory can build it (no config and none given, a class transformers lacks);
            each error names the file, the module, the key and the values.
        TypeError: bad arguments (both a folder and `path`, a `factory` with a model).
    """
    if isinstance(model, nn.Module):
        return _load_into(model, _path_beside(path, factory))
    _check_folder_call(model, path, factory)
    return _load_built(Path(model), factory)


def _path_beside(path: str | os.PathLike[str] | None, factory: Factory | None) -> Path:
    """The folder of ``load_compacted(model, folder)``, which takes no factory."""
    if path is None or factory is not None:
        raise TypeError(
            f"load_compacted: got a model with path={path!r} and factory={factory!r}; "
            "expected load_compacted(model, folder) or load_compacted(folder, factory=...)"
        )
    return Path(path)


def _check_folder_call(model: object, path: object, factory: object) -> None:
    """Refuse a ``load_compacted(folder)`` with a `path` too, or a factory no callable."""
    if not isinstance(model, str | os.PathLike) or path is not None:
        raise TypeError(
            f"load_compacted: invalid arguments ({type(model).__name__}, path={path!r}); "
            "expected load_compacted(folder) or load_compacted(model, folder)"
        )
    if factory is not None and not callable(factory):
        raise TypeError(
            f"load_compacted: invalid factory={factory!r}; expected a callable config -> model"
        )


def _load_into(model: nn.Module, folder: Path) -> nn.Module:
    check_model(model, "load_compacted")
    manifest = read_manifest(folder)
    _check_attributes(model, manifest["modules"], folder / MANIFEST)
    state = load_state_dict(folder / _weights_name(folder, manifest))
    reload = Reload.plan(model, manifest["modules"], state, manifest.get("config"), str(folder))
    with transaction(model, state=reload.configs()):
        apply_reload(model, reload)
        check_widths(model, reload, str(folder))
        load_pruned_state_dict(model, state, strict=True)
        verify(model, reload, state)
    return model


def _load_built(folder: Path, factory: Factory | None) -> nn.Module:
    """Build the skeleton, give it the saved shapes and the file's tensors; nothing built
    is returned unless all of it checked."""
    manifest = read_manifest(folder)
    weights = folder / _weights_name(folder, manifest)
    model = build_skeleton(manifest, folder / MANIFEST, factory)
    _check_attributes(model, manifest["modules"], folder / MANIFEST)
    state = load_state_dict(weights)
    reload = Reload.plan(model, manifest["modules"], state, manifest.get("config"), str(folder))
    # a factory may return a model that exists elsewhere: a failure leaves it as it was
    with transaction(model, state=reload.configs()):
        apply_reload(model, reload, source=state)
        check_widths(model, reload, str(folder))
        load_pruned_state_dict(model, state, strict=True)
        verify(model, reload, state)
        left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if left:
            raise RuntimeError(f"load_compacted: {left[:5]} were left on the meta device")
    config = getattr(model, "config", None)
    if isinstance(getattr(config, "_name_or_path", None), str):
        config._name_or_path = str(folder)  # type: ignore[union-attr]  # as from_pretrained
    return model.eval()


def _has_safetensors() -> bool:
    return importlib.util.find_spec("safetensors") is not None


def _config_dict(model: nn.Module) -> dict[str, Any] | None:
    """The model's Hugging Face config as a JSON-ready dict (None for other models)."""
    config = getattr(model, "config", None)
    to_json = getattr(config, "to_json_string", None)
    if not callable(to_json):
        return None
    found: dict[str, Any] = json.loads(to_json(use_diff=False))
    return found


def _check_attributes(model: nn.Module, modules: dict[str, Any], where: Path) -> None:
    """Only attributes save_compacted writes: ones the fresh module has, holding an int or
    ints of the same form as the saved value, or a norm's float epsilon (never a method,
    flag or private)."""
    fresh = dict(model.named_modules())
    for path, entry in modules.items():
        module = fresh.get(path)
        if module is None or not same_class(entry["type"], module):
            continue  # Reload.plan names the modules and classes that differ
        for name, saved in entry["attributes"].items():
            held = vars(module).get(name)
            now = saved_value(name, held) if not name.startswith("_") else None
            if now is None or not _same_form(now, saved):
                kind = type(vars(module).get(name, getattr(module, name, None))).__name__
                raise ValueError(
                    f"load_compacted: {where}: module {path!r} sets {name}={saved!r}, but "
                    f"{type(module).__name__}.{name} is a {kind}; expected only width "
                    "attributes (ints, or lists or tuples of ints) the module has, or a "
                    "norm's float epsilon"
                )


def _same_form(now: Any, saved: Any) -> bool:
    """Whether two encoded values are both ints, both lists or both tuples of ints, or both
    floats (a norm's epsilon)."""
    if isinstance(now, float):
        return type(saved) is float
    if isinstance(now, int):
        return isinstance(saved, int) and not isinstance(saved, bool)
    if isinstance(now, dict):
        return isinstance(saved, dict) and set(saved) == {"tuple"} and _ints(saved["tuple"])
    return _ints(saved)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


def _weights_name(folder: Path, manifest: dict[str, Any]) -> str:
    name = manifest.get("weights")
    if name not in ("compacted.safetensors", "compacted.pt") or not (folder / name).is_file():
        raise FileNotFoundError(
            f"load_compacted: the weights {name!r} named in {folder / MANIFEST} are not in "
            f"{folder}; expected the files save_compacted wrote together"
        )
    return str(name)
