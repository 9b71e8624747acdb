"""importance_scores of a tensor pruned before: the entries already pruned never compete, so
NaN there is no error (as NaN in the weights there is none, and as torch.nn.utils.prune
ranks only the entries left). It was refused over the whole tensor. NaN among the entries
that compete is still refused, naming the tensor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

import prunekit as prune


def _first(lib: Any, layer: nn.Linear, structured: bool) -> None:
    if structured:
        lib.ln_structured(layer, "weight", 1, n=1, dim=0)
    else:
        lib.l1_unstructured(layer, "weight", 0.5)


def _layer() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(4, 4)


def _poisoned(layer: nn.Linear) -> Tensor:
    """The layer's values as scores, with NaN wherever its mask is 0."""
    scores = layer.get_parameter("weight_orig").detach().clone()
    scores[layer.get_buffer("weight_mask") == 0] = float("nan")
    return scores


AGAIN: dict[str, tuple[bool, Callable[[Any, nn.Linear, Tensor], None]]] = {
    "l1_unstructured": (False, lambda lib, m, s: lib.l1_unstructured(
        m, "weight", 0.5, importance_scores=s)),
    "global_unstructured": (False, lambda lib, m, s: lib.global_unstructured(
        [(m, "weight")], lib.L1Unstructured, amount=0.5, importance_scores={(m, "weight"): s})),
    "ln_structured": (True, lambda lib, m, s: lib.ln_structured(
        m, "weight", 1, n=1, dim=0, importance_scores=s)),
}  # fmt: skip


@pytest.mark.parametrize("call", AGAIN)
def test_nan_at_pruned_entries_is_no_error_and_gives_torchs_mask(call: str) -> None:
    structured, again = AGAIN[call]
    masks = []
    for lib in (torch_prune, prune):
        layer = _layer()
        _first(lib, layer, structured)
        again(lib, layer, _poisoned(layer))
        masks.append(layer.get_buffer("weight_mask"))
    assert torch.equal(masks[0], masks[1])
    assert int((masks[1] == 0).sum()) == (8 if structured else 12)


@pytest.mark.parametrize("call", AGAIN)
def test_nan_at_an_entry_that_competes_is_refused_and_changes_nothing(call: str) -> None:
    structured, again = AGAIN[call]
    layer = _layer()
    _first(prune, layer, structured)
    scores = _poisoned(layer)
    alive = (layer.get_buffer("weight_mask") == 1).nonzero()[0]
    scores[tuple(alive)] = float("nan")
    before = layer.get_buffer("weight_mask").clone()
    with pytest.raises(ValueError, match=r"parameter 'weight' of Linear: the importance_scores "
                                         r"hold \d+ value\(s\) that cannot be ranked"):  # fmt: skip
        again(prune, layer, scores)
    assert torch.equal(layer.get_buffer("weight_mask"), before)


def test_nan_inside_a_channel_still_ranked_is_refused() -> None:
    """Channels along dim 1 after rows pruned along dim 0: every column is still ranked,
    its norm over the NaN of the pruned rows."""
    layer = _layer()
    _first(prune, layer, True)
    with pytest.raises(ValueError, match=r"LnStructured: the channel norms hold 4 value\(s\)"):
        prune.ln_structured(layer, "weight", 1, n=1, dim=1, importance_scores=_poisoned(layer))
