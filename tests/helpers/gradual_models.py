"""Small models and a training step for the gradual pruning tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Small(nn.Module):
    """A conv and two linear layers: tensors of 4, 2 and 1 dims."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3)
        self.fc1 = nn.Linear(6 * 4 * 4, 24)
        self.fc2 = nn.Linear(24, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.conv(x)).flatten(1)
        out: Tensor = self.fc2(F.relu(self.fc1(x)))
        return out


def batch(step: int) -> tuple[Tensor, Tensor]:
    """The same batch for the same step, whatever ran before."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, 1, 6, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    x, y = batch(step)
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
    optimizer.step()


def masks(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.endswith("_mask")}
