"""Hostile calls of the drop-in (``import prunekit as prune`` for torch.nn.utils.prune): where
prunekit refuses what torch accepts, the refusal names the parameter, leaves the module as it
was, and the drop-in guide lists the difference (a drop-in's user reads it there)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit
from hostile.support import refused

GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "drop-in.md"


def _linear(poison: float | None = None) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(6, 5)
    if poison is not None:
        with torch.no_grad():
            layer.weight[1, 2] = poison
    return layer


# (case, the module, the call on a library (torch's or prunekit's), what the message says,
# what the guide says)
ACCEPTED_BY_TORCH: list[tuple[str, Callable[[], nn.Module], Callable[[Any, nn.Module], Any],
                              str, str]] = [
    ("l1-nan-weight", lambda: _linear(float("nan")),
     lambda lib, m: lib.l1_unstructured(m, "weight", 0.3), r"'weight' of Linear.*nan",
     "holding NaN or an infinity"),
    ("l1-inf-weight", lambda: _linear(float("-inf")),
     lambda lib, m: lib.l1_unstructured(m, "weight", 0.3), r"'weight' of Linear.*-inf",
     "holding NaN or an infinity"),
    ("l1-inf-importance", _linear,
     lambda lib, m: lib.l1_unstructured(m, "weight", 0.3,
                                        importance_scores=torch.full((5, 6), float("inf"))),
     r"'weight' of Linear.*inf", "an importance score holding NaN or an infinity"),
    ("global-nan-weight", lambda: _linear(float("nan")),
     lambda lib, m: lib.global_unstructured([(m, "weight")], lib.L1Unstructured, amount=3),
     r"'weight' of Linear.*nan", "`global_unstructured` alike"),
    ("custom-half-mask", _linear,
     lambda lib, m: lib.custom_from_mask(m, "weight", torch.full((5, 6), 0.5)),
     r"'weight' of Linear.*other than 0 and 1", "a mask of 0s and 1s only"),
    ("ln-order-zero", _linear,
     lambda lib, m: lib.ln_structured(m, "weight", 2, n=0, dim=0), r"'weight' of Linear.*n=0",
     "`n=0`"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "build", "call", "match", "guide"), ACCEPTED_BY_TORCH,
                         ids=[c[0] for c in ACCEPTED_BY_TORCH])  # fmt: skip
def test_what_torch_accepts_and_prunekit_refuses_is_named_and_listed(
    case: str, build: Callable[[], nn.Module], call: Callable[[Any, nn.Module], Any],
    match: str, guide: str,
) -> None:  # fmt: skip
    call(torch_prune, build())  # torch takes it
    module = build()
    refused(lambda: call(prunekit, module), ValueError, match, model=module)
    section = GUIDE.read_text(encoding="utf-8").split("## Where prunekit differs")[1]
    section = " ".join(section.split("\n## ")[0].split())
    assert guide in section, f"the drop-in guide's differences do not say {guide!r}"


# --- models pruned by torch.nn.utils.prune itself, handed to prunekit ------------------------


def _pruned_by_torch() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4))
    torch_prune.l1_unstructured(model[0], "weight", 0.4)
    torch_prune.ln_structured(model[0], "weight", 1, n=2, dim=0)  # a container of two
    torch_prune.random_unstructured(model[2], "bias", 0.5)
    return model


@pytest.mark.parametrize("where", ["permanent_state_dict", "save_pruned"])
def test_a_model_pruned_by_torch_is_made_permanent_too(where: str, tmp_path: Path) -> None:
    """The drop-in's permanent state dict folded prunekit's own hooks only: a model pruned by
    torch.nn.utils.prune kept its _orig/_mask entries, which an unpruned copy refuses
    (strict) or skips, its weights left as they were built (strict=False)."""
    model = _pruned_by_torch()
    if where == "permanent_state_dict":
        state = prunekit.permanent_state_dict(model)
    else:
        from prunekit.io.files import load_state_dict

        state = load_state_dict(prunekit.save_pruned(model, tmp_path / "m.pt", permanent=True))
    fresh = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4))
    assert sorted(state) == sorted(fresh.state_dict())
    fresh.load_state_dict(state)
    x = torch.randn(3, 6)
    assert torch.equal(fresh(x), model(x))
    assert torch.equal(state["0.weight"], model[0].weight_orig * model[0].weight_mask)


def test_is_pruned_and_remove_take_a_model_pruned_by_torch() -> None:
    """`import prunekit as prune` over code that pruned with torch: is_pruned said False, and
    remove said 'is not pruned, so there is nothing to remove', of tensors torch pruned."""
    model = _pruned_by_torch()
    assert prunekit.is_pruned(model) and prunekit.is_pruned(model[0])
    x = torch.randn(3, 6)
    before = model(x)
    prunekit.remove(model[0], "weight")
    prunekit.remove(model, "2.bias")
    assert not prunekit.is_pruned(model) and not torch_prune.is_pruned(model)
    assert sorted(dict(model.named_parameters())) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert torch.equal(model(x), before)
