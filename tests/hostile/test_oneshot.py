"""Hostile arguments for prune_model (prunekit.whole): what is selected is what the
arguments name, and the report tells what the model holds."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
import torch
from torch import nn

import prunekit
from hostile.support import refused
from prunekit.whole import Config


def small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))


def masked(model: nn.Module) -> list[str]:
    return [row.name for row in prunekit.report(model).rows if row.masked]


ONCE: dict[str, Callable[[list[str]], Iterable[str]]] = {
    "generator": lambda names: (name for name in names),
    "iterator": iter,
    "map": lambda names: map(str, names),
}


@pytest.mark.parametrize("kind", list(ONCE))
@pytest.mark.parametrize("method", ["l1", "wanda"])
def test_globs_given_as_an_iterator_select_what_they_name(kind: str, method: str) -> None:
    """An include or exclude that can be read once (a generator) selects as its list does:
    it was read empty after its check, so include pruned every weight and exclude none."""
    calibration = None if method == "l1" else [torch.randn(4, 8)]
    model = small()
    prunekit.prune_model(
        model, 0.5, method=method, calibration=calibration, include=ONCE[kind](["0.weight"])
    )
    assert masked(model) == ["0.weight"]
    model = small()
    prunekit.prune_model(
        model, 0.5, method=method, calibration=calibration, exclude=ONCE[kind](["0"])
    )
    assert masked(model) == ["2.weight"]


def pruning(model: nn.Module, method: str, sequential: bool | str) -> Callable[[], object]:
    """``prune_model`` of half of `model`'s weights by `method`, on one batch."""
    return lambda: prunekit.prune_model(
        model, 0.5, method=method, sequential=sequential, calibration=[torch.randn(4, 8)]
    )


class Block(nn.Module):
    """`up`, then `down`, added to the input; or as `how` says: 'in-a-row' calls `up` twice,
    one call after the other, 'after-another' calls it again after `down` (both with
    hidden=8), 'in-place' adds to the input in place (``x += ...``)."""

    def __init__(self, how: str = "once", hidden: int = 16) -> None:
        super().__init__()
        self.how = how
        self.up, self.down = nn.Linear(8, hidden), nn.Linear(hidden, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "in-a-row":
            return x + self.down(torch.relu(self.up(torch.relu(self.up(x)))))
        if self.how == "after-another":
            return x + self.up(torch.relu(self.down(torch.relu(self.up(x)))))
        if self.how == "in-place":
            x += self.down(torch.relu(self.up(x)))
            return x
        return x + self.down(torch.relu(self.up(x)))


class Stack(nn.Module):
    """`blocks` in a ModuleList (one module may stand at several places), then a head.
    `order`: the blocks its forward calls, in turn (each once, in order, by default);
    `clone`: the input copied first, for blocks that add to it in place."""

    def __init__(
        self, blocks: Iterable[nn.Module], order: tuple[int, ...] | None = None,
        clone: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        self.layers = nn.ModuleList(blocks)
        self.head = nn.Linear(8, 2)
        self.order = tuple(range(len(self.layers))) if order is None else order
        self.clone = clone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone() if self.clone else x
        for i in self.order:
            x = self.layers[i](x)
        return self.head(x)


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize("sequential", [True, "layers"])
@pytest.mark.parametrize(
    ("order", "told"),
    [
        ((2, 1, 0), "calls block 2 before block 0"),
        ((0, 2), "calls block 2 before block 1"),
        ((0, 0, 1, 2), "calls block 0 a second time"),
        ((0, 1, 2, 0), "calls block 0 a second time"),
    ],
    ids=["reversed", "skipping", "repeating", "repeating-after-the-last"],
)
def test_blocks_called_out_of_turn_are_refused_block_by_block(
    order: tuple[int, ...], told: str, sequential: bool | str, method: str
) -> None:
    """Block by block, each block is calibrated on the output of the one before it in the
    ModuleList: a forward that calls them otherwise gave each block inputs the model never
    gives it (reversed: block 0 the output of the dense blocks 2 and 1; skipping: block 2
    the output of a block the model never runs), silently."""
    torch.manual_seed(0)
    model = Stack((Block() for _ in range(3)), order)
    refused(
        pruning(model, method, sequential),
        ValueError,
        rf"^prune_model: calibration: the model's forward {told} of its 3 blocks \(Block\) "
        r"on batch 0 "
        r".*\(or pass sequential=False\)$",
        model=model,
    )


@pytest.mark.parametrize("sequential", [True, "layers"])
def test_a_pruned_block_called_again_after_the_last_pruned_one_is_refused(
    sequential: bool | str,
) -> None:
    """With blocks 0 and 1 pruned, recording stopped at block 1: block 1 run again after
    block 2 (on its output) went unseen, calibrated on its first call alone. A block that is
    not pruned (2) may run again: no block pruned is given other inputs."""
    torch.manual_seed(0)
    pruned = ["layers.0.*", "layers.1.*"]
    model = Stack((Block() for _ in range(3)), (0, 1, 2, 1))
    refused(
        lambda: prunekit.prune_model(model, 0.5, method="wanda", sequential=sequential,
                                     calibration=[torch.randn(4, 8)], include=pruned),
        ValueError,
        r"^prune_model: calibration: the model's forward calls block 1 a second time of its "
        r"3 blocks "
        r"\(Block\) on batch 0 \(called: 0, 1, 2, 1\), but block-by-block calibration runs "
        r"blocks 0 to 1 each once",
        model=model,
    )  # fmt: skip
    model = Stack((Block() for _ in range(3)), (0, 1, 2, 2))
    prunekit.prune_model(model, 0.5, method="wanda", sequential=sequential,
                         calibration=[torch.randn(4, 8)], include=pruned)  # fmt: skip
    assert masked(model) == [f"layers.{i}.{n}.weight" for i in (0, 1) for n in ("up", "down")]


class Aside(nn.Module):
    """`b` runs on every batch, but its output never reaches the model's output (a probe run
    under no_grad, or detached)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.how == "no_grad":
            with torch.no_grad():
                self.b(h)
        else:
            self.b(h).detach()
        return self.c(h)


@pytest.mark.parametrize("how", ["no_grad", "detached"])
def test_taylor_refuses_a_tensor_the_loss_gives_no_gradient(how: str) -> None:
    """A tensor whose gradient never came ranked as all zeros: its first half pruned, by
    index, silently (as Wanda refuses a layer that never ran)."""
    torch.manual_seed(0)
    model = Aside(how)
    refused(
        lambda: prunekit.prune_model(
            model,
            0.5,
            method="taylor",
            calibration=[torch.randn(4, 8)],
            loss=lambda output, batch: output.pow(2).sum(),
        ),
        ValueError,
        r"^prune_model: 'b\.weight', parameter 'weight' of Linear got no gradient from the "
        r"loss on any calibration batch",
        model=model,
    )
    prunekit.prune_model(
        model, 0.5, method="taylor", calibration=[torch.randn(4, 8)], exclude="b",
        loss=lambda output, batch: output.pow(2).sum(),
    )  # fmt: skip
    assert masked(model) == ["a.weight", "c.weight"]


def twice(where: str, which: int) -> nn.Module:
    """Two blocks of one class (so calibrated block by block), block `which` calling its
    `up` twice (`where`: as ``Block`` says; 'once': neither)."""
    return Stack(Block(where if i == which else "once", hidden=8) for i in range(2))


@pytest.mark.parametrize("sequential", [True, "layers"])
@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize("which", [0, 1], ids=["first-block", "last-block"])
@pytest.mark.parametrize("where", ["in-a-row", "after-another"])
def test_a_layer_called_twice_in_a_block_is_refused_layer_by_layer(
    where: str, which: int, method: str, sequential: bool | str
) -> None:
    """sequential=True (and False) refuse a calibrated layer run twice in one forward;
    'layers' calibrated it on its first call alone, silently: its runs stop at their group.
    Either names the layer by its path in the model."""
    torch.manual_seed(0)
    model = twice(where, which)
    refused(
        pruning(model, method, sequential),
        ValueError,
        rf"^calibration: module 'layers\.{which}\.up' \(Linear\) was called more than once "
        "per batch",
        model=model,
    )
    model = twice("once", which)  # the same model calling each layer once is pruned
    prunekit.prune_model(
        model, 0.5, method=method, sequential="layers", calibration=[torch.randn(4, 8)]
    )
    assert masked(model) == [f"layers.{i}.{n}.weight" for i in (0, 1) for n in ("up", "down")] + [
        "head.weight"
    ]


def funnel() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3)
    )  # 96 + 96 + 24 entries


def ranked(method: str) -> dict[str, object]:
    if method == "wanda":
        return {"calibration": [torch.randn(4, 8)], "sequential": False}
    return {"calibration": [torch.randn(4, 8)], "loss": lambda output, b: output.pow(2).sum()}


@pytest.mark.parametrize("method", ["wanda", "taylor"])
@pytest.mark.parametrize("count", [37, 100])
def test_a_global_count_is_a_count_over_all_the_tensors(method: str, count: int) -> None:
    """scope='global': `amount` entries of all the tensors together, as 'l1' takes it; a
    count above one tensor's entries (the head's 24) was refused as too many for it."""
    model = funnel()
    found = prunekit.prune_model(model, count, method=method, scope="global", **ranked(method))
    assert sum(row.zeros for row in found.rows if row.masked) == count
    model = funnel()
    refused(
        lambda: prunekit.prune_model(model, 217, method=method, scope="global", **ranked(method)),
        ValueError,
        r"amount=217 is more than the 216 units available to prune",
        model=model,
    )


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize("sequential", [True, "layers"])
def test_one_block_at_several_places_is_refused_for_that(
    sequential: bool | str, method: str
) -> None:
    """Its layers run three times a forward (refused as such in one pass); block by block it
    was refused as a layer that 'never ran on the calibration data': the recording of each
    block's arguments left its hooks on the block, whose next run stopped at them."""
    torch.manual_seed(0)
    block = Block()
    model = Stack([block, block, block])  # one block run three times, as weight-shared layers
    refused(
        pruning(model, method, sequential),
        ValueError,
        r"^prune_model: calibration: the model's blocks hold one Block at positions 0 and 1 "
        r".*expected each "
        r"calibrated layer to run once per forward",
        model=model,
    )
    assert model(torch.randn(2, 8)).shape == (2, 2)  # no hook of the recording left on it


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"damp": -1.0}, ValueError),
        ({"damp": float("nan")}, ValueError),
        ({"damp": "0.1"}, TypeError),
        ({"damp": True}, TypeError),
        ({"blocksize": 0}, ValueError),
        ({"blocksize": 2.5}, TypeError),
    ],
    ids=["damp-negative", "damp-nan", "damp-str", "damp-bool", "blocksize-0", "blocksize-float"],
)
def test_sparsegpts_settings_are_checked_when_the_config_is_made(
    given: dict[str, object], error: type[Exception]
) -> None:
    """Config says it is checked when made; damp and blocksize were checked only at the
    first layer pruned, as SparseGPT's own (after calibrating)."""
    name, value = next(iter(given.items()))
    with pytest.raises(error, match=rf"^Config: invalid {name}={value!r}"):
        Config(method="sparsegpt", amount=0.5, **given)


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize("sequential", [False, True, "layers"])
def test_a_residual_added_in_place_is_calibrated_as_one_added_anew(
    sequential: bool | str, method: str
) -> None:
    """The same arithmetic gives the same masks and weights. In one pass, the later blocks'
    first layers took block 0's statistics (one tensor object, so 'one input shared');
    block by block, block 0 ran for its outputs on the input its statistics run had added to."""
    calibration = [torch.randn(4, 8) for _ in range(3)]
    found = []
    for in_place in (False, True):
        torch.manual_seed(0)
        how = "in-place" if in_place else "once"
        model = Stack((Block(how) for _ in range(3)), clone=True)
        prunekit.prune_model(
            model, 0.5, method=method, sequential=sequential, calibration=calibration
        )
        found.append({k: v for k, v in model.state_dict().items() if k.startswith("layers.")})
    assert found[0].keys() == found[1].keys()
    for key in found[0]:
        assert torch.equal(found[0][key], found[1][key]), key
