"""Hostile cases for the selections: the patterns (Unstructured, PerRow, NM, Channels) through
the drop-in and global_unstructured, prune_channels' shares under round_to, a sharded
checkpoint pruned whole, the report of what a model holds, and the same over a process group
of one rank. The counts are counted here, entry by entry, against references written apart
from the code they check."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from hostile.support import refused
from prunekit.io.sharded import INDEX, prune_sharded
from prunekit.io.statedict import prune_state_dict

# --- references ---------------------------------------------------------------------------


def holder(w: torch.Tensor) -> nn.Module:
    """A module holding `w` (a copy) as its parameter 'weight'."""
    module = nn.Module()
    module.weight = nn.Parameter(w.detach().clone())
    return module


def joint(
    tensors: list[torch.Tensor], amount: float, alive: list[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """Each tensor's kept entries (bool) when the `amount` smallest |values| of all of them go,
    ranked as float64 in one stable sort over the tensors concatenated in order; an `alive`
    entry that is False stays pruned and does not compete."""
    values = torch.cat([t.detach().double().abs().reshape(-1) for t in tensors])
    live = torch.cat(
        [
            torch.ones(t.numel(), dtype=torch.bool) if alive is None else alive[i].reshape(-1)
            for i, t in enumerate(tensors)
        ]
    )
    where = live.nonzero().reshape(-1)
    k = amount if isinstance(amount, int) else round(amount * len(where))
    order = torch.sort(values[where], stable=True).indices[:k]
    chosen = torch.zeros(values.numel(), dtype=torch.bool)
    chosen[where[order]] = True
    sizes = [t.numel() for t in tensors]
    return [
        (~c & keep).reshape(t.shape)
        for c, keep, t in zip(chosen.split(sizes), live.split(sizes), tensors, strict=True)
    ]


# --- Unstructured: counts, ties and formats ------------------------------------------------

FORMATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def tied_values(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integers (ties everywhere) with zeros of both signs, in `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randint(-3, 4, shape, generator=generator).to(dtype)
    return torch.where(torch.rand(shape, generator=generator) < 0.3, -0.0, w).to(dtype)


@pytest.mark.parametrize("dtype", FORMATS, ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["fresh", "masked"])
def test_every_amount_prunes_what_a_stable_sort_chooses(dtype: torch.dtype, masked: bool) -> None:
    """l1_unstructured on one tensor and global_unstructured over tensors of very different
    sizes prune exactly the entries one stable sort of the magnitudes chooses (ties to the
    earlier tensor, then the lower index; -0.0 equal to 0.0), counted here, for every amount
    from none to all; entries pruned before stay pruned and are not counted again."""
    shapes = [(1,), (60, 50), (3,), (0, 4)]
    values = [tied_values(shape, dtype, i) for i, shape in enumerate(shapes)]
    generator = torch.Generator().manual_seed(9)
    alive = [
        torch.rand(v.shape, generator=generator) > 0.4 if masked else torch.ones_like(v).bool()
        for v in values
    ]
    competing = sum(int(a.sum()) for a in alive)
    for amount in [0, 1, 0.0, 0.01, 0.5, 0.99, 1.0, competing - 1, competing]:
        modules = [holder(v) for v in values]
        for module, a in zip(modules, alive, strict=True):
            if masked:
                prunekit.custom_from_mask(module, "weight", a.to(dtype))
        pairs = [(m, "weight") for m in modules]
        prunekit.global_unstructured(pairs, prunekit.L1Unstructured, amount=amount)
        for module, kept in zip(modules, joint(values, amount, alive), strict=True):
            assert torch.equal(module.weight_mask.bool(), kept), amount
        chosen = sum(int((m.weight_mask == 0).sum()) for m in modules)
        masked_before = sum(int((~a).sum()) for a in alive)
        want = amount if isinstance(amount, int) else round(amount * competing)
        assert chosen - masked_before == want, amount
    big = holder(values[1])
    if masked:
        prunekit.custom_from_mask(big, "weight", alive[1].to(dtype))
    left = int(alive[1].sum())
    for amount in [0, 1, left // 3, 0.3, left]:
        one = holder(values[1])
        if masked:
            prunekit.custom_from_mask(one, "weight", alive[1].to(dtype))
        prunekit.l1_unstructured(one, "weight", amount)
        assert torch.equal(one.weight_mask.bool(), joint([values[1]], amount, [alive[1]])[0])
    refused(
        lambda: prunekit.l1_unstructured(big, "weight", left + 1),
        ValueError,
        rf"parameter 'weight' of Module: L1Unstructured: amount={left + 1} is more than the "
        rf"{left} units available to prune; expected a count <= {left}",
        model=big,
    )


def test_a_count_one_above_all_entries_changes_nothing() -> None:
    """A global count one above the entries of all tensors is refused by global_unstructured,
    naming the count and how many there are, and no tensor is pruned."""
    modules = nn.ModuleList([holder(torch.randn(3, 4)), holder(torch.randn(5))])
    pairs = [(m, "weight") for m in modules]
    refused(
        lambda: prunekit.global_unstructured(pairs, prunekit.L1Unstructured, amount=18),
        ValueError,
        r"^global_unstructured: L1Unstructured: amount=18 is more than the 17 units",
        model=modules,
    )


# --- NM and PerRow: edges ---------------------------------------------------------------------


@pytest.mark.parametrize(("n", "m", "dim"), [(2, 4, 1), (1, 4, 0), (3, 4, -1), (1, 2, 2)])
def test_nm_keeps_at_most_n_of_every_m_along_its_dim(n: int, m: int, dim: int) -> None:
    """Every group of m consecutive entries along `dim` keeps its n largest magnitudes
    (ties to the lower index), counted here group by group, in a 3-D tensor."""
    w = tied_values((8, 8, 4), torch.float32, 5)
    module = holder(w)
    prunekit.Pruning.apply(module, "weight", amount=(m - n) / m, pattern=prunekit.NM(n, m, dim))
    groups = module.weight_mask.movedim(dim, -1).reshape(-1, m)
    scores = w.abs().movedim(dim, -1).reshape(-1, m)
    for kept, score in zip(groups, scores, strict=True):
        order = sorted(range(m), key=lambda i: (float(score[i]), i))
        assert [int(kept[i]) for i in order] == [0] * (m - n) + [1] * n


@pytest.mark.parametrize(
    ("shape", "pattern", "amount", "error", "match"),
    [
        ((4, 6), prunekit.NM(2, 4), 0.5, ValueError, r"size 6 \(shape \(4, 6\)\) is not a "
         r"multiple of 4; expected a size divisible by 4"),
        ((4, 8), prunekit.NM(2, 4), 0.25, ValueError, r"invalid amount=0\.25 for NM\(2, 4\)"),
        ((4, 8), prunekit.NM(2, 4), 2, ValueError, r"invalid amount=2 for NM\(2, 4\)"),
        ((4, 8), prunekit.NM(2, 4, dim=2), 0.5, IndexError, r"dim=2 is out of range"),
        ((5, 1), prunekit.PerRow(), 2, ValueError, r"amount=2 is more than the 1 units"),
        ((8,), prunekit.PerRow(), 0.5, ValueError, r"per-row pruning needs rows"),
    ],
    ids=["nm-not-divisible", "nm-amount", "nm-count", "nm-dim", "row-count", "row-1d"],
)  # fmt: skip
def test_nm_and_per_row_refuse_by_the_parameter(
    shape: tuple[int, ...], pattern: prunekit.Pattern, amount: float, error: type, match: str
) -> None:
    """A shape or amount the pattern cannot take is refused naming the parameter, the value
    and what is allowed, and nothing changes."""
    module = holder(torch.randn(shape))
    refused(
        lambda: prunekit.Pruning.apply(module, "weight", amount=amount, pattern=pattern),
        error,
        r"^parameter 'weight' of Module: Pruning: .*" + match,
        model=module,
    )


@pytest.mark.parametrize(("n", "m"), [(4, 4), (5, 4), (0, 4), (2, 0)])
def test_nm_refuses_n_not_below_m_when_made(n: int, m: int) -> None:
    with pytest.raises(
        ValueError, match=rf"^NM: invalid n={n}, m={m}; expected ints with 1 <= n < m"
    ):
        prunekit.NM(n, m)


@pytest.mark.parametrize(
    ("amount", "pruned"), [(0.5, 0), (0.4, 0), (0.6, 5), (1.0, 5), (1, 5), (0, 0)]
)
def test_rows_of_one_entry(amount: float, pruned: int) -> None:
    """Rows of one entry: a fraction rounds as Python's round does (0.5 -> 0, ties to even),
    a count of 1 prunes every row."""
    module = holder(torch.randn(5, 1))
    prunekit.Pruning.apply(module, "weight", amount=amount, pattern=prunekit.PerRow())
    assert int((module.weight == 0).sum()) == pruned


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (3, 0, 4)], ids=str)
@pytest.mark.parametrize(
    "pattern",
    [prunekit.Unstructured(), prunekit.PerRow(), prunekit.NM(2, 4), prunekit.Channels(dim=0)],
    ids=repr,
)
def test_empty_tensors_prune_nothing(shape: tuple[int, ...], pattern: prunekit.Pattern) -> None:
    amount = getattr(pattern, "fraction", 0.5)
    module = holder(torch.zeros(shape))
    prunekit.Pruning.apply(module, "weight", amount=amount, pattern=pattern)
    assert module.weight_mask.shape == shape and module.weight.shape == shape


# --- prune_channels: a global share under round_to --------------------------------------------


def two_layers() -> nn.Module:
    """Two hidden widths of 16 channels each whose scores differ in scale (the second
    spreads wider), then a head."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)
    )
    with torch.no_grad():
        model[0].weight.mul_(torch.linspace(0.5, 1.5, 16)[:, None])
        model[2].weight.mul_(torch.linspace(0.2, 2.0, 16)[:, None])
    return model


def removed_channels(model: nn.Module) -> list[int]:
    """Output channels whose every weight is masked, per hidden layer (counted here)."""
    found = []
    for layer in (model[0], model[2]):
        mask = getattr(layer, "weight_mask", torch.ones_like(layer.weight))
        found.append(int((mask.sum(dim=1) == 0).sum()))
    return found


@pytest.mark.parametrize("round_to", [2, 4, 8])
@pytest.mark.parametrize("amount", [0.25, 0.3, 0.5])
def test_a_global_share_under_round_to_removes_what_was_asked(round_to: int, amount: float) -> None:
    """scope='global' with round_to removes round(amount x all channels), as near as whole
    steps allow (here: the largest multiple of round_to not above it), each width kept a
    multiple of round_to. Each layer's share of the joint ranking was rounded down to its
    step on its own: 0.25 of 32 with round_to=8 removed none of the 8 asked."""
    model = two_layers()
    prunekit.prune_channels(model, torch.randn(5, 8), amount, scope="global", round_to=round_to)
    removed = removed_channels(model)
    asked = round(amount * 32)
    assert sum(removed) == asked // round_to * round_to, removed
    assert all((16 - r) % round_to == 0 and 16 - r >= round_to for r in removed), removed


def test_a_global_share_passes_a_layers_last_channel_to_the_next_in_rank() -> None:
    """A layer keeps one channel even where all of its channels rank inside the share: the
    one it keeps goes to the next channel in the joint ranking, so the share asked still goes
    (14 of 18). It was dropped from the count: 13 went."""
    model = nn.Sequential(nn.Linear(4, 12), nn.ReLU(), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 2))
    ranked = {12: torch.zeros(12), 6: torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])}
    prunekit.prune_channels(
        model, torch.randn(3, 4), 0.75, scope="global", criterion=lambda g: ranked[g.size]
    )
    removed = [int((layer.weight_mask.sum(dim=1) == 0).sum()) for layer in (model[0], model[2])]
    assert removed == [11, 3]


@pytest.mark.parametrize("round_to", [2, 3, 4, 8])
@pytest.mark.parametrize("amount", [0.1, 0.25, 0.5, 0.9])
def test_a_global_share_over_uneven_widths_is_the_nearest_the_steps_allow(
    round_to: int, amount: float
) -> None:
    """Widths that are no multiple of round_to (10, 16, 7): the nearest total to round(amount
    x 33) that whole steps allow without passing it (found here by trying every width each
    layer may keep) goes, each width kept a multiple of round_to (or whole), at least
    round_to of it. Steps taken in the order of their mean score alone stopped short: a first
    step of 2 of the 10 channels taken early left no room for a step of 8 (2 of 8 asked)."""
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Linear(8, 10), nn.ReLU(), nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 7), nn.ReLU(),
        nn.Linear(7, 3),
    )  # fmt: skip
    prunekit.prune_channels(model, torch.randn(5, 8), amount, scope="global", round_to=round_to)
    removed = []
    for layer in (model[0], model[2], model[4]):
        mask = getattr(layer, "weight_mask", torch.ones_like(layer.weight))
        removed.append(int((mask.sum(dim=1) == 0).sum()))
    for size, gone in zip((10, 16, 7), removed, strict=True):
        kept = size - gone
        assert gone == 0 or (kept % round_to == 0 and kept >= round_to), removed
    each = [[size - keep for keep in range(round_to, size, round_to)] + [0] for size in (10, 16, 7)]
    asked = round(amount * 33)
    totals = {sum(parts) for parts in itertools.product(*each)}
    assert sum(removed) == max(t for t in totals if t <= asked), removed


# --- PerRow and NM: entries pruned before ---------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=str)
@pytest.mark.parametrize("scored", [False, True], ids=["values", "importance-scores"])
@pytest.mark.parametrize(
    "pattern",
    [prunekit.PerRow(), prunekit.PerRow(dim=1), prunekit.NM(2, 4), prunekit.NM(1, 3, dim=0)],
    ids=repr,
)
def test_what_lies_behind_a_mask_does_not_compete(
    pattern: prunekit.Pattern, scored: bool, bad: float
) -> None:
    """PerRow and NM rank only the entries still unpruned, as Unstructured does: a NaN or
    infinity where the mask is 0 (in the values or the importance scores) changes nothing;
    it was refused as 'the scores hold 1 value(s) that cannot be ranked'."""
    generator = torch.Generator().manual_seed(4)
    w = torch.randn(6, 12, generator=generator)
    scores = torch.rand(6, 12, generator=generator)
    mask = (torch.rand(6, 12, generator=generator) > 0.25).float()
    mask[0, 0] = 0.0
    results = []
    for poisoned in (False, True):
        module = holder(w)
        prunekit.custom_from_mask(module, "weight", mask)
        given = scores.clone() if scored else None
        if poisoned:
            target = given if given is not None else module.weight_orig.data
            target[0, 0] = bad
        amount = getattr(pattern, "fraction", 0.5)  # NM's is fixed: (m - n) / m
        prunekit.Pruning.apply(module, "weight", amount=amount, pattern=pattern,
                               importance_scores=given)  # fmt: skip
        results.append(module.weight_mask.clone())
    assert torch.equal(results[0], results[1])
    assert torch.equal(results[1] * mask, results[1])  # pruned before: pruned still


def test_what_competes_is_still_checked() -> None:
    """A NaN where the mask is 1 is still refused, by its index, and nothing changes."""
    module = holder(torch.randn(4, 8))
    prunekit.custom_from_mask(module, "weight", torch.ones(4, 8))
    with torch.no_grad():
        module.weight_orig[2, 5] = math.nan
    refused(
        lambda: prunekit.Pruning.apply(module, "weight", amount=0.5, pattern=prunekit.PerRow()),
        ValueError,
        r"cannot be ranked, e\.g\. nan at index \(2, 5\)",
        model=module,
    )


# --- Channels: norms of 16-bit weights --------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_channel_norms_past_the_range_of_16_bits_still_rank(dtype: torch.dtype, n: int) -> None:
    """Finite float16 weights whose channel norms pass 65504 are ranked by those norms (as
    float32 weights would be): the L1 norms overflowed to inf in float16 and the pruning was
    refused as 'the channel norms hold inf', of weights that hold none."""
    torch.manual_seed(0)
    scale = torch.tensor([0.5, 1.0, 1.2, 0.7])[:, None]
    w = (torch.randn(4, 3000) * 300 * scale).to(dtype)
    assert torch.isfinite(w).all()
    module = holder(w)
    prunekit.ln_structured(module, "weight", 2, n=n, dim=0)
    norms = torch.linalg.vector_norm(w.double(), n, dim=1)
    want = torch.ones(4, dtype=torch.bool)
    want[norms.argsort()[:2]] = False
    assert torch.equal(module.weight_mask.bool().all(dim=1), want)
    assert int((module.weight == 0).sum()) == 2 * 3000


def test_channel_norms_of_weights_that_hold_inf_are_still_refused() -> None:
    """The widening is for sums past 16 bits only: an inf among the weights is refused."""
    w = torch.ones(4, 8, dtype=torch.float16)
    w[1, 3] = math.inf
    module = holder(w)
    refused(
        lambda: prunekit.ln_structured(module, "weight", 1, n=1, dim=0),
        ValueError,
        "cannot be ranked",
        model=module,
    )


@pytest.mark.parametrize("n", [1, 2, math.inf, -math.inf, "fro", "nuc"])
def test_channels_ranked_by_integer_importance_scores(n: float | str) -> None:
    """Integer importance scores (which the check lets through) rank channels by their norms
    as the same scores in float64 do; ln_structured raised torch's raw 'linalg.vector_norm:
    Expected a floating point or complex tensor as input. Got Long'."""
    scores = torch.tensor(
        [[[3, -1], [2, 0]], [[1, 1], [1, 1]], [[5, -5], [0, 2]], [[0, 0], [0, 1]]]
    )
    w = torch.randn(4, 2, 2)
    ours, theirs = holder(w), holder(w)
    prunekit.ln_structured(ours, "weight", 2, n=n, dim=0, importance_scores=scores)
    prunekit.ln_structured(theirs, "weight", 2, n=n, dim=0, importance_scores=scores.double())
    assert torch.equal(ours.weight_mask, theirs.weight_mask)
    assert int((ours.weight_mask.reshape(4, -1).sum(dim=1) == 0).sum()) == 2


# --- report: what a model or a state_dict holds -----------------------------------------------


def test_report_counts_the_zeros_of_a_pruned_model_of_every_float_format() -> None:
    """Each row's zeros are the entries of mask x orig that are zero (-0.0 and a value below
    the format's smallest counted as such), the totals their sums; a state_dict's rows are
    the model's."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        layer = nn.Linear(4, 3).to(dtype)
        values = [[0.0, -0.0, 1.0, 2.0], [3.0, 4.0, 5.0, 6.0], [7.0, -0.0, 9.0, 1e-30]]
        with torch.no_grad():
            layer.weight.copy_(torch.tensor(values).to(dtype))
            layer.bias.copy_(torch.tensor([0.0, -0.0, 1.0]).to(dtype))
        prunekit.l1_unstructured(layer, "weight", 5)
        found = prunekit.report(layer)
        weight = layer.weight_orig.detach() * layer.weight_mask
        assert found["weight"].zeros == sum(float(v) == 0 for v in weight.reshape(-1)), dtype
        assert found["bias"].zeros == 2
        assert found.zeros == found["weight"].zeros + 2 and found.numel == 15
        rows = prunekit.report(layer.state_dict()).rows
        assert [(r.name, r.zeros, r.numel) for r in rows] == [
            (r.name, r.zeros, r.numel) for r in found.rows
        ]


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"w": torch.zeros(2, 3, device="meta")}, r"report: tensor 'w' is a meta tensor"),
        ({"w": torch.eye(3).to_sparse()}, r"report: tensor 'w' is a sparse tensor"),
        (
            {"w_orig": torch.ones(3, 4), "w_mask": torch.ones(5)},
            r"report: the mask 'w_mask' has shape \(5,\); expected the shape of 'w_orig', "
            r"\(3, 4\)",
        ),
    ],
    ids=["meta", "sparse", "mask-of-another-shape"],
)
def test_report_names_a_tensor_it_cannot_count(state: dict[str, torch.Tensor], match: str) -> None:
    """A tensor without values (meta), of a layout not counted (sparse), or a mask of another
    shape than its tensor's is named, with what is expected; these raised torch's raw
    'Tensor.item() cannot be called on meta tensors', 'Cannot access storage of
    SparseTensorImpl' and 'The size of tensor a (4) must match the size of tensor b (5)'."""
    refused(lambda: prunekit.report(state), ValueError, match)


def test_report_of_a_model_on_the_meta_device_names_its_first_tensor() -> None:
    """A model made on the meta device (its parameters shapes only) is refused by the name
    of its first parameter, not with torch's raw error."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 3))
    refused(lambda: prunekit.report(model), ValueError, r"report: tensor '0\.weight' is a meta")


def test_prune_model_refuses_a_model_it_cannot_report_before_pruning() -> None:
    """prune_model returns the report of the whole model: a parameter on the meta device
    (left out of the pruning) is refused before any layer is pruned; the layer named in
    `include` was pruned, then the report raised torch's raw error."""
    model = nn.Sequential(nn.Linear(4, 4))
    with torch.device("meta"):
        model.append(nn.Linear(4, 4))
    refused(
        lambda: prunekit.prune_model(model, 0.5, method="l1", include=["0.weight"]),
        ValueError,
        r"report: tensor '1\.weight' is a meta tensor",
        model=model,
    )


# --- prune_state_dict: a state_dict of a model with tied weights ---------------------------


class Tied(nn.Module):
    """An embedding and a head that share one weight, and a layer of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(2, 3)
        self.head = nn.Linear(3, 2, bias=False)
        self.head.weight = self.embed.weight
        self.mid = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.embed.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
            self.mid.weight.copy_(torch.tensor([[2.5, 7.0]]))


@pytest.mark.parametrize("amount", [1, 3, 4, 0.5])
def test_a_tied_weight_in_a_state_dict_is_ranked_once(amount: float) -> None:
    """A model's state_dict lists a tied weight under each of its names, one storage: it is
    ranked once and masked alike under each name, as prune_model ranks the model itself.
    Each name was ranked as a tensor of its own, its entries counted twice: with 3 entries
    asked, 'embed.weight' lost 1 and 2, 'head.weight' 1 alone, and 'mid.weight' nothing."""
    model = Tied()
    result = prune_state_dict(model.state_dict(), amount, method="l1", scope="global")
    prunekit.prune_model(model, amount, method="l1", scope="global")
    assert list(result.state) == ["embed.weight", "head.weight", "mid.weight"]
    for name, tensor in result.state.items():
        layer, _ = name.split(".")
        assert torch.equal(tensor, model.get_submodule(layer).weight), name
    assert torch.equal(result.state["embed.weight"], result.state["head.weight"])


def test_a_tied_weight_drawn_at_random_gets_one_draw() -> None:
    """'random' in scope 'layer' draws once for a tied weight: both names get one mask."""
    result = prune_state_dict(Tied().state_dict(), 0.5, method="random", seed=0)
    embed, head = result.state["embed.weight"], result.state["head.weight"]
    assert torch.equal(embed, head) and int((embed == 0).sum()) == 3


# --- prune_sharded: a checkpoint in shards -----------------------------------------------------


def shards(folder: Path, state: dict[str, torch.Tensor], files: list[list[str]]) -> Path:
    """The tensors of `state` in the shard files `files` lists (names per file), and an index
    in the order of `state`."""
    from safetensors.torch import save_file

    folder.mkdir()
    where = {}
    for number, names in enumerate(files, 1):
        file = f"model-{number:05d}-of-{len(files):05d}.safetensors"
        save_file({n: state[n] for n in names}, str(folder / file), metadata={"format": "pt"})
        where.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": 0}, "weight_map": {n: where[n] for n in state}}
    (folder / INDEX).write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("scope", ["layer", "global"])
@pytest.mark.parametrize("excluded", [False, True], ids=["pruned", "left"])
@pytest.mark.parametrize("shape", [(12,), (2, 6), (4,)], ids=str)
def test_a_saved_mask_of_another_shape_is_refused_as_in_memory(
    tmp_path: Path, scope: str, excluded: bool, shape: tuple[int, ...]
) -> None:
    """A ``_mask`` of another shape than its ``_orig`` is refused by name, as prune_state_dict
    refuses it, before the output changes: it was applied flat (a 12-entry mask of any shape
    silently reshaped, even written back so with keep_masks), or raised torch's raw 'The size
    of tensor a (12) must match the size of tensor b (4)'."""
    mask = torch.ones(shape)
    state = {"a.weight": torch.randn(4, 4), "w_orig": torch.randn(3, 4), "w_mask": mask}
    folder = shards(tmp_path / "in", state, [["a.weight", "w_orig"], ["w_mask"]])
    out = tmp_path / "out"
    options: dict[str, Any] = {"method": "l1", "scope": scope}
    if excluded:
        options["exclude"] = ["w"]
    message = rf"tensor 'w': the mask 'w_mask' has shape \({shape[0]},"
    with pytest.raises(ValueError, match=message):
        prune_state_dict(dict(state), 0.5, **options)
    refused(
        lambda: prune_sharded(folder, out, 0.5, **options), ValueError, message, paths=(folder, out)
    )


# --- a process group of one rank --------------------------------------------------------------


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A gloo group of this process alone (the default group, made here and destroyed after)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed with no default group yet")
    folder = tmp_path_factory.mktemp("one-rank")
    dist.init_process_group(
        "gloo",
        init_method=f"file://{folder}/rendezvous",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
    )
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def layers(masked: bool) -> list[nn.Module]:
    """Tensors of very different sizes and of every float format, with ties everywhere (small
    integers, zeros of both signs); with `masked`, some entries pruned before."""
    generator = torch.Generator().manual_seed(3)
    found = []
    formats = [
        ((1,), torch.float16),
        ((40, 30), torch.float32),
        ((5,), torch.bfloat16),
        ((0,), torch.float64),
        ((7, 3), torch.float64),
    ]
    for shape, dtype in formats:
        w = torch.randint(-3, 4, shape, generator=generator).to(dtype)
        w = torch.where(torch.rand(shape, generator=generator) < 0.2, -0.0, w)
        module = holder(w)
        if masked:
            alive = torch.rand(shape, generator=generator) > 0.3
            prunekit.custom_from_mask(module, "weight", alive.to(dtype))
        found.append(module)
    return found


@pytest.mark.parametrize("masked", [False, True], ids=["fresh", "masked"])
@pytest.mark.parametrize("amount", [0, 1, 0.0, 0.37, 0.5, 1.0, 600])
def test_one_rank_ranks_as_one_process(one_rank: Any, masked: bool, amount: float) -> None:
    """global_unstructured over a group of one rank prunes what it prunes without one, and
    both what a stable sort of all the magnitudes (as float64) chooses: ties to the earlier
    tensor, then the lower index; entries pruned before stay pruned and do not compete."""
    alone, ranked = layers(masked), layers(masked)
    before = [m.weight.detach().clone() for m in alone]
    alive = [getattr(m, "weight_mask", torch.ones_like(m.weight)).bool() for m in alone]
    prunekit.global_unstructured([(m, "weight") for m in alone], prunekit.L1Unstructured,
                                 amount=amount)  # fmt: skip
    prunekit.global_unstructured([(m, "weight") for m in ranked], prunekit.L1Unstructured,
                                 amount=amount, process_group=one_rank)  # fmt: skip
    want = joint(before, amount, alive)
    for a, b, kept in zip(alone, ranked, want, strict=True):
        assert torch.equal(a.weight_mask.bool(), kept) and torch.equal(b.weight_mask.bool(), kept)
        assert a.weight_mask.dtype == b.weight_mask.dtype == a.weight.dtype


def test_one_rank_refuses_a_count_above_all_entries_by_the_function(one_rank: Any) -> None:
    """A count above the entries of all ranks is refused naming global_unstructured, as it is
    without a group (the message began with 'L1Unstructured:')."""
    modules = layers(False)
    total = sum(m.weight.numel() for m in modules)
    pairs = [(m, "weight") for m in modules]
    refused(
        lambda: prunekit.global_unstructured(
            pairs, prunekit.L1Unstructured, amount=total + 1, process_group=one_rank
        ),
        ValueError,
        rf"^global_unstructured: L1Unstructured: amount={total + 1} is more than the "
        rf"{total} units",
        model=nn.ModuleList(modules),
    )


def test_statistics_of_one_rank_are_its_own_as_new_tensors(one_rank: Any) -> None:
    """all_reduce_statistics over one rank gives each statistic's values (weighted or not,
    -0.0 and NaN as they are) in new tensors of the same dtype, the inputs untouched."""
    given = {
        "h": torch.tensor([[1.5, -0.0], [math.nan, 6e4]], dtype=torch.float16),
        "c": torch.tensor([3.0, -2.0], dtype=torch.float64),
    }
    kept = {k: v.clone() for k, v in given.items()}
    for weight in (None, 3.0, {"h": 0.5}):
        found = prunekit.all_reduce_statistics(given, one_rank, weight=weight)
        assert list(found) == list(given)
        for name, value in given.items():
            got = found[name]
            assert got.dtype == value.dtype and got.data_ptr() != value.data_ptr()
            assert torch.equal(bits(got), bits(value)), (name, weight)
            assert torch.equal(bits(value), bits(kept[name]))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of a float tensor (NaN equal to itself, -0.0 apart from 0.0)."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def weights(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """Three tensors in three shards, tied values across two of them (equal copies)."""
    torch.manual_seed(0)
    embed = torch.randn(4, 6)
    state = {"embed.weight": embed, "mid.weight": torch.randn(6, 3), "head.weight": embed.clone()}
    files = [["embed.weight"], ["mid.weight"], ["head.weight"]]
    return shards(tmp_path / "in", state, files), state


@pytest.mark.parametrize("scope", ["layer", "global"])
@pytest.mark.parametrize("amount", [0, 1, 17, 0.5, 1.0, 48])
def test_sharded_equals_the_state_dict_in_memory(tmp_path: Path, scope: str, amount: float) -> None:
    """Shards pruned as prune_state_dict prunes the same tensors in one dict, bit for bit,
    every amount up to all of them; equal copies in two shards (no storage to share) are
    ranked apart, ties to the earlier in the index, as in memory."""
    from safetensors.torch import load_file

    if scope == "layer" and amount in (17, 48):  # a count per tensor: at most 18 here
        amount = 5
    folder, state = weights(tmp_path)
    result = prune_sharded(folder, tmp_path / "out", amount, method="l1", scope=scope)
    want = prune_state_dict(state, amount, method="l1", scope=scope).state
    index = json.loads((tmp_path / "out" / INDEX).read_text())
    assert list(index["weight_map"]) == list(state)
    got = {n: load_file(str(tmp_path / "out" / f))[n] for n, f in index["weight_map"].items()}
    for name in state:
        assert torch.equal(bits(got[name]), bits(want[name])), name
    assert result.zeros == sum(int((t == 0).sum()) for t in want.values())
    assert result.numel == 66


def test_an_index_naming_a_shard_without_the_tensor_is_refused(tmp_path: Path) -> None:
    """The index says a tensor is in a shard that does not hold it: refused by name, and
    the output folder is not made."""
    folder, _ = weights(tmp_path)
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"]["mid.weight"] = index["weight_map"]["head.weight"]
    (folder / INDEX).write_text(json.dumps(index))
    out = tmp_path / "out"
    refused(
        lambda: prune_sharded(folder, out, 0.5, method="l1", scope="global"),
        ValueError,
        r"'mid\.weight' is not in model-00003-of-00003\.safetensors, where the index says",
        paths=(folder, out),
    )


def test_a_tensor_the_index_leaves_out_of_a_listed_shard_is_kept(tmp_path: Path) -> None:
    """A tensor of a listed shard that the index leaves out still belongs: pruned, written,
    and listed in the new index (after the listed ones)."""
    folder, state = weights(tmp_path)
    index = json.loads((folder / INDEX).read_text())
    del index["weight_map"]["mid.weight"]
    index["weight_map"]["stray.weight"] = index["weight_map"].pop("embed.weight")
    from safetensors.torch import save_file

    shard = folder / index["weight_map"]["stray.weight"]
    save_file({"embed.weight": state["embed.weight"], "stray.weight": torch.ones(2, 2)}, str(shard))
    index["weight_map"]["mid.weight"] = "model-00002-of-00003.safetensors"
    (folder / INDEX).write_text(json.dumps(index))
    result = prune_sharded(folder, tmp_path / "out", 0.5, method="l1")
    written = json.loads((tmp_path / "out" / INDEX).read_text())["weight_map"]
    assert set(written) == {"embed.weight", "mid.weight", "head.weight", "stray.weight"}
    assert set(result.pruned) == set(written)
