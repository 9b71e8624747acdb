"""The tokens a batch's attention_mask masks out (padding) take no part in the structural
criteria's calibration, compensation's moments or the depth scores: a batch and the same
tokens padded, right or left, with the mask give the same results."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.tiny_llm import folder_tensors, llama, sharded_folder
from prunekit import prune_blocks, prune_channels
from prunekit.export.streamed_shrink import ShrinkStreamedConfig, shrink_streamed
from prunekit.structure.budget import Budget
from prunekit.structure.compensation.reconstruct import reconstruct_blocks
from prunekit.structure.stages.channel_config import ChannelConfig
from prunekit.structure.stages.score_units import score
from prunekit.structure.stages.trace_groups import trace

pytest.importorskip("transformers")

TOKENS, PAD, VOCAB = 12, 4, 300


def _ids(seed: int, rows: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, TOKENS), generator=torch.Generator().manual_seed(seed))


def _padded(ids: torch.Tensor, side: str, seed: int) -> dict[str, torch.Tensor]:
    """`ids` with PAD tokens of random ids (not a pad id: what they hold must not count)
    on `side`, and the mask that keeps only `ids`."""
    pads = torch.randint(
        0, VOCAB, (ids.shape[0], PAD), generator=torch.Generator().manual_seed(seed)
    )
    ones, zeros = torch.ones_like(ids), torch.zeros_like(pads)
    if side == "right":
        return {
            "input_ids": torch.cat([ids, pads], 1),
            "attention_mask": torch.cat([ones, zeros], 1),
        }
    return {"input_ids": torch.cat([pads, ids], 1), "attention_mask": torch.cat([zeros, ones], 1)}


def _batches(side: str | None, count: int = 4) -> list[dict[str, torch.Tensor]]:
    ids = [_ids(10 + k) for k in range(count)]
    if side is None:
        return [{"input_ids": i} for i in ids]
    if side == "ones":
        return [{"input_ids": i, "attention_mask": torch.ones_like(i)} for i in ids]
    return [_padded(i, side, 50 + k) for k, i in enumerate(ids)]


def _scores(criterion: str, batches: list[Any]) -> list[torch.Tensor]:
    model = llama()
    config = ChannelConfig(0.25, criterion=criterion, calibration=batches)
    example = {"input_ids": _ids(0)}
    return score(model, trace(model, example, config), config).scores


@pytest.mark.parametrize("criterion", ["activation", "obs", "fluctuation"])
@pytest.mark.parametrize("side", ["right", "left", "ones"])
def test_padded_batches_score_as_unpadded(criterion: str, side: str) -> None:
    plain = _scores(criterion, _batches(None))
    padded = _scores(criterion, _batches(side))
    assert len(plain) == len(padded)
    for a, b in zip(plain, padded, strict=True):
        top = float(a.abs().max())
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * top), (
            criterion,
            side,
            (a - b).abs().max() / top,
        )


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int32])
def test_mask_of_any_dtype_counts_the_same(dtype: torch.dtype) -> None:
    plain = _scores("activation", _batches(None))
    batches = [dict(b, attention_mask=b["attention_mask"].to(dtype)) for b in _batches("right")]
    for a, b in zip(plain, _scores("activation", batches), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(a.abs().max()))


@pytest.mark.parametrize("damping", ["rows", "auto"])
@pytest.mark.parametrize("tokens", ["energy", "equal"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batches_compensate_as_unpadded(side: str, damping: str, tokens: str) -> None:
    done = []
    for batches in (_batches(None), _batches(side)):
        model = llama()
        chosen = prune_channels(model, {"input_ids": _ids(0)}, 0.25, criterion="activation",
                                calibration=batches, compensate=True, damping=damping,
                                token_weights=tokens)  # fmt: skip
        done.append((model.state_dict(), [p.units for p in chosen]))
    (plain, units), (padded, padded_units) = done
    assert units == padded_units
    for name, value in plain.items():
        assert torch.allclose(value, padded[name], rtol=1e-4, atol=1e-5), name


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batches_refit_to_the_reference_as_unpadded(side: str) -> None:
    done = []
    for batches in (_batches(None), _batches(side)):
        model = llama()
        chosen = prune_channels(model, {"input_ids": _ids(0)}, 0.25, criterion="activation",
                                calibration=batches, compensate="reference")  # fmt: skip
        done.append((model.state_dict(), [p.units for p in chosen]))
    (plain, units), (padded, padded_units) = done
    assert units == padded_units
    for name, value in plain.items():
        assert torch.allclose(value, padded[name], rtol=1e-4, atol=1e-5), name


@pytest.mark.parametrize("ends", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batches_reconstruct_as_unpadded(side: str, ends: bool) -> None:
    reference = llama()
    pruned = copy.deepcopy(reference)
    prune_channels(pruned, {"input_ids": _ids(0)}, 0.25, criterion="activation",
                   calibration=_batches(None))  # fmt: skip
    done = []
    for batches in (_batches(None), _batches(side)):
        model = copy.deepcopy(pruned)
        errors = reconstruct_blocks(model, reference, batches, steps=6, lr=1e-4, ends=ends)
        done.append((errors, model.state_dict()))
    (errors, plain), (padded_errors, padded) = done
    assert any(after < before for before, after in errors)  # the steps changed something
    assert len(errors) == len(padded_errors)
    for (before, after), (padded_before, padded_after) in zip(errors, padded_errors, strict=True):
        assert padded_before == pytest.approx(before, rel=1e-4)
        assert padded_after == pytest.approx(after, rel=1e-3)
    for name, value in plain.items():
        assert torch.allclose(value, padded[name], rtol=1e-3, atol=1e-4), name


def _misshaped() -> list[dict[str, torch.Tensor]]:
    """Padded batches, the second's mask transposed: as many entries, none in its place."""
    batches = _batches("right")
    batches[1] = dict(batches[1], attention_mask=batches[1]["attention_mask"].T.contiguous())
    return batches


def test_misshaped_mask_is_refused_naming_the_batch() -> None:
    model = llama()
    before = copy.deepcopy(model.state_dict())
    shape = rf"\({TOKENS + PAD}, 2\)"
    with pytest.raises(
        ValueError,
        match=rf"prune_channels: calibration batch 1 has an attention_mask of shape {shape}",
    ):
        prune_channels(
            model, {"input_ids": _ids(0)}, 0.25, criterion="activation", calibration=_misshaped()
        )
    with pytest.raises(
        ValueError, match=r"prune_channels: calibration batch 1 has an attention_mask"
    ):
        prune_channels(
            model, {"input_ids": _ids(0)}, 0.25, calibration=_misshaped(), compensate=True
        )
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("replace", [False, "linear"])
def test_misshaped_mask_is_refused_by_prune_blocks(replace: str | bool) -> None:
    model = llama(layers=4)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(
        ValueError, match=r"prune_blocks: calibration batch 1 has an attention_mask of shape"
    ):
        prune_blocks(model, _misshaped(), 1, replace=replace)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("criterion", ["angular", "influence"])
@pytest.mark.parametrize("side", ["right", "left", "ones"])
def test_padded_batches_rank_blocks_as_unpadded(criterion: str, side: str) -> None:
    found = [prune_blocks(llama(layers=4), b, 1, criterion=criterion).scores
             for b in (_batches(None), _batches(side))]  # fmt: skip
    assert found[0] == pytest.approx(found[1], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batches_fit_the_linear_map_as_unpadded(side: str) -> None:
    found = []
    for batches in (_batches(None), _batches(side)):
        model = llama(layers=4)
        prune_blocks(model, batches, 1, replace="linear")
        found.append(model.state_dict())
    for name, value in found[0].items():
        assert torch.allclose(value, found[1][name], rtol=1e-4, atol=1e-5), name


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batches_shrink_streamed_as_unpadded(tmp_path: Path, side: str) -> None:
    """shrink_streamed (activation scores and compensation on each block's captured calls)
    leaves padding out as prune_channels does in memory."""
    pytest.importorskip("accelerate")
    folder = sharded_folder(tmp_path / "model")
    config = ShrinkStreamedConfig(Budget(params=0.3))
    found = []
    for name, batches in (("plain", _batches(None)), ("padded", _batches(side))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            shrink_streamed(folder, tmp_path / name, calibration=batches, config=config)
        found.append(folder_tensors(tmp_path / name))
    assert {k: v.shape for k, v in found[0].items()} == {k: v.shape for k, v in found[1].items()}
    for name, value in found[0].items():
        assert torch.allclose(value, found[1][name], rtol=1e-4, atol=1e-5), name


def _tuples(side: str | None) -> list[tuple[torch.Tensor, ...]]:
    """`_batches(side)` as tuples of positional arguments: (input_ids, attention_mask), a
    Llama's first two parameters, or (input_ids,)."""
    return [tuple(b.values()) for b in _batches(side)]


@pytest.mark.parametrize("criterion", ["activation", "obs"])
def test_padded_tuple_batches_score_as_unpadded(criterion: str) -> None:
    """A tuple batch's mask (the forward's positional attention_mask) counts as a
    mapping's does: it was ignored, and the padding scored the channels."""
    for a, b in zip(_scores(criterion, _tuples(None)), _scores(criterion, _tuples("right")),
                    strict=True):  # fmt: skip
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(a.abs().max())), criterion


def test_padded_tuple_batches_compensate_as_unpadded() -> None:
    done = []
    for batches in (_tuples(None), _tuples("right")):
        model = llama()
        prune_channels(model, {"input_ids": _ids(0)}, 0.25, criterion="activation",
                       calibration=batches, compensate=True)  # fmt: skip
        done.append(model.state_dict())
    for name, value in done[0].items():
        assert torch.allclose(value, done[1][name], rtol=1e-4, atol=1e-5), name


def test_padded_tuple_batches_reconstruct_as_unpadded() -> None:
    reference = llama()
    pruned = copy.deepcopy(reference)
    prune_channels(pruned, {"input_ids": _ids(0)}, 0.25, criterion="activation",
                   calibration=_batches(None))  # fmt: skip
    done = []
    for batches in (_tuples(None), _tuples("right")):
        model = copy.deepcopy(pruned)
        done.append(reconstruct_blocks(model, reference, batches, steps=3, lr=1e-4))
    for (before, after), (padded_before, padded_after) in zip(*done, strict=True):
        assert padded_before == pytest.approx(before, rel=1e-4)
        assert padded_after == pytest.approx(after, rel=1e-3)


def test_padded_tuple_batches_rank_blocks_as_unpadded() -> None:
    found = [prune_blocks(llama(layers=4), b, 1, criterion="angular").scores
             for b in (_tuples(None), _tuples("right"))]  # fmt: skip
    assert found[0] == pytest.approx(found[1], rel=1e-4, abs=1e-6)


def test_tuple_batches_whose_every_mask_is_zero_are_refused_by_prune_blocks() -> None:
    batches = [(ids, torch.zeros_like(mask)) for ids, mask in _tuples("right")]
    with pytest.raises(ValueError, match=r"prune_blocks: every attention_mask of the 4 "):
        prune_blocks(llama(layers=4), batches, 1)


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"compensate": True}, "compensation has no row to fit on"),
        ({"criterion": "activation"}, r"criterion='activation' has no row to score on"),
    ],
    ids=["compensate", "criterion"],
)
def test_tuple_batches_whose_every_mask_is_zero_are_refused_by_prune_channels(
    options: dict[str, Any], why: str
) -> None:
    """As the same batches as mappings are: the masks were read without the model (whose
    forward names a tuple's second item attention_mask), and the call fitted and scored
    on no token at all."""
    batches = [(ids, torch.zeros_like(mask)) for ids, mask in _tuples("right")]
    model = llama()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(
        ValueError,
        match=rf"prune_channels: every one of the 4 calibration batches has an attention_mask "
        rf"that is all zero, so {why}",
    ):
        prune_channels(model, {"input_ids": _ids(0)}, 0.25, calibration=batches, **options)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_tuple_batches_whose_every_mask_is_zero_are_refused_by_shrink_streamed(
    tmp_path: Path,
) -> None:
    """As the same batches as mappings are: the masks were checked before the model was
    known (whose forward names a tuple's second item attention_mask), and the folder was
    shrunk on no token at all."""
    pytest.importorskip("accelerate")
    folder = sharded_folder(tmp_path / "model")
    batches = [(ids, torch.zeros_like(mask)) for ids, mask in _tuples("right")]
    config = ShrinkStreamedConfig(Budget(params=0.3))
    with pytest.raises(
        ValueError,
        match=r"shrink_streamed: every attention_mask of the 4 calibration batches is all zero",
    ):
        shrink_streamed(folder, tmp_path / "out", calibration=batches, config=config)
    assert not (tmp_path / "out").exists()
