"""The one registry of pruning methods by name: what ``method='l1'``, ``'wanda'``, ... mean
to every whole-model entry point (prune_model, GradualPruner, prune_state_dict,
prune_sharded, the command line), which of them learn from calibration data, and the
scopes they rank in.

The group criteria of ``prune_channels`` ('l2', 'bn_scale', 'activation', ...) rank units of
channel groups, not entries, and are named in ``prunekit.structure``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prunekit.core.errors import value_error
from prunekit.criteria import Criterion, Magnitude, Random
from prunekit.dropin.torch_methods import L1Unstructured, LnStructured, Pruning, RandomUnstructured

__all__ = [
    "ALIASES",
    "BLOCKWISE",
    "CALIBRATED",
    "METHODS",
    "OFFLINE",
    "SCOPES",
    "Method",
    "check_calibration_options",
    "check_method_scope",
    "check_scope",
    "check_settings",
    "default_pattern",
    "default_sequential",
    "find",
    "names",
]

SCOPES = ("layer", "global")
"""'layer': `amount` of each tensor (or group); 'global': of all of them ranked together."""


@dataclass(frozen=True)
class Method:
    """One pruning method by name.

    Attributes:
        name: the name every entry point takes.
        summary: what it prunes, in a few words (help texts).
        calibrated: whether it learns from calibration batches (the one-shot engine).
        pruning: the torch-named method class that applies it to one tensor without data
            (None for the calibrated methods): what a state_dict is pruned with.
        criterion: the per-entry criterion it ranks with (None: the method ranks its own
            way, as 'ln' by channel norms and the calibrated ones from statistics).
        scopes: the scopes it ranks in.
        settings: the ``whole.Config`` fields only this method reads (SparseGPT's `damp`
            and `blocksize`); Config refuses them given for any other method.
    """

    name: str
    summary: str
    calibrated: bool = False
    pruning: type[Pruning] | None = None
    criterion: Callable[[], Criterion] | None = None
    scopes: tuple[str, ...] = SCOPES
    settings: tuple[str, ...] = ()


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("l1", "smallest |value|", pruning=L1Unstructured, criterion=Magnitude),
        Method("random", "uniformly at random", pruning=RandomUnstructured, criterion=Random),
        Method(
            "ln", "whole output channels by their L-n norm", pruning=LnStructured, scopes=("layer",)
        ),
        Method("wanda", "|W| x the input norm of each feature", calibrated=True),
        Method(
            "sparsegpt",
            "OBS with updates of the weights kept",
            calibrated=True,
            settings=("damp", "blocksize"),
        ),
        Method("taylor", "|W x grad| of a loss over the batches", calibrated=True),
    )
}
"""Every method by name, in the order help texts list them."""

ALIASES = {"magnitude": "l1"}
"""Other names a method is known by (GradualPruner's 'magnitude')."""

CALIBRATED = tuple(name for name, m in METHODS.items() if m.calibrated)
"""The methods that learn from calibration batches."""

BLOCKWISE = tuple(name for name in CALIBRATED if name != "taylor")
"""The calibrated methods that can calibrate block by block (which `sequential` chooses):
Taylor's gradients come from backward passes of the whole model."""

OFFLINE = tuple(name for name, m in METHODS.items() if m.pruning is not None)
"""The methods that prune a tensor from its values alone: all a state_dict can take."""


def names(among: Iterable[str] | None = None, *, aliases: bool = False) -> tuple[str, ...]:
    """The method names `among` (default: all), each followed by its aliases if `aliases`."""
    chosen = tuple(METHODS) if among is None else tuple(among)
    if not aliases:
        return chosen
    return tuple(
        n for name in chosen for n in (name, *(a for a, of in ALIASES.items() if of == name))
    )


def find(name: object, among: Iterable[str] | None = None) -> Method | None:
    """The method `name` (or an alias of it) names, if it is one of `among` (default:
    all); else None. The caller words the error (see check_method)."""
    if not isinstance(name, str):
        return None
    found = METHODS.get(ALIASES.get(name, name))
    if found is None or (among is not None and found.name not in tuple(among)):
        return None
    return found


def default_pattern(method: object, scope: object) -> str:
    """The pattern a method prunes with when none is given: Wanda ranks within each output
    row, as its paper does (whole-layer ranking came out 16 % worse in perplexity on
    SmolLM2-135M at 50 %), unless `scope` is 'global' (ranked across layers); every other
    method ranks the whole tensor."""
    return "row" if method == "wanda" and scope == "layer" else "unstructured"


def default_sequential(method: object, ranks: bool, scope: object = "layer") -> bool | str:
    """How a method calibrates when `sequential` is not given: SparseGPT 'layers' (block by
    block, and in each block layer group by layer group, each on the outputs of the groups
    pruned before it), as its paper prunes, unless over data-parallel `ranks` (which
    'layers' refuses); every other method True (block by block). On SmolLM2-135M and
    all-MiniLM-L6-v2 at 50 % (benchmarks/vs_llmcompressor.py), 'layers' gave SparseGPT the
    better score in unstructured and 2:4 alike (and, its runs stopping at each group's
    input and reusing what the run before computed, less forward work). For Wanda it did
    not: on SmolLM2-135M it moved the perplexity on five text domains both ways (per row
    0.990-1.009 x, 2:4 0.874-1.044 x llm-compressor's, benchmarks/domains_llmcompressor.py)
    and lowered all-MiniLM-L6-v2's cosine, so Wanda ranks as llm-compressor does. Wanda
    with `scope` 'global' ranks every layer's entries together, so it takes one pass
    (False): all statistics before any layer is pruned."""
    if method == "wanda" and scope == "global":
        return False
    return "layers" if method == "sparsegpt" and not ranks else True


def check_scope(scope: object, owner: str) -> str:
    """`scope` if it is one of SCOPES.

    Raises:
        ValueError: naming `owner`, the value and the scopes allowed.
    """
    if not isinstance(scope, str) or scope not in SCOPES:
        raise value_error(
            f"{owner}: invalid scope={scope!r}; expected 'layer' (each tensor or group on "
            "its own) or 'global' (all of them ranked together)"
        )
    return scope


def check_settings(method: str, given: dict[str, object], owner: str) -> None:
    """Refuse a setting of `given` (a name and its value; None: not given) that `method`
    does not read: one the registry lists as another method's own.

    Raises:
        ValueError: naming `owner`, the setting, its value, `method` and the methods that
            take it.
    """
    for name, value in given.items():
        if value is None or name in METHODS[method].settings:
            continue
        takers = [f"{m!r}" for m, entry in METHODS.items() if name in entry.settings]
        raise value_error(
            f"{owner}: {name}={value!r} is read by method {' or '.join(takers)} only, not "
            f"method={method!r}, which would ignore it; expected {name}=None (not given) "
            f"with method={method!r}, or method={' or '.join(takers)}"
        )


def check_calibration_options(
    method: object, sequential: object, progress: object, owner: str
) -> None:
    """Refuse `sequential` or `progress` given (not None) beside a method that would read
    and ignore them: both shape the runs of the calibrated methods only, and `sequential`
    those calibrated block by block (BLOCKWISE) only. An unknown `method` is left to the
    caller's own check.

    Args:
        method: the method's name, as given.
        sequential: the `sequential` given (None: not given).
        progress: the `progress` given (None: not given).
        owner: the entry point the error names.

    Raises:
        ValueError: naming `owner`, the option, its value, `method` and the methods that
            read it.
    """
    plain = isinstance(method, str) and method in METHODS and method not in CALIBRATED
    for key, value in (("sequential", sequential), ("progress", progress)):
        if value is not None and plain:
            raise value_error(
                f"{owner}: {key}={value!r} applies to the calibrated methods "
                f"({', '.join(CALIBRATED)}) only, not method={method!r}, which would "
                f"ignore it; expected no {key} (None) with method={method!r}"
            )
    if sequential is not None and method == "taylor":
        raise value_error(
            f"{owner}: sequential={sequential!r} applies to the methods calibrated block by "
            f"block ({', '.join(BLOCKWISE)}) only, not method='taylor', which would "
            "ignore it (its gradients come from backward passes of the whole model); "
            "expected no sequential (None) with method='taylor'"
        )


def check_method_scope(
    method: str, scope: str, owner: str, among: Iterable[str] | None = None
) -> None:
    """Refuse a `scope` (one of SCOPES) that `method` (one of METHODS) does not rank in:
    'ln' ranks the channels of each tensor on its own, so only in scope 'layer'.

    Args:
        method: the method's name, known.
        scope: the scope, checked (check_scope).
        owner: the entry point the error names.
        among: the methods the entry point takes (default: all), of which the error lists
            those that rank in `scope`.

    Raises:
        ValueError: naming `owner`, the method, the scope, the scopes the method ranks in
            and the methods that rank in `scope`.
    """
    entry = METHODS[method]
    if scope in entry.scopes:
        return
    takers = [repr(m) for m in (METHODS if among is None else among) if scope in METHODS[m].scopes]
    own = " or ".join(repr(s) for s in entry.scopes)
    raise value_error(
        f"{owner}: method={method!r} prunes {entry.summary}, each tensor on its own, so "
        f"scope must be {own}, not scope={scope!r}; for scope={scope!r} use method "
        f"{_either(takers)}"
    )


def _either(items: list[str]) -> str:
    """``'a', 'b' or 'c'``."""
    return items[-1] if len(items) < 2 else f"{', '.join(items[:-1])} or {items[-1]}"
