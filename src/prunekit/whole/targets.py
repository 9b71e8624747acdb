"""The one target selector: which tensors of a model (or of a state_dict) a whole-model call
prunes, by name.

``select_names`` picks names from listed tensors with include/exclude globs (a state_dict's
entries, a model's parameters); ``select_targets`` walks a model with names and returns the
parameters those globs select, each once, where it has to be pruned: a MultiheadAttention's
out_proj through the attention module (which reads it without calling it), a tied parameter
(one Parameter under several names) ranked under its first name and masked under the others.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from torch import Tensor, nn

from prunekit.core.backend import is_module
from prunekit.core.errors import type_error, value_error, warn_caller
from prunekit.core.naming import ORIG, Entry, mask_name, pruned_name, stored_parameter

__all__ = [
    "ALL",
    "RANKABLE",
    "Place",
    "Target",
    "TargetOptions",
    "globs",
    "matches",
    "output_heads",
    "select_names",
    "select_targets",
    "tied_in_part",
    "unpruned_name",
]


class TargetOptions(TypedDict, total=False):
    """The keywords every whole-model entry point takes to choose its tensors (the shared
    part of io.options.Options and schedule.settings.GradualOptions).

    Attributes:
        scope: 'layer' (each tensor) or 'global' (the selected tensors ranked together).
        include: globs of the tensors to prune.
        exclude: globs of the tensors to leave out.
    """

    scope: str
    include: Sequence[str] | str
    exclude: Sequence[str] | str


ALL = ("*",)
"""The default `include`: every tensor the method prunes (the same as no include)."""

RANKABLE = ("float16", "bfloat16", "float32", "float64")  # dtypes the methods rank


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
        return self.holder._buffers.get(mask_name(self.own))

    def parameter(self) -> nn.Parameter:
        """The Parameter: ``<own>_orig`` when pruned."""
        found = stored_parameter(self.holder, self.own)
        assert found is not None, f"{type(self.holder).__name__} has no parameter {self.own}"
        return found


@dataclass(frozen=True)
class Target:
    """One parameter to prune: its name in the model and its places, the first one ranked,
    the others (tied names) masked alike. `aliases`: its other names through a module
    shared under several paths (one place, several names)."""

    name: str
    places: tuple[Place, ...]
    aliases: tuple[str, ...] = ()

    @property
    def first(self) -> Place:
        return self.places[0]

    @property
    def ties(self) -> tuple[Place, ...]:
        """The places of its tied names, masked like the first."""
        return self.places[1:]


def globs(value: Any, what: str, owner: str) -> tuple[str, ...]:
    """`value` (`include` or `exclude`, as `what`) as a tuple of globs; a str is one glob.

    Raises:
        TypeError: naming `owner`, `what` and the value, unless a str or str sequence.
    """
    if isinstance(value, str):
        return (value,)
    # Read once: an iterator checked and then copied would be empty by the copy.
    found = tuple(value) if isinstance(value, Iterable) else None
    if found is None or not all(isinstance(p, str) for p in found):
        shown = value if found is None else list(found)
        raise type_error(
            f"{owner}: invalid {what}={shown!r}; expected globs of parameter names "
            "(a str or a sequence of str), e.g. ('encoder.*',)"
        )
    return found


def select_names(
    found: Sequence[Entry],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    targets: Collection[str] | None = None,
    where: tuple[str, str] = ("", ""),
) -> list[str]:
    """Names of the floating-point tensors to prune, in order.

    `targets` are the names the method prunes when nothing is named (default: the
    tensors of 2 or more dims: weights, not biases or norms). An `include` or `exclude`
    pattern is a glob of tensor names or of module names (a module holds the tensors
    under its name; a name also matches as the last part of a longer one, as PEFT's
    ``target_modules``: ``'q_proj'`` matches ``'layers.0.attn.q_proj'``). `include`
    narrows `targets` to those it matches (``('*',)``, like ``()``, takes them all); a
    tensor outside them (a norm, a bias) is selected when `include` gives its exact name. A
    glob that matches none of `targets` but other tensors by name selects those, as
    before, with a FutureWarning. Tensors matching an `exclude` pattern are left out.
    `where`: what the errors begin and end with (the caller, the model).

    Raises:
        ValueError: a pattern that matches nothing, a selected tensor of a dtype that
            cannot be ranked, or nothing left to prune.
    """
    head, tail = where
    include = () if tuple(include) == ALL else include
    floats = [e for e in found if e.tensor.is_floating_point()]
    named = {e.name for e in floats if e.tensor.dim() >= 2} if targets is None else set(targets)
    matched = _Matched([e.name for e in floats])
    for pattern in [*include, *exclude]:
        if not matched(pattern):
            raise value_error(
                f"{head}the pattern {pattern!r} matches no floating-point tensor; "
                f"tensors: {_listing([e.name for e in floats])}{tail}"
            )
    if include:
        picked = {e.name for e in floats if e.name in include}
        for pattern in include:
            picked |= _included(floats, named, pattern, matched(pattern), where)
        chosen = [e for e in floats if e.name in picked]
    else:
        chosen = [e for e in floats if e.name in named]
    left_out = set().union(*(matched(p) for p in exclude))
    chosen = [e for e in chosen if e.name not in left_out]
    for e in chosen:
        dtype = str(e.tensor.dtype).rpartition(".")[2]
        if dtype not in RANKABLE:
            raise value_error(
                f"{head}tensor {e.name!r} has dtype {dtype}, which cannot be ranked; expected "
                f"{', '.join(RANKABLE)} (leave it out with exclude {e.name!r}){tail}"
            )
    names = [e.name for e in chosen]
    if not names:
        raise value_error(
            f"{head}no tensor left to prune after include/exclude; "
            f"tensors: {_listing([e.name for e in floats])}{tail}"
        )
    return names


def matches(name: str, pattern: str) -> bool:
    """Whether `pattern` names the tensor `name`: a glob of its whole name, or of a module
    holding it (a dotted prefix of the name), whole or as its last part(s)."""
    if fnmatch.fnmatchcase(name, pattern):
        return True
    parts = name.split(".")[:-1]
    tail = "*." + pattern
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        if fnmatch.fnmatchcase(prefix, pattern) or fnmatch.fnmatchcase(prefix, tail):
            return True
    return False


class _Matched:
    """The names `matches` finds for a pattern, among `names`: a pattern with no glob
    character is looked up in an index of what each name answers to (its whole name, and
    every run of consecutive parts of its module path), not tried name by name
    (a model's hundreds of exact names against its hundreds of tensors)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        self.index: dict[str, set[str]] | None = None
        self.found: dict[str, set[str]] = {}

    def __call__(self, pattern: str) -> set[str]:
        known = self.found.get(pattern)
        if known is not None:
            return known
        if any(c in pattern for c in "*?["):
            known = {name for name in self.names if matches(name, pattern)}
        else:
            known = self._literal().get(pattern, set())
        self.found[pattern] = known
        return known

    def _literal(self) -> dict[str, set[str]]:
        if self.index is None:
            self.index = {}
            for name in self.names:
                parts = name.split(".")[:-1]
                keys = {name}
                for stop in range(1, len(parts) + 1):
                    keys.update(".".join(parts[start:stop]) for start in range(stop))
                for key in keys:
                    self.index.setdefault(key, set()).add(name)
        return self.index


def _included(
    floats: Sequence[Entry],
    targets: set[str],
    pattern: str,
    matched: set[str],
    where: tuple[str, str],
) -> set[str]:
    """The names one `include` pattern selects (its exact name aside); `matched`: the
    names it matches."""
    found = {name for name in matched if name in targets}
    if found or any(e.name == pattern for e in floats):
        return found
    # Before, a glob selected any tensor by name: kept for one that names no target.
    before = [e.name for e in floats if fnmatch.fnmatchcase(e.name, pattern)]
    if not before:
        others = [e.name for e in floats if e.name in matched]
        raise value_error(
            f"{where[0]}the pattern {pattern!r} selects no weight the method prunes, only "
            f"{_listing(others)}; a tensor outside its weights (a norm, a bias) is pruned "
            f"when named exactly, e.g. {others[0]!r}{where[1]}"
        )
    warn_caller(
        f"include {pattern!r} matches none of the weights the method prunes and selects "
        f"{_listing(before)} by name, as before; in a future version a glob will only narrow "
        "the method's weights: give these tensors' exact names to keep pruning them",
        FutureWarning,
    )
    return set(before)


def _listing(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "") or "(none)"


@dataclass
class _Found:
    """A parameter met while walking the model: where it is installed, its other names."""

    name: str
    place: Place
    ties: list[tuple[Place, str]] = field(default_factory=list)  # (place, name)
    aliases: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return [self.name, *self.aliases, *(name for _, name in self.ties)]

    def target(self) -> Target:
        places = (self.place, *(p for p, _ in self.ties))
        return Target(self.name, places, tuple(self.aliases))


def select_targets(
    model: Any,
    include: Any,
    exclude: Any,
    owner: str,
    natural: Callable[[Place], bool] | None = None,
) -> list[Target]:
    """The parameters of `model` that `include` and not `exclude` select (see
    select_names), in the model's order, each once, with its other names.

    `natural` tells the method's own targets by their place, those `include` globs narrow
    (default: the floating-point tensors of two or more dims). The globs see every name;
    a tied parameter must be selected under all its names or none. Errors begin with
    `owner`.

    Raises:
        TypeError: `model` is not a module; `include`/`exclude` are not globs.
        ValueError: as select_names, or globs that select a tied parameter by some of its
            names only, or exclude a module shared under several paths by some of its names
            only.
    """
    if not is_module(model):
        raise type_error(
            f"{owner}: invalid model of type {type(model).__name__}; "
            "expected an nn.Module of torch or tensorplay"
        )
    includes, excludes = globs(include, "include", owner), globs(exclude, "exclude", owner)
    found, listed = _walk(model)
    named = None
    if natural is not None:
        named = [name for f in found if natural(f.place) for name in f.names()]
    where = (f"{owner}: ", f" (in {type(model).__name__})")
    chosen = set(select_names(listed, includes, excludes, named, where))
    selected = []
    for f in found:
        # A shared module is one module under several paths: any of its names selects it,
        # but one left out by exclude under some of its names only would be pruned under
        # the others (its every use with it): refused, as a tie is.
        paths = [f.name, *f.aliases]
        own = any(name in chosen for name in paths)
        left = [n for n in paths if any(matches(n, p) for p in excludes)]
        if own and left:
            kept = [n for n in paths if n not in left]
            raise tied_in_part(paths, kept, owner, "one Parameter of a module shared by paths")
        names = [f.name, *(name for _, name in f.ties)]
        hits = [own, *(name in chosen for _, name in f.ties)]
        if all(hits):
            selected.append(f.target())
        elif any(hits):
            picked = [n for n, hit in zip(names, hits, strict=True) if hit]
            raise tied_in_part(names, picked, owner, "one Parameter")
    return selected


def tied_in_part(names: Sequence[str], picked: Sequence[str], owner: str, what: str) -> ValueError:
    """The error for globs that select a tied tensor by some of its `names` only (`picked`):
    pruned under those, kept under the rest, its names would no longer hold one tensor.

    Args:
        names: every name of the tensor.
        picked: those include/exclude select.
        owner: the entry point the error names.
        what: what the names hold ('one Parameter', 'one tensor').

    Returns:
        The ValueError to raise, naming `owner`, every name and those selected.
    """
    return value_error(
        f"{owner}: {', '.join(map(repr, names))} are {what} (tied), but include/exclude "
        f"select only {list(picked)}; expected globs that select all of its names or none"
    )


def _walk(model: Any) -> tuple[list[_Found], list[Entry]]:
    """Every parameter of `model` once (with its tied names and aliases), and every name
    with its tensor."""
    found: dict[int, _Found] = {}
    listed: list[Entry] = []
    for path, module in model.named_modules(remove_duplicate=False):
        for pname, param in module._parameters.items():
            if param is None:
                continue
            leaf = unpruned_name(module, pname)
            name = f"{path}.{leaf}" if path else leaf
            first = found.get(id(param))
            if first is None:
                found[id(param)] = _Found(name, _locate(model, path, module, leaf))
            elif any(p.holder is module and p.own == leaf for p in first.target().places):
                first.aliases.append(name)  # a shared module, seen again under another path
            else:
                first.ties.append((Place(module, leaf, module, leaf), name))
            listed.append(Entry(name, param))
    return list(found.values()), listed


def unpruned_name(module: nn.Module, pname: str) -> str:
    """A parameter's name as the model sees it: ``weight`` for a pruned ``weight_orig``."""
    base = pruned_name(pname, ORIG)
    if base is not None and mask_name(base) in module._buffers:
        return base
    return pname


def _locate(model: nn.Module, path: str, module: nn.Module, leaf: str) -> Place:
    """Where to install the pruning of ``module.<leaf>``: on the module itself, or, for a
    MultiheadAttention's out_proj, on the attention module with a dotted name."""
    parent_path, _, child = path.rpartition(".")
    if child == "out_proj" and path:
        parent = model.get_submodule(parent_path)
        if _reads_out_proj(parent) and parent._modules.get("out_proj") is module:
            return Place(parent, f"out_proj.{leaf}", module, leaf)
    return Place(module, leaf, module, leaf)


def _reads_out_proj(module: nn.Module) -> bool:
    return any(cls.__name__ == "MultiheadAttention" for cls in type(module).__mro__)


def output_heads(model: nn.Module) -> list[nn.Module]:
    """The output layer(s) users keep dense: the model's ``get_output_embeddings()`` (as
    Hugging Face models name their head), and Linears sharing an embedding's weight."""
    heads: list[nn.Module] = []
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        found = getter()
        if isinstance(found, nn.Module):
            heads.append(found)
    embedded = {
        id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding | nn.EmbeddingBag)
    }
    heads += [m for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) in embedded]
    return heads
