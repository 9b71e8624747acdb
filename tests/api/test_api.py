"""The public surface: a drop-in for torch.nn.utils.prune."""

from __future__ import annotations

import inspect

import pytest
import torch.nn.utils.prune as torch_prune

import prunekit

TORCH_NAMES = sorted(
    name
    for name, obj in vars(torch_prune).items()
    if not name.startswith("_") and getattr(obj, "__module__", None) == torch_prune.__name__
)


def test_torch_public_names_are_known() -> None:
    assert {"BasePruningMethod", "PruningContainer", "l1_unstructured", "remove"} <= set(
        TORCH_NAMES
    )


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_every_torch_name_exists(name: str) -> None:
    assert name in prunekit.__all__
    assert hasattr(prunekit, name)


def parameters(fn: object) -> list[tuple[str, object]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize(
    "name", [n for n in TORCH_NAMES if inspect.isfunction(getattr(torch_prune, n))]
)
def test_function_signatures_match(name: str) -> None:
    assert parameters(getattr(prunekit, name)) == parameters(getattr(torch_prune, name))


@pytest.mark.parametrize(
    "name", [n for n in TORCH_NAMES if inspect.isclass(getattr(torch_prune, n))]
)
def test_method_signatures_match(name: str) -> None:
    ours, theirs = getattr(prunekit, name), getattr(torch_prune, name)
    for attr in ("apply", "compute_mask", "apply_mask", "prune", "remove", "__call__"):
        assert parameters(getattr(ours, attr)) == parameters(getattr(theirs, attr)), attr
    if name not in ("BasePruningMethod", "PruningContainer"):
        assert parameters(ours.__init__) == parameters(theirs.__init__)
        assert ours.PRUNING_TYPE == theirs.PRUNING_TYPE


def test_all_names_resolve() -> None:
    for name in prunekit.__all__:
        assert getattr(prunekit, name) is not None


def test_amount_helpers_are_exported() -> None:
    from prunekit.core import amount

    assert prunekit.compute_nparams_to_prune is amount.compute_nparams_to_prune
    assert prunekit.validate_pruning_amount is amount.validate_pruning_amount
    assert prunekit.compute_nparams_to_prune(0.5, 9) == 4
