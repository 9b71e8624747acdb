"""Hostile cases for pruning across ranks (prunekit.distributed, global_unstructured with a
process_group), the ranks as threads of one process (tests/helpers/thread_group.py): each rank
gets the masks one process holding every tensor gets, and a refusal names the call and the
bad value as it does without a group."""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from helpers.thread_group import on_threads
from hostile.support import refused
from prunekit.core.errors import is_explained
from prunekit.distributed import all_reduce_statistics
from prunekit.distributed.collectives import Group

# --- models -----------------------------------------------------------------------------------


def layers(dtype: torch.dtype, behind: float | None = None) -> list[nn.Linear]:
    """Three Linear layers; the second pruned before (two entries of its first row), and with
    `behind`, those pruned entries holding that value (a weight gone bad after its pruning)."""
    torch.manual_seed(0)
    made = [nn.Linear(4, 5), nn.Linear(5, 3), nn.Linear(3, 4)]
    made = [m.to(dtype) for m in made]
    mask = torch.ones(3, 5, dtype=dtype)
    mask[0, :2] = 0
    prunekit.custom_from_mask(made[1], "weight", mask)
    if behind is not None:
        with torch.no_grad():
            made[1].weight_orig[0, :2] = behind
    return made


def masks_of(made: list[nn.Linear]) -> list[torch.Tensor]:
    return [m.weight_mask.clone() for m in made]


def one_process(
    made: list[nn.Linear], amount: float, scores: list[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """The masks global_unstructured gives `made` (a copy) in one process, with `scores` (one
    per layer) as its importance scores."""
    alone = copy.deepcopy(made)
    pairs: list[tuple[nn.Module, str]] = [(m, "weight") for m in alone]
    given = None if scores is None else dict(zip(pairs, scores, strict=True))
    prunekit.global_unstructured(pairs, prunekit.L1Unstructured, given, amount=amount)
    return masks_of(alone)


def assert_each_rank_holds(found: list[Any], want: list[torch.Tensor]) -> None:
    """Every rank's masks (`over_ranks`' result) are `want`'s, no rank raised."""
    for r, got in enumerate(found):
        assert isinstance(got, dict), f"rank {r}: {got}"
        for i, mask in got.items():
            assert torch.equal(mask, want[i]), f"rank {r}, layer {i}"


def over_ranks(made: list[nn.Linear], by_rank: tuple[int, ...], **kwargs: Any) -> list[Any]:
    """global_unstructured over two ranks, layer i listed by rank `by_rank[i]` (each rank a
    copy of the layers made before the threads start: torch's seed is one for all threads);
    each rank's masks of its layers, by index, or its error."""
    copies = [copy.deepcopy(made) for _ in range(2)]
    scores = kwargs.pop("scores", None)

    def rank(group: Group) -> Any:
        mine = copies[group.rank]
        listed = [i for i, r in enumerate(by_rank) if r == group.rank]
        given = None if scores is None else {(mine[i], "weight"): scores[i] for i in listed}
        try:
            prunekit.global_unstructured(
                [(mine[i], "weight") for i in listed],
                prunekit.L1Unstructured,
                given,
                process_group=group,
                **kwargs,
            )
        except Exception as error:  # what each rank raised is the result
            return error
        return {i: mine[i].weight_mask.clone() for i in listed}

    return on_threads(2, rank)


# --- what lies behind a mask ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("behind", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("by_rank", [(0, 1, 1), (1, 0, 0)], ids=["on-rank-1", "on-rank-0"])
def test_what_lies_behind_a_mask_does_not_compete_across_ranks(
    dtype: torch.dtype, behind: float, by_rank: tuple[int, ...]
) -> None:
    """Entries pruned before hold NaN or inf: they do not compete, so one process ranks the
    others and prunes; over ranks every rank raised 'the scores ... hold NaN or infinity,
    which cannot be ranked' (the check read the entries the mask had pruned)."""
    made = layers(dtype, behind)
    want = one_process(made, 0.5)
    assert_each_rank_holds(over_ranks(made, by_rank, amount=0.5), want)


def test_importance_scores_behind_a_mask_do_not_compete_across_ranks() -> None:
    """Importance scores that are NaN where the mask pruned: ranked as one process ranks
    them (there they never compete); over ranks every rank refused them."""
    made = layers(torch.float32)
    scores = [m.weight.detach().abs() + 1 for m in made]
    scores[1][0, :2] = math.nan
    want = one_process(made, 0.4, scores)
    assert_each_rank_holds(over_ranks(made, (0, 1, 1), amount=0.4, scores=scores), want)


def test_nan_that_competes_is_still_refused_on_every_rank() -> None:
    """A NaN in an entry still alive cannot be ranked: every rank raises, naming it, and no
    rank's model changes (the guard beside the fix above)."""
    made = layers(torch.float32)
    with torch.no_grad():
        made[2].weight[1, 1] = math.nan
    found = over_ranks(made, (0, 1, 1), amount=0.5)
    for r, error in enumerate(found):
        assert isinstance(error, ValueError), f"rank {r}: {error}"
        assert "hold NaN or infinity" in str(error) and "global_unstructured" in str(error)


# --- the method's arguments -------------------------------------------------------------------


class Buggy(prunekit.L1Unstructured):
    """A method whose constructor has a bug of its own: a TypeError from inside it."""

    def __init__(self, amount: float) -> None:
        super().__init__(amount)
        self.steps = len(amount)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("amount", "error", "match"),
    [
        (-1, ValueError, r"^global_unstructured: L1Unstructured: invalid amount=-1; expected"),
        (math.nan, ValueError, r"^global_unstructured: L1Unstructured: invalid amount=nan;"),
        (True, TypeError, r"^global_unstructured: L1Unstructured: invalid amount=True of type"),
    ],
    ids=["negative", "nan", "bool"],
)
def test_a_bad_amount_over_one_rank_is_named_as_without_a_group(
    amount: Any, error: type[Exception], match: str
) -> None:
    """Over a group of one rank the amount's refusal began 'L1Unstructured: invalid
    amount=-1' (no global_unstructured), or named L1Unstructured twice ('global_unstructured:
    L1Unstructured: L1Unstructured: invalid amount=True'); without a group it is named
    once, after the call."""
    made = layers(torch.float32)
    pairs = [(m, "weight") for m in made]
    model = nn.ModuleList(made)
    with pytest.raises(error, match=match):
        prunekit.global_unstructured(pairs, prunekit.L1Unstructured, amount=amount)
    refused(
        lambda: prunekit.global_unstructured(
            pairs, prunekit.L1Unstructured, amount=amount, process_group=Group()
        ),
        error,
        match,
        model=model,
    )


def test_a_bug_in_a_methods_constructor_is_not_made_the_callers_error() -> None:
    """A TypeError from inside a method's own constructor is a bug there: it travels as it
    is, as without a group; over ranks it was rewrapped as the caller's TypeError
    ('global_unstructured: Buggy: object of type 'float' has no len()')."""
    made = layers(torch.float32)
    pairs = [(m, "weight") for m in made]
    with pytest.raises(TypeError, match=r"^object of type 'float' has no len\(\)$") as alone:
        prunekit.global_unstructured(pairs, Buggy, amount=0.5)
    assert not is_explained(alone.value)
    with pytest.raises(TypeError, match=r"^object of type 'float' has no len\(\)$") as grouped:
        prunekit.global_unstructured(pairs, Buggy, amount=0.5, process_group=Group())
    assert not is_explained(grouped.value)
    assert not prunekit.is_pruned(made[0]) and not prunekit.is_pruned(made[2])


# --- all_reduce_statistics --------------------------------------------------------------------


def _meta() -> torch.Tensor:
    return torch.empty(3, 3, device="meta")


def _sparse() -> torch.Tensor:
    return torch.eye(3).to_sparse()


def _nested() -> torch.Tensor:
    with warnings.catch_warnings():  # torch's, once a process: nested tensors are a prototype
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])


@pytest.mark.parametrize(
    ("make", "words"),
    [(_meta, "a meta tensor"), (_sparse, "a sparse tensor"), (_nested, "a nested tensor")],
    ids=["meta", "sparse", "nested"],
)
@pytest.mark.parametrize("weight", [None, 2.0], ids=["summed", "weighted"])
def test_a_statistic_without_dense_values_is_named_on_every_rank(
    make: Any, words: str, weight: float | None
) -> None:
    """One rank's statistic on the meta device, sparse or nested: raw torch errors ('Cannot
    copy out of meta tensor; no data!', 'reshape is not implemented for sparse tensors',
    'NestedTensorImpl doesn't support sizes') raised as they were on that rank, a
    RuntimeError on the others, the statistic unnamed; now the caller's ValueError on every
    rank, naming it."""
    bad = make()

    def rank(group: Group) -> Any:
        statistics = {"h": bad if group.rank == 1 else torch.eye(3), "n": torch.ones(2)}
        try:
            return all_reduce_statistics(statistics, group, weight=weight)
        except Exception as error:  # what each rank raised is the result
            return error

    for r, error in enumerate(on_threads(2, rank)):
        assert isinstance(error, ValueError), f"rank {r}: {error!r}"
        assert "all_reduce_statistics" in str(error) and "rank(s) [1]" in str(error)
        assert f"statistics['h'] is {words}" in str(error), str(error)
    with pytest.raises(ValueError, match=rf"^all_reduce_statistics: statistics\['h'\] is {words}"):
        all_reduce_statistics({"h": bad}, Group(), weight=weight)


# --- importance scores and tensors a rank cannot rank -----------------------------------------


def _scores_of(kind: str, made: list[nn.Linear]) -> dict[tuple[nn.Module, str], torch.Tensor]:
    w = [m.weight.detach() for m in made]
    found = {
        "meta": [torch.empty(t.shape, device="meta") for t in w],
        "sparse": [t.to_sparse() for t in w],
        "bool": [t > 0 for t in w],
        "complex": [t.to(torch.complex64) for t in w],
    }[kind]
    return {(m, "weight"): s for m, s in zip(made, found, strict=True)}


@pytest.mark.parametrize(
    ("kind", "error", "match"),
    [
        ("meta", ValueError, r"importance_scores .*meta"),
        ("sparse", ValueError, r"importance_scores is a sparse tensor"),
        ("bool", TypeError, r"importance_scores have dtype torch\.bool; expected a real"),
        ("complex", TypeError, r"importance_scores have dtype torch\.complex64; expected a real"),
    ],
    ids=["scores-meta", "scores-sparse", "scores-bool", "scores-complex"],
)
def test_importance_scores_one_process_refuses_are_refused_over_ranks(
    kind: str, error: type[Exception], match: str
) -> None:
    """Scores without values (meta: the process crashed, a segmentation fault in the
    selection), sparse (raw 'reshape is not implemented for sparse tensors'), bool or
    complex ('Magnitude.scores returned Tensor of dtype torch.bool', the scores unnamed):
    refused naming the tensor and importance_scores, as without a group; nothing pruned."""
    made = layers(torch.float32)
    pairs = [(m, "weight") for m in made]
    with pytest.raises(error, match=match):
        prunekit.global_unstructured(
            pairs, prunekit.L1Unstructured, _scores_of(kind, made), amount=0.5
        )
    refused(
        lambda: prunekit.global_unstructured(
            pairs, prunekit.L1Unstructured, _scores_of(kind, made), amount=0.5,
            process_group=Group(),
        ),
        error,
        rf"parameter 'weight' of Linear: {match}",
        model=nn.ModuleList(made),
    )  # fmt: skip


def test_a_parameter_on_the_meta_device_is_refused_over_ranks() -> None:
    """A listed parameter without values: the process crashed (a segmentation fault in the
    selection); refused naming it, as without a group."""
    made = [m.to("meta") for m in layers(torch.float32)]
    pairs = [(m, "weight") for m in made]
    with pytest.raises(ValueError, match=r"meta tensor"):
        prunekit.global_unstructured(pairs, prunekit.L1Unstructured, amount=0.5)
    refused(
        lambda: prunekit.global_unstructured(
            pairs, prunekit.L1Unstructured, amount=0.5, process_group=Group()
        ),
        ValueError,
        r"parameter 'weight' of Linear: the parameter is a meta tensor",
        model=nn.ModuleList(made),
    )


def test_integer_importance_scores_rank_as_in_one_process() -> None:
    """Integer scores rank without a group; over ranks they were refused ('Magnitude.scores
    returned Tensor of dtype torch.int64', the scores unnamed)."""
    made = layers(torch.float32)
    scores = [(m.weight.detach() * 1000).round().to(torch.int64) for m in made]
    scores[0][0, :3] = 2**40 + torch.arange(3)  # apart only as integers past float32's 2**24
    want = one_process(made, 0.5, scores)
    assert_each_rank_holds(over_ranks(made, (0, 1, 0), amount=0.5, scores=scores), want)


@pytest.mark.parametrize(
    ("weights", "scores", "step"),
    [(torch.float32, torch.float64, 1e-12), (torch.bfloat16, torch.float32, 5e-5)],
    ids=["f64-scores-of-f32", "f32-scores-of-bf16"],
)
def test_scores_finer_than_their_tensor_rank_at_their_own_precision(
    weights: torch.dtype, scores: torch.dtype, step: float
) -> None:
    """Importance scores apart only in their own dtype (1 + i * step, all equal in the
    tensors' dtype), the later ones smallest: one process prunes the later entries; over
    ranks the scores were ranked in the tensors' dtype, all tied, and the earlier entries
    went (every mask of layer 0 the other way round), silently."""
    made = layers(weights)
    total = sum(m.weight.numel() for m in made)
    given, offset = [], 0
    for m in made:
        n = m.weight.numel()
        ranks = torch.arange(offset, offset + n, dtype=scores).view(m.weight.shape)
        given.append(1 + (total - ranks) * step)
        offset += n
    assert all(bool((s.to(weights) == 1).all()) for s in given)  # ties in the tensors' dtype
    want = one_process(made, 0.5, given)
    assert not bool(want[2].any())  # the last layer's entries are the smallest scores
    assert_each_rank_holds(over_ranks(made, (0, 1, 1), amount=0.5, scores=given), want)


# --- prune_model over ranks -------------------------------------------------------------------


def test_prune_model_over_ranks_names_itself_and_the_path() -> None:
    """prune_model(scope='global', process_group=...) ranks through global_unstructured's
    selection over ranks: its refusals named global_unstructured (not called) and the
    tensor without its path ('parameter 'weight' of Linear'); without a group they name
    prune_model and '1.weight'."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 3))
    with torch.no_grad():
        model[1].weight[0, 0] = math.nan
    with pytest.raises(ValueError, match=r"^prune_model: '1\.weight', parameter 'weight' of"):
        prunekit.prune_model(copy.deepcopy(model), 0.5, method="l1", scope="global")
    refused(
        lambda: prunekit.prune_model(
            model, 0.5, method="l1", scope="global", process_group=Group()
        ),
        ValueError,
        r"^prune_model: the scores of '1\.weight', parameter 'weight' of Linear hold NaN",
        model=model,
    )
