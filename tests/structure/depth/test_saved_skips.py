"""A model whose blocks are skipped cannot be written by save_pruned: a state_dict holds
no skip, so the file would reload with those blocks computing again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint


class Residual(nn.Module):
    """Blocks the parent adds to the hidden state (h = h + block(h))."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.body:
            x = x + block(x)
        out: Tensor = self.head(x)
        return out


X = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("permanent", [False, True])
def test_save_pruned_refuses_skipped_blocks_and_writes_nothing(
    tmp_path: Path, permanent: bool
) -> None:
    model = Residual()
    prunekit.skip_blocks(model, [1], blocks="body", example_inputs=X)
    before, path = fingerprint(model), tmp_path / "model.pt"
    with pytest.raises(ValueError, match=r"save_pruned: .*skipped block body\.1.*"
                       r"prunekit\.remove_blocks\(model\)"):  # fmt: skip
        prunekit.save_pruned(model, path, permanent=permanent)
    assert not path.exists() and list(tmp_path.iterdir()) == []
    assert fingerprint(model) == before and prunekit.skipped_blocks(model) == {"body": (1,)}


def test_save_pruned_of_the_removed_blocks_reloads_what_was_saved(tmp_path: Path) -> None:
    model = Residual()
    prunekit.skip_blocks(model, [1], blocks="body", example_inputs=X)
    with torch.no_grad():
        skipped = model(X)
    prunekit.remove_blocks(model, blocks="body")
    prunekit.save_pruned(model, tmp_path / "model.pt")
    fresh = Residual()
    del fresh.body[1]
    prunekit.load_pruned(fresh, tmp_path / "model.pt")
    with torch.no_grad():
        assert torch.equal(fresh(X), skipped)


def test_unskipped_blocks_save_again(tmp_path: Path) -> None:
    model = Residual()
    prunekit.skip_blocks(model, [0], blocks="body", example_inputs=X)
    prunekit.unskip_blocks(model)
    prunekit.save_pruned(model, tmp_path / "model.pt")
    fresh = Residual()
    prunekit.load_pruned(fresh, tmp_path / "model.pt")
    with torch.no_grad():
        assert torch.equal(fresh(X), model(X))


def test_permanent_state_dict_refuses_skipped_blocks() -> None:
    """Its promise is a state_dict that loads into an unpruned copy and computes the same:
    a skip is no tensor, so it cannot keep it."""
    model = Residual()
    prunekit.skip_blocks(model, [2], blocks="body", example_inputs=X)
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"permanent_state_dict: .*skipped block body\.2.*"
                       r"prunekit\.remove_blocks\(model\)"):  # fmt: skip
        prunekit.permanent_state_dict(model)
    assert fingerprint(model) == before
