"""What PyTorch's own pruning tests (tests/peer/) need of a drop-in, tested here one by one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import prunekit

PEER = Path(__file__).parent / "peer"


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("_validate_pruning_amount_init", {"amount": 0.5}),
        ("_validate_pruning_amount", {"amount": 3, "tensor_size": 4}),
        ("_compute_nparams_toprune", {"amount": 0.4, "tensor_size": 17}),
    ],
)
def test_torch_private_amount_helpers_exist(name: str, args: dict[str, float]) -> None:
    assert getattr(prunekit, name)(**args) == getattr(torch_prune, name)(**args)


@pytest.mark.parametrize(
    ("name", "args", "error"),
    [
        ("_validate_pruning_amount_init", {"amount": "0.5"}, TypeError),
        ("_validate_pruning_amount_init", {"amount": 1.5}, ValueError),
        ("_validate_pruning_amount", {"amount": 5, "tensor_size": 4}, ValueError),
    ],
)
def test_torch_private_amount_helpers_raise_alike(
    name: str, args: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        getattr(torch_prune, name)(**args)
    with pytest.raises(error):
        getattr(prunekit, name)(**args)


@pytest.mark.parametrize("scores_dtype", [torch.float32, torch.float64, torch.int64])
def test_container_compute_mask_has_the_dtype_of_t(scores_dtype: torch.dtype) -> None:
    """torch's container returns its mask in the dtype of `t`, whatever the default mask's."""
    t = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]).to(dtype=scores_dtype)
    results = []
    for lib in (torch_prune, prunekit):
        # A new one each time: torch's writes into it where the dtypes agree.
        default_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
        container = lib.PruningContainer()
        container._tensor_name = "t"
        method = lib.L1Unstructured(amount=2)
        method._tensor_name = "t"
        container.add_pruning_method(method)
        results.append(container.compute_mask(t, default_mask))
    theirs, ours = results
    assert ours.dtype == theirs.dtype == scores_dtype
    assert torch.equal(ours, theirs)


def test_container_mask_installed_keeps_the_parameter_dtype() -> None:
    """Installed masks still follow the parameter (the README's stated difference)."""
    layer = torch.nn.Linear(4, 3).double()
    prunekit.l1_unstructured(layer, "weight", amount=2)
    scores = torch.rand(3, 4, dtype=torch.float32)
    prunekit.l1_unstructured(layer, "weight", amount=2, importance_scores=scores)
    assert layer.weight_mask.dtype == torch.float64


@pytest.mark.parametrize("against", ["prunekit", "torch"])
def test_peer_suite_passes(against: str) -> None:
    """PyTorch's own test file, run by tests/peer/run.py (mapping checked there)."""
    done = subprocess.run(
        [sys.executable, str(PEER / "run.py"), "--against", against],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"peer ({against}): 34 passed, 0 failed, 0 skipped" in done.stdout
