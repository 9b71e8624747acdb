"""The tensors a criterion is given (Wanda's norms, Taylor's saliency; one tensor or a
mapping to them) are refused when made if they hold no values a ranking can read: a meta
tensor, a sparse one, a complex one. The error names the criterion and what was given (and,
for a mapping, its key), and no torch error comes out of a later pruning."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

import prunekit as prune
from prunekit.core.errors import is_explained

SHAPE = (3, 4)

MAKERS: dict[str, Callable[[object], prune.Criterion]] = {
    "Wanda-norms": prune.Wanda,  # type: ignore[dict-item]
    "Taylor-saliency": prune.Taylor,  # type: ignore[dict-item]
}


def given(kind: str, shape: tuple[int, ...]) -> Tensor:
    if kind == "meta":
        return torch.ones(shape, device="meta")
    if kind == "sparse":
        return torch.ones(shape).to_sparse()
    return torch.ones(shape, dtype=torch.complex64)


KINDS = [("meta", ValueError, "is a meta tensor"), ("sparse", ValueError, "is a sparse tensor"),
         ("complex", TypeError, "has dtype torch.complex64; expected a real dtype")]  # fmt: skip


@pytest.mark.parametrize("maker", MAKERS)
@pytest.mark.parametrize(("kind", "error", "message"), KINDS)
def test_a_tensor_without_rankable_values_is_refused_when_made(
    maker: str, kind: str, error: type[Exception], message: str
) -> None:
    owner, what = maker.split("-")
    shape = (SHAPE[1],) if owner == "Wanda" else SHAPE
    with pytest.raises(error) as raised:
        MAKERS[maker](given(kind, shape))
    assert str(raised.value).startswith(f"{owner}: {what} {message}"), str(raised.value)
    assert is_explained(raised.value)


@pytest.mark.parametrize("maker", MAKERS)
@pytest.mark.parametrize(("kind", "error", "message"), KINDS)
def test_a_mapping_names_the_key_of_the_bad_tensor(
    maker: str, kind: str, error: type[Exception], message: str
) -> None:
    owner, what = maker.split("-")
    layer = nn.Linear(SHAPE[1], SHAPE[0])
    shape = (SHAPE[1],) if owner == "Wanda" else SHAPE
    key: object = layer if owner == "Wanda" else (layer, "weight")
    good = torch.ones(shape)
    with pytest.raises(error) as raised:
        MAKERS[maker]({"first": good, key: given(kind, shape)})
    text = str(raised.value)
    assert text.startswith(f"{owner}: {what} for {key!r:.60} {message}"), text


@pytest.mark.parametrize("maker", MAKERS)
def test_real_dense_tensors_still_rank(maker: str) -> None:
    owner = maker.split("-")[0]
    torch.manual_seed(0)
    layer = nn.Linear(SHAPE[1], SHAPE[0])
    values = torch.arange(1.0, 5.0) if owner == "Wanda" else torch.arange(12.0).reshape(SHAPE)
    prune.Pruning.apply(layer, "weight", 0.5, criterion=MAKERS[maker](values))
    assert int((layer.get_buffer("weight_mask") == 0).sum()) == 6
