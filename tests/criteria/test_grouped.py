"""GroupedRuns (sequential='layers'): each group's statistics and the block's outputs are
those of full runs of the block pruned so far, to the bit, while each run stops at the
group's input and answers the calls the run before finished from memory."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit.calibrate as cal
from prunekit.criteria.grouped import GroupedRuns

WANTED = cal.Wanted(norms=True, hessian=True)
OWNER = "prune_model"  # the entry point an error names


class Attention(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.o = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        weights = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1)
        return self.o(weights @ self.v(x)), None


class Mlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.gate = nn.Linear(width, 2 * width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class Decoder(nn.Module):
    """A LLaMA block's shape: norms, an attention and an MLP around the Linears."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention, self.mlp = Attention(width), Mlp(width)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor]:
        x = x + self.attention(self.norm1(x))[0] * scale
        return (x + self.mlp(self.norm2(x)),)


def inputs(count: int = 3, width: int = 8, **kwargs: Any) -> list[cal.Inputs]:
    generator = torch.Generator().manual_seed(2)
    return [((torch.randn(2, 5, width, generator=generator),), kwargs) for _ in range(count)]


def linears(block: nn.Module) -> list[nn.Module]:
    return [m for m in block.modules() if isinstance(m, nn.Linear)]


def prune_half(group: list[nn.Module]) -> None:
    """A stand-in for pruning: zero every other weight of each layer."""
    with torch.no_grad():
        for layer in group:
            assert isinstance(layer, nn.Linear)
            layer.weight.view(-1)[::2] = 0


def computations(modules: list[nn.Module]) -> dict[str, int]:
    """Count each forward computed by the modules (their own forward, wrapped)."""
    counts = {type(m).__name__ + str(i): 0 for i, m in enumerate(modules)}
    for (name, _), module in zip(counts.items(), modules, strict=True):
        real = module.forward

        def counted(*args: Any, n: str = name, real: Any = real, **kwargs: Any) -> Any:
            counts[n] += 1
            return real(*args, **kwargs)

        module.forward = counted
    return counts


def test_each_group_gets_a_full_run_s_statistics_and_the_block_its_outputs() -> None:
    torch.manual_seed(0)
    block = Decoder().eval()
    calls = inputs(scale=0.5)
    targets = linears(block)
    a, m = block.attention, block.mlp
    found = []
    with torch.no_grad(), GroupedRuns(block, calls, targets, WANTED, owner=OWNER) as runs:
        left = list(targets)
        while left:
            stats, group = runs.next_group(left)
            found.append(group)
            whole = cal.block_statistics(block, calls, group, WANTED, owner=OWNER)  # full runs
            for layer in group:
                assert torch.equal(stats.hessian(layer), whole.hessian(layer))
                assert torch.equal(stats.norms(layer), whole.norms(layer))
                assert stats.rows(layer) == whole.rows(layer) == 30
            prune_half(group)
            left = [t for t in left if all(t is not g for g in group)]
        outputs = runs.outputs()
    assert found == [[a.q, a.k, a.v], [a.o], [m.gate, m.up], [m.down]]
    expected = cal.next_inputs(block, calls, owner=OWNER)
    for (args, kwargs), (want, want_kwargs) in zip(outputs, expected, strict=True):
        assert torch.equal(args[0], want[0]) and kwargs == want_kwargs


def test_each_run_stops_at_its_group_and_computes_no_finished_call_again() -> None:
    block = Decoder().eval()
    calls = inputs()
    targets = linears(block)
    counts = computations(targets)
    with torch.no_grad(), GroupedRuns(block, calls, targets, WANTED, owner=OWNER) as runs:
        left = list(targets)
        while left:
            _, group = runs.next_group(left)
            prune_half(group)
            left = [t for t in left if all(t is not g for g in group)]
        runs.outputs()
    # Each Linear once finding its group, on the first input (each later run stops
    # before the group), then once a batch pruned, for the next group's input (q, k, v
    # and o) or the outputs (gate, up, down): no run computes a finished call again. The
    # last group (down) is the only module left to find, so it is named without a run.
    assert list(counts.values()) == [1 + len(calls)] * 6 + [len(calls)]
    assert all("forward" in vars(module) for module in targets)  # given back


class Changed(nn.Module):
    """An output of a kept call is changed in place afterwards, by the block's code."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        y.add_(1.0)
        return self.c(self.b(y))


def test_an_output_changed_in_place_after_it_was_kept_is_computed_again() -> None:
    block = Changed().eval()
    calls = inputs(2, 4)
    targets = [block.a, block.b, block.c]
    with torch.no_grad(), GroupedRuns(block, calls, targets, WANTED, owner=OWNER) as runs:
        for layer in targets:
            stats, group = runs.next_group([layer])
            assert group == [layer]
            whole = cal.block_statistics(block, calls, group, WANTED, owner=OWNER)
            assert torch.equal(stats.hessian(layer), whole.hessian(layer))
            prune_half(group)


class Named(nn.Module):
    """A sublayer whose output is a dict (not kept: computed again in each run)."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.b(torch.relu(self.a(x)))}


class Stacked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.c = Named(), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.first(x)["out"])


def test_an_output_of_another_kind_is_computed_again() -> None:
    block = Stacked().eval()
    calls = inputs(2, 4)
    targets = [block.first.a, block.first.b, block.c]
    counts = computations([block.first])
    with torch.no_grad(), GroupedRuns(block, calls, targets, WANTED, owner=OWNER) as runs:
        for layer in targets:
            stats, group = runs.next_group([layer])
            whole = cal.block_statistics(block, calls, group, WANTED, owner=OWNER)
            assert torch.equal(stats.hessian(layer), whole.hessian(layer))
            prune_half(group)
        outputs = runs.outputs()
    assert torch.equal(outputs[1][0][0], cal.next_inputs(block, calls, owner=OWNER)[1][0][0])
    # each group's runs (the first two stop inside it) and the outputs; the full runs
    assert list(counts.values()) == [3 * 2 + 2 + (3 + 1) * 2]


class Failing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            raise RuntimeError("no single rows")
        return self.a(x)


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Failing()
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.inner(x))


def test_an_error_of_the_model_inside_a_wrapped_forward_names_the_batch() -> None:
    block = Holder().eval()
    calls: list[cal.Inputs] = [((torch.randn(2, 4),), {}), ((torch.randn(1, 4),), {})]
    targets = [block.inner.a, block.b]
    expected = "^prune_model: calibration: the model cannot take batch 1: RuntimeError: no single"
    with (
        torch.no_grad(),
        GroupedRuns(block, calls, targets, WANTED, owner=OWNER) as runs,
        pytest.raises(ValueError, match=expected),
    ):
        runs.next_group(targets)
    assert "forward" not in vars(block.inner)
