"""The one-shot engine's plan: every argument, target and batch checked against the others
before anything changes, and the helpers that read a target's tensors."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

import prunekit.calibrate as cal
from prunekit.calibrate import layer_matrices
from prunekit.calibrate.layer_matrices import calibrates
from prunekit.core.amount import Amount, validate_dim
from prunekit.core.checks import check_finite
from prunekit.core.errors import describe, naming, type_error, value_error
from prunekit.core.example_inputs import rowless, token_mask
from prunekit.core.naming import mask_name, orig_name
from prunekit.core.transaction import Transaction
from prunekit.criteria.sparsegpt import SparseGPT
from prunekit.patterns import NM, Pattern, PerRow
from prunekit.whole.config import PATTERNS, Config, parse_pattern
from prunekit.whole.registry import CALIBRATED

__all__ = ["ENGINE", "PATTERNS", "Loss", "Plan", "TensorRef", "make_plan", "parse_pattern"]

ENGINE = ("l1", "random", *CALIBRATED)  # the methods the one-shot engine runs

TensorRef = tuple[nn.Module, str]  # (module, name): one tensor to prune
Loss = Callable[[Any, Any], Tensor]


@dataclass
class Plan:
    """Everything the one-shot engine checked before changing anything."""

    targets: list[TensorRef]
    config: Config
    pattern: Pattern
    batches: list[Any]
    loss: Loss | None
    sparsegpt: SparseGPT
    paths: dict[nn.Module, str]  # each module's path in the model, for errors
    reduce: cal.Reduce | None = None  # sums statistics over data-parallel ranks
    # False: each target's pruning made permanent as soon as it is pruned (no mask kept)
    keep_masks: bool = True
    # the call's transaction: tensors are written ahead to it before they change in place
    journal: Transaction | None = None
    # the model the batches are given to, whose forward names a tuple batch's items (its
    # attention_mask); None: not known
    model: nn.Module | None = None

    def write_ahead(self, tensors: list[Tensor]) -> None:
        """Before `tensors` change in place: their values to the journal, if there is one
        (in a streamed run there is none: its output folder is swapped in whole).

        Args:
            tensors: the parameters about to be written in place.
        """
        if self.journal is not None:
            self.journal.write_ahead(tensors)

    @property
    def method(self) -> str:
        return self.config.method

    @property
    def amount(self) -> float:
        return self.config.amount

    def describe(self, module: nn.Module, name: str) -> str:
        """`describe` with the module's path in the model (errors name ``a.weight``)."""
        return describe(module, name, self.paths.get(module))


def make_plan(
    model: nn.Module,
    targets: list[TensorRef],
    config: Config,
    calibration: Iterable[Any] | None,
    loss: Loss | None,
    paths: Mapping[nn.Module, str] | None = None,
    forward: nn.Module | None = None,
) -> Plan:
    """Check every argument against the others and against each target.

    `paths` names each module in errors (default: its path in `model`; a block streamed
    alone passes the paths in the whole model). `forward`: the model the batches are given
    to, whose forward names a tuple batch's items (default: `model`; a block streamed
    alone passes the whole model).

    Raises:
        TypeError, ValueError: naming `config.owner`, the argument (or the target) and
            the value.
    """
    owner, method = config.owner, config.method
    if method not in ENGINE:
        raise value_error(f"{owner}: invalid method={method!r}; expected one of {ENGINE}")
    # the Config refused a pattern, method or sequential scope 'global' cannot take
    chosen = parse_pattern(config.chosen_pattern, owner)
    forward = model if forward is None else forward
    batches = _batches(config, calibration, loss, forward)
    settings = config.sparsegpt
    found = {m: p for p, m in model.named_modules()} if paths is None else dict(paths)
    plan = Plan(targets, config, chosen, batches, loss, settings, found, model=forward)
    for module, name in targets:
        _check_target(model, plan, module, name)
    return plan


def _batches(
    config: Config, calibration: Iterable[Any] | None, loss: Loss | None, model: nn.Module
) -> list[Any]:
    owner, method = config.owner, config.method
    if method not in CALIBRATED:
        if calibration is not None or loss is not None:
            raise value_error(
                f"{owner}: method={method!r} uses no calibration data; expected "
                f"calibration=None and loss=None (calibrated methods: {', '.join(CALIBRATED)})"
            )
        return []
    if calibration is None:
        raise value_error(
            f"{owner}: method={method!r} needs calibration data; expected calibration= "
            "an iterable of batches the model's forward takes"
        )
    batches = cal.batch_list(calibration, owner)
    for index, batch in enumerate(batches):
        if not isinstance(batch, Tensor | dict | tuple | list) and not hasattr(batch, "keys"):
            raise type_error(
                f"{owner}: calibration batch {index} is a {type(batch).__name__}; expected "
                "a tensor, a mapping of keyword arguments or a tuple of positional ones"
            )
    if method != "taylor" and loss is not None:
        raise value_error(f"{owner}: loss is for method='taylor'; got method={method!r}")
    for index, batch in enumerate(batches):  # which token each mask entry is
        token_mask(batch, index, owner, model)
    empty = rowless(batches, model)
    if empty is not None:  # Taylor would rank on gradients of zero, the others on nothing
        raise value_error(
            f"{owner}: every one of the {len(batches)} calibration batches {empty}, so "
            f"method={method!r} has no row to calibrate on; expected batches with at least "
            "one row (token)"
        )
    return batches


def _check_target(model: nn.Module, plan: Plan, module: nn.Module, name: str) -> None:
    owner, method, amount = plan.config.owner, plan.method, plan.amount
    where = plan.describe(module, name)
    values = current_values(module, name)
    if method in CALIBRATED:
        if not calibrates(module, name):
            path = plan.paths.get(module, "?")
            raise value_error(
                f"{owner}: method={method!r} calibrates the weight matrices of Linear "
                f"layers, Hugging Face's Conv1D, convolutions and MultiheadAttention's "
                f"in_proj_weight and out_proj; {where} ({path!r}) is not one (exclude it, "
                "or prune it with method='l1')"
            )
        if not isinstance(values, Tensor):
            raise type_error(f"{owner}: method={method!r} needs a torch model")
        if method == "sparsegpt":  # found before calibrating, at the parameter's index
            live = alive(module, name)
            with naming(where):
                competing = values if live is None else values.masked_fill(~live, 0)
                check_finite(competing, owner, "weights")
        groups, _ = layer_matrices.width(module)
        if method == "sparsegpt" and groups > 1 and isinstance(amount, numbers.Integral):
            raise value_error(
                f"{owner}: {where} ({groups} groups) is pruned by SparseGPT group by "
                f"group; expected amount= a fraction, not the count {amount}"
            )
    pattern = oriented(module, name, plan.pattern)
    if method == "sparsegpt" and isinstance(pattern, NM | PerRow) and values.dim() > 2:
        _check_matrix_dim(pattern, values.dim(), owner, where)
    if isinstance(pattern, NM | PerRow):
        with naming(where):
            if isinstance(pattern, NM):
                pattern.check(tuple(values.shape), Amount(amount, owner))
            elif values.dim() < 2:
                raise value_error(
                    f"{owner}: pattern 'row' needs rows, got shape {tuple(values.shape)}"
                )
    global_ = plan.config.scope == "global"  # a count over all the targets: checked there
    if isinstance(amount, numbers.Integral) and int(amount) > values.numel() and not global_:
        raise value_error(
            f"{where}: amount={amount} is more than its {values.numel()} entries; expected a "
            "fraction or a smaller count"
        )


def _check_matrix_dim(pattern: NM | PerRow, ndim: int, owner: str, where: str) -> None:
    """SparseGPT prunes a convolution as a matrix, the filters its rows, the input channels
    at each kernel position its consecutive columns: a pattern along another dim of the
    weight (the kernel's) has no such matrix form."""
    wanted = 1 if isinstance(pattern, NM) else 0
    with naming(where):
        axis = validate_dim(pattern.dim, ndim, owner)
    if axis != wanted:
        along = "NM(n, m) along dim 1 (the input channels)" if wanted else "PerRow(dim=0)"
        raise value_error(
            f"{where}: {owner}: SparseGPT prunes a convolution as a matrix of filters by input "
            f"patches, which {pattern!r} does not fit (dim {axis} of a {ndim}-dim weight); "
            f"expected {along}"
        )


def oriented(module: nn.Module, name: str, pattern: Pattern) -> Pattern:
    """`pattern`, named for a Linear's weight, as it reads on ``module.<name>``."""
    return layer_matrices.oriented(module, pattern) if calibrates(module, name) else pattern


def current_values(module: nn.Module, name: str) -> Tensor:
    """The current values of ``module.<name>`` (mask x orig where pruned); a dotted name
    is a submodule's tensor."""
    if "." in name:
        path, _, name = name.rpartition(".")
        module = module.get_submodule(path)
    if orig_name(name) in module._parameters:
        orig = module._parameters[orig_name(name)]
        mask = module._buffers[mask_name(name)]
        assert orig is not None and mask is not None
        values: Tensor = (orig * mask).detach()
        return values
    found = getattr(module, name, None)
    if found is None:
        raise value_error(f"{describe(module, name)} does not exist; expected a parameter name")
    result: Tensor = found.detach()
    return result


def alive(module: nn.Module, name: str) -> Tensor | None:
    """Where ``module.<name>`` is not pruned yet (None: no mask)."""
    if "." in name:
        path, _, name = name.rpartition(".")
        module = module.get_submodule(path)
    mask = module._buffers.get(mask_name(name))
    return None if mask is None else mask == 1
