"""Tensors of the wrong kind (complex, meta, sparse) that a caller gives, as scores, masks,
weights, a loss or a calibration batch: one check (core.checks.check_kind) refuses them with
a message naming the argument, and the model is left exactly as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint

X = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))

KINDS: dict[str, tuple[Callable[[Tensor], Tensor], type[Exception], str]] = {
    "complex": (lambda t: t.to(torch.complex64), TypeError, r"has dtype torch.complex64; "
                r"expected a real dtype"),
    "meta": (lambda t: t.to("meta"), ValueError, r"is a meta tensor \(a shape without values\)"),
    "sparse": (lambda t: t.to_sparse(), ValueError, r"is a sparse tensor \(torch.sparse_coo\); "
               r"expected a dense"),
}  # fmt: skip


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("kind", KINDS)
def test_a_criterions_scores_of_the_wrong_kind(kind: str) -> None:
    make, error, words = KINDS[kind]
    model = mlp()
    before = fingerprint(model)
    with pytest.raises(error, match=r"prune_channels: criterion .*: the tensor of scores for "
                       r"group 0.weight " + words):  # fmt: skip
        prunekit.prune_channels(model, X, 0.5, criterion=lambda g: make(torch.rand(g.size)))
    assert fingerprint(model) == before


@pytest.mark.parametrize("kind", KINDS)
def test_custom_from_mask_names_a_mask_of_the_wrong_kind(kind: str) -> None:
    make, error, words = KINDS[kind]
    layer = nn.Linear(4, 8)
    before = fingerprint(layer)
    words = r"invalid mask of dtype" if kind == "complex" else r"the mask " + words
    with pytest.raises(error, match=r"parameter 'weight' of Linear: CustomFromMask: " + words):
        prunekit.custom_from_mask(layer, "weight", make(torch.ones(8, 4)))
    assert fingerprint(layer) == before


def _pruner(model: nn.Module) -> prunekit.GradualPruner:
    return prunekit.GradualPruner(model, 0.5, start_step=0, end_step=2)


@pytest.mark.parametrize("kind", KINDS)
def test_a_pruner_state_whose_masks_are_of_the_wrong_kind(kind: str) -> None:
    make, error, words = KINDS[kind]
    model = mlp()
    pruner = _pruner(model)
    state = pruner.state_dict()
    state["masks"] = {k: make(v.float()) for k, v in state["masks"].items()}
    before, steps = fingerprint(model), pruner.state_dict()
    with pytest.raises(error, match=r"GradualPruner.load_state_dict: the mask of '0.weight' "
                       + words):  # fmt: skip
        pruner.load_state_dict(state)
    assert fingerprint(model) == before and pruner.state_dict()["steps"] == steps["steps"]


@pytest.mark.parametrize("kind", KINDS)
def test_rewinding_to_a_weight_of_the_wrong_kind(kind: str) -> None:
    make, error, words = KINDS[kind]
    model = mlp()
    pruner = _pruner(model)
    early = {k: v.clone() for k, v in mlp().state_dict().items()}
    early["0.weight"] = make(early["0.weight"])
    before = fingerprint(model)
    with pytest.raises(error, match=r"GradualPruner.rewind: state_dict\['0.weight_orig'\] "
                       + words):  # fmt: skip
        pruner.rewind(early)
    assert fingerprint(model) == before


def test_a_meta_calibration_batch_is_named_as_the_batch() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 8))
    before = fingerprint(model)
    batch = {"input": torch.zeros(2, 4, dtype=torch.long, device="meta")}
    with pytest.raises(ValueError, match=r"prune_model: calibration batch 1: the tensor "
                       r"input is a meta tensor"):  # fmt: skip
        prunekit.prune_model(model, 0.5, method="wanda", calibration=[X.long(), batch])
    assert fingerprint(model) == before


def test_a_loss_that_is_nan_is_named_as_the_loss() -> None:
    model = mlp()
    before = fingerprint(model)

    def loss(output: Tensor, batch: Any) -> Tensor:
        return output.sum() * float("nan")  # the model and the batch are finite

    with pytest.raises(ValueError, match=r"loss\(output, batch\) is nan on batch 0, with finite "
                       r"parameters and inputs; expected a finite loss"):  # fmt: skip
        prunekit.prune_model(model, 0.5, method="taylor", calibration=[X], loss=loss)
    assert fingerprint(model) == before
