"""Calibrated cases for the multi-process tests: data-parallel ranks, each calibrating on its
own batches, against one process calibrating on all of them.

Every process builds the same model from its seed. Rank r's batches are `batches(r, world)`;
one process takes those of every rank, in rank order. The expert of each block runs only
on batches of odd size, which rank 0 alone has: a layer some ranks never see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import prunekit

WIDTH = 24


class Block(nn.Module):
    """Query, key and value read one input (one shared statistic); an MLP; an expert."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.out = nn.Linear(WIDTH, WIDTH)
        self.expert = nn.Linear(WIDTH, WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.q(x) * torch.sigmoid(self.k(x)) + self.v(x)
        x = x + self.out(h)
        if x.shape[0] % 2:
            x = x + self.expert(x)
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(WIDTH, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


@dataclass(frozen=True)
class Calibrated:
    method: str
    scope: str = "layer"
    sequential: bool | None = True  # None: Taylor, which refuses it (it never goes by blocks)
    pattern: str = "unstructured"


CALIBRATED = {
    "wanda": Calibrated("wanda"),
    "wanda_global": Calibrated("wanda", scope="global", sequential=False),
    "wanda_rows": Calibrated("wanda", sequential=False, pattern="row"),
    "sparsegpt": Calibrated("sparsegpt"),
    "sparsegpt_2of4": Calibrated("sparsegpt", sequential=False, pattern="2:4"),
    "taylor": Calibrated("taylor", sequential=None),
}


def build() -> Net:
    """The model, the same in every process (and thread: no global generator)."""
    generator = torch.Generator().manual_seed(11)
    model = Net()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) / p.shape[-1] ** 0.5)
    return model


def batches(rank: int, world: int) -> list[torch.Tensor]:
    """Rank `rank`'s batches: rank 0 has one of odd size (the expert runs on it)."""
    generator = torch.Generator().manual_seed(400 + rank)
    sizes = [5, 4] if rank == 0 else [4, 2 + 2 * rank]
    return [torch.randn(n, 3, WIDTH, generator=generator) for n in sizes]


def _loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    return output.pow(2).mean()


def prune(name: str, data: list[torch.Tensor], process_group: Any = None) -> dict[str, Any]:
    """The model pruned on `data`: every mask, and every weight (SparseGPT updates them)."""
    case = CALIBRATED[name]
    model = build()
    prunekit.prune_model(
        model,
        0.5,
        method=case.method,
        scope=case.scope,
        pattern=case.pattern,
        sequential=case.sequential,
        calibration=data,
        loss=_loss if case.method == "taylor" else None,
        process_group=process_group,
    )
    state = model.state_dict()
    return {k: v.clone() for k, v in state.items() if k.endswith(("_mask", "_orig"))}


def reference(name: str, world: int) -> dict[str, Any]:
    """One process calibrating on the batches of all `world` ranks."""
    return prune(name, [b for r in range(world) for b in batches(r, world)])


def on_rank(name: str, rank: int, world: int) -> dict[str, Any]:
    return prune(name, batches(rank, world), torch.distributed.group.WORLD)


def refused(rank: int, world: int) -> str:
    """Rank 1's second batch has the wrong width: every rank raises, none is pruned."""
    model = build()
    data = batches(rank, world)
    if rank == 1:
        data[1] = torch.randn(2, 3, WIDTH + 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        prunekit.prune_model(
            model,
            0.5,
            method="sparsegpt",
            calibration=data,
            process_group=torch.distributed.group.WORLD,
        )
    except (ValueError, RuntimeError) as error:
        after = model.state_dict()
        same = after.keys() == before.keys() and all(
            torch.equal(after[k], v) for k, v in before.items()
        )
        return f"{type(error).__name__}: {error}; unchanged: {same}"
    return "no error"


def calibrated_differences(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> Any:
    if got.keys() != want.keys():
        return f"names {sorted(got)}, expected {sorted(want)}"
    for name, w in want.items():
        g = got[name]
        if name.endswith("_mask") and not torch.equal(g, w):
            return f"{name}: {int((g != w).sum())} entries differ"
        # the ranks' Hessians are summed in another order than one process sums them, and
        # SparseGPT's refit (a least-squares solve by conjugate gradients) carries that
        # rounding into the weights it moves, and on into the next block's inputs: the
        # masks are equal, the weights agree to about 1e-3
        if name.endswith("_orig") and not torch.allclose(g, w, rtol=1e-3, atol=2e-3):
            return f"{name}: weights differ by up to {float((g - w).abs().max())}"
    return None
