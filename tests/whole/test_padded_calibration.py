"""prune_model's calibration (wanda, sparsegpt; whole or block by block) leaves out the
tokens a batch's attention_mask masks out: a batch and the same tokens padded, right or
left, with the mask give the same masks and weights."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

import prunekit.calibrate as cal
from helpers.tiny_llm import folder_tensors, llama, sharded_folder
from prunekit import prune_model
from prunekit.calibrate import layer_matrices
from prunekit.io.streamed import prune_streamed

pytest.importorskip("transformers")

TOKENS, PAD, VOCAB = 12, 4, 300


def _batches(side: str | None) -> list[dict[str, torch.Tensor]]:
    """Three batches of two rows; `side`: where PAD tokens of random ids (not a pad id:
    what they hold must not count) go, masked out; 'ones': a mask keeping every token."""
    found = []
    for k in range(3):
        ids = torch.randint(0, VOCAB, (2, TOKENS), generator=torch.Generator().manual_seed(k))
        pads = torch.randint(0, VOCAB, (2, PAD), generator=torch.Generator().manual_seed(9 + k))
        ones, zeros = torch.ones_like(ids), torch.zeros_like(pads)
        if side is None:
            found.append({"input_ids": ids})
        elif side == "ones":
            found.append({"input_ids": ids, "attention_mask": ones})
        elif side == "right":
            found.append({"input_ids": torch.cat([ids, pads], 1),
                          "attention_mask": torch.cat([ones, zeros], 1)})  # fmt: skip
        else:
            found.append({"input_ids": torch.cat([pads, ids], 1),
                          "attention_mask": torch.cat([zeros, ones], 1)})  # fmt: skip
    return found


def _pruned(batches: list[dict[str, torch.Tensor]], **options: object) -> dict[str, torch.Tensor]:
    model = llama()
    prune_model(model, 0.5, calibration=batches, **options)  # type: ignore[arg-type]
    state: dict[str, torch.Tensor] = model.state_dict()
    return state


@pytest.mark.parametrize("side", ["right", "left", "ones"])
@pytest.mark.parametrize(
    "options",
    [
        {"method": "wanda", "sequential": False},
        {"method": "wanda", "scope": "global", "sequential": False},
        {"method": "wanda", "sequential": True},
        {"method": "sparsegpt", "sequential": False},
        {"method": "sparsegpt", "sequential": True},
        {"method": "sparsegpt", "sequential": "layers"},
        {"method": "sparsegpt", "pattern": "2:4"},
    ],
    ids=lambda o: "-".join(str(v) for v in o.values()),
)
def test_padded_batches_prune_as_unpadded(side: str, options: dict[str, object]) -> None:
    plain, padded = _pruned(_batches(None), **options), _pruned(_batches(side), **options)
    _assert_same(plain, padded)


def test_statistics_leave_out_masked_rows() -> None:
    """The sums, second moments and row counts of a layer's input are those of the kept
    tokens alone."""
    layers: list[dict[str, torch.Tensor]] = []
    rows = []
    for side in (None, "left"):
        model = llama()
        mods = [model.model.layers[0].mlp.down_proj, model.model.layers[1].self_attn.q_proj]
        wanted = cal.Wanted(norms=True, hessian=True, means=True)
        stats = cal.calibrate(model, _batches(side), mods, wanted, owner="prune_model")
        layers.append({f"{i}.{k}": getattr(stats, k)(m) for i, m in enumerate(mods)
                       for k in ("norms", "hessian", "means")})  # fmt: skip
        rows.append([stats.rows(m) for m in mods])
    assert rows[0] == rows[1] == [3 * 2 * TOKENS] * 2
    for name, value in layers[0].items():
        assert torch.allclose(value, layers[1][name].to(value.dtype), rtol=1e-4, atol=1e-6), name


def test_misshaped_mask_is_refused_naming_the_batch() -> None:
    batches = _batches("right")
    batches[2] = dict(batches[2], attention_mask=batches[2]["attention_mask"].reshape(-1, 2))
    model = llama()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(
        ValueError,
        match=r"prune_model: calibration batch 2 has an attention_mask of shape \(16, 2\)",
    ):
        prune_model(model, 0.5, method="wanda", calibration=batches)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batches_prune_streamed_as_unpadded(tmp_path: Path, method: str, side: str) -> None:
    """prune_streamed, block by block from the shards, as prune_model: padding left out."""
    folder = sharded_folder(tmp_path / "model")
    found = []
    for name, batches in (("plain", _batches(None)), ("padded", _batches(side))):
        prune_streamed(folder, tmp_path / name, method, 0.5, calibration=batches)
        found.append(folder_tensors(tmp_path / name))
    assert found[0].keys() == found[1].keys()
    for name, value in found[0].items():
        assert torch.equal(value == 0, found[1][name] == 0), name
        assert torch.allclose(value, found[1][name], rtol=1e-4, atol=1e-5), name


@pytest.mark.parametrize("batch_first", [False, True])
def test_attention_query_rows_follow_its_layout(batch_first: bool) -> None:
    """A MultiheadAttention's in_proj statistics keep the rows of the kept tokens, its query
    read as (tokens, batch) without batch_first (as many tokens as batch rows: the layout
    cannot be told from the shape)."""
    attention = nn.MultiheadAttention(8, 2, batch_first=batch_first).eval()
    x = torch.randn(4, 4, 8, generator=torch.Generator().manual_seed(0))  # (batch, tokens)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 1]]).bool()
    given = x if batch_first else x.transpose(0, 1)
    wanted = cal.Wanted(norms=True, hessian=True, patches=True)
    with torch.no_grad(), wanted.gather([attention]) as stats:
        stats.new_batch(mask)
        attention(given, given, given)
    kept = x[mask]
    assert stats.rows(attention) == int(mask.sum())
    assert torch.allclose(stats.hessian(attention), kept.T @ kept / len(kept), atol=1e-6)
    assert torch.allclose(stats.norms(attention), kept.double().norm(dim=0), atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 5), (4, 4)], ids=["2x5", "4x4"])
def test_attention_out_proj_rows_follow_its_layout(shape: tuple[int, int]) -> None:
    """The out_proj of a MultiheadAttention without batch_first reads the heads' output as
    (tokens, batch), as its query: its statistics keep the rows of the kept tokens, those
    the same attention with batch_first keeps (2x5: no padding row; 4x4: as many tokens as
    batch rows, not the transposed rows)."""
    batch, tokens = shape
    x = torch.randn(batch, tokens, 8, generator=torch.Generator().manual_seed(1))
    mask = torch.rand(batch, tokens, generator=torch.Generator().manual_seed(2)) > 0.4
    wanted = cal.Wanted(norms=True, hessian=True, patches=True)
    found = []
    for batch_first in (True, False):
        torch.manual_seed(0)
        attention = nn.MultiheadAttention(8, 2, batch_first=batch_first).eval()
        given = x if batch_first else x.transpose(0, 1)
        targets = [(attention, layer_matrices.OUT_PROJ)]
        gather = wanted.gather([attention.out_proj])
        with torch.no_grad(), layer_matrices.out_proj_called(targets), gather as stats:
            stats.new_batch(mask)
            attention(given, given, given)
        found.append((stats.rows(attention.out_proj), stats.hessian(attention.out_proj)))
    (rows, hessian), (other_rows, other_hessian) = found
    assert rows == other_rows == int(mask.sum())
    assert torch.allclose(other_hessian, hessian, atol=1e-6)


def _tuples(side: str | None) -> list[tuple[torch.Tensor, ...]]:
    """`_batches(side)` as tuples of positional arguments, ``model(*batch)``: (input_ids,
    attention_mask), or (input_ids,) without a mask."""
    return [tuple(b.values()) for b in _batches(side)]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(
    "options",
    [
        {"method": "wanda", "sequential": False},
        {"method": "wanda", "sequential": True},
        {"method": "sparsegpt", "sequential": "layers"},
    ],
    ids=lambda o: "-".join(str(v) for v in o.values()),
)
def test_padded_tuple_batches_prune_as_unpadded(side: str, options: dict[str, object]) -> None:
    """A batch given as a tuple, its mask the forward's positional parameter
    attention_mask (a Llama's second), leaves padding out as a mapping batch does: the
    mask was read from mappings alone, and the padding ranked the weights."""
    plain, padded = _pruned(_tuples(None), **options), _pruned(_tuples(side), **options)  # type: ignore[arg-type]
    _assert_same(plain, padded)


def test_padded_tuple_batches_prune_streamed_as_unpadded(tmp_path: Path) -> None:
    folder = sharded_folder(tmp_path / "model")
    found = []
    for name, batches in (("plain", _tuples(None)), ("padded", _tuples("right"))):
        prune_streamed(folder, tmp_path / name, "wanda", 0.5, calibration=batches)
        found.append(folder_tensors(tmp_path / name))
    for name, value in found[0].items():
        assert torch.allclose(value, found[1][name], rtol=1e-4, atol=1e-5), name


def test_misshaped_mask_of_a_tuple_batch_is_refused_naming_the_batch() -> None:
    batches = _tuples("right")
    batches[1] = (batches[1][0], batches[1][1].reshape(-1, 2))
    model = llama()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(
        ValueError,
        match=r"prune_model: calibration batch 1 has an attention_mask of shape \(16, 2\) "
        r"for input_ids of shape \(2, 16\)",
    ):
        prune_model(model, 0.5, method="wanda", calibration=batches)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_a_tuple_batch_has_a_mask_only_where_the_forward_names_it() -> None:
    """The positional argument counts as the mask only where the forward's parameter of
    that place is named attention_mask; without a model, as before, a tuple has none."""
    from prunekit.core.example_inputs import token_mask

    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return x * scale

    ids, mask = _tuples("right")[0]
    assert token_mask((ids, mask), 0, "prune_model", llama()) is not None
    assert torch.equal(token_mask((ids, mask), 0, "prune_model", llama()), mask.ne(0))  # type: ignore[arg-type]
    assert token_mask((ids, mask), 0, "prune_model", Scaled()) is None
    assert token_mask((ids, mask), 0, "prune_model") is None
    assert token_mask((ids,), 0, "prune_model", llama()) is None


def _assert_same(plain: dict[str, torch.Tensor], padded: dict[str, torch.Tensor]) -> None:
    """The same masks exactly, and the same weights to float32's rounding."""
    assert plain.keys() == padded.keys()
    for name, value in plain.items():
        if name.endswith("_mask"):
            assert torch.equal(value, padded[name]), name
        else:
            assert torch.allclose(value, padded[name], rtol=1e-4, atol=1e-5), name
