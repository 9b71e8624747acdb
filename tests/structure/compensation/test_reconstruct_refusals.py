"""reconstruct_blocks refuses what it cannot train, rather than return errors of NaN or leave
the model as it was without a word: the model given as its own reference, float16
parameters (Adam's squared gradients underflow), and batches on which a block's error is
not finite. Each refusal leaves the model as it was."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from prunekit.structure import reconstruct_blocks


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.down(torch.relu(self.up(x)))
        return out


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 6)
        self.blocks = nn.ModuleList(_Block(6) for _ in range(2))

    def forward(self, x: Tensor) -> Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return h


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    reference = _Net()
    model = copy.deepcopy(reference)
    with torch.no_grad():
        model.blocks[0].up.weight[:3] = 0
    return model, reference


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(model: nn.Module, before: dict[str, Tensor]) -> bool:
    return all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_model_as_its_own_reference_is_refused() -> None:
    model, _ = _pair()
    with pytest.raises(ValueError, match=r"reconstruct_blocks: .*reference.* is the model"):
        reconstruct_blocks(model, model, [torch.randn(5, 4)], steps=2)


def test_float16_parameters_are_refused() -> None:
    model, reference = _pair()
    model, reference = model.half(), reference.half()
    before = _state(model)
    with pytest.raises(ValueError, match=r"reconstruct_blocks: .*float16.*blocks\.0"):
        reconstruct_blocks(model, reference, [torch.randn(5, 4).half()], steps=2)
    assert _same(model, before)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_batches_giving_a_block_no_finite_error_are_refused(bad: float) -> None:
    model, reference = _pair()
    before = _state(model)
    batch = torch.randn(5, 4)
    batch[2, 1] = bad
    refused = r"reconstruct_blocks: the error of blocks\.0 .*not finite"
    with pytest.raises(ValueError, match=refused):
        reconstruct_blocks(model, reference, [torch.randn(5, 4), batch], steps=2)
    assert _same(model, before)


def test_finite_batches_still_train() -> None:
    model, reference = _pair()
    errors = reconstruct_blocks(model, reference, [torch.randn(5, 4) for _ in range(3)], steps=5)
    assert errors[0][1] < errors[0][0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_reference_of_another_dtype_is_named_with_both_dtypes(dtype: torch.dtype) -> None:
    model, reference = _pair()
    reference = reference.to(dtype)
    before = _state(model)
    with pytest.raises(ValueError) as caught:
        reconstruct_blocks(model, reference, [torch.randn(5, 4)], steps=2)
    message = str(caught.value)
    assert message.startswith("reconstruct_blocks: "), message
    assert "reference" in message and "'stem.weight'" in message, message
    assert str(dtype) in message and "torch.float32" in message, message
    assert not message.startswith("calibration"), message
    assert isinstance(caught.value.__cause__, RuntimeError)  # what torch said, kept
    assert _same(model, before)


class _Ends(nn.Module):
    """A stem and a head of their own dtypes around float32 blocks (each casts its input)."""

    def __init__(self, stem: torch.dtype, head: torch.dtype) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 6).to(stem)
        self.blocks = nn.ModuleList(_Block(6) for _ in range(2))
        self.head = nn.Linear(6, 3).to(head)

    def forward(self, x: Tensor) -> Tensor:
        h = self.stem(x.to(self.stem.weight.dtype)).float()
        for block in self.blocks:
            h = block(h)
        out: Tensor = self.head(h.to(self.head.weight.dtype)).float()
        return out


@pytest.mark.parametrize("half", ["stem", "head"])
def test_float16_ends_are_refused_with_ends(half: str) -> None:
    torch.manual_seed(0)
    dtypes = {"stem": torch.float32, "head": torch.float32, half: torch.float16}
    reference = _Ends(dtypes["stem"], dtypes["head"])
    model = copy.deepcopy(reference)
    with torch.no_grad():
        model.blocks[0].up.weight[:3] = 0
    before = _state(model)
    with pytest.raises(ValueError, match=rf"reconstruct_blocks: .*float16.*{half}\.weight"):
        reconstruct_blocks(model, reference, [torch.randn(5, 4)], steps=2, ends=True)
    assert _same(model, before)
    # without ends the float16 end is not trained, and the blocks are
    errors = reconstruct_blocks(model, reference, [torch.randn(5, 4)], steps=3)
    assert len(errors) == 2


def test_a_reference_block_of_another_dtype_is_named() -> None:
    model, reference = _pair()
    reference.blocks[1].double()
    before = _state(model)
    with pytest.raises(ValueError, match=r"reconstruct_blocks: invalid reference: its parameter "
                       r"'blocks\.1\.up\.weight' is torch\.float64 where the model's is "
                       r"torch\.float32"):  # fmt: skip
        reconstruct_blocks(model, reference, [torch.randn(5, 4)], steps=2)
    assert _same(model, before)


def test_a_batch_the_model_cannot_take_with_ends_is_named_as_calibration() -> None:
    model, reference = _pair()
    before = _state(model)
    with pytest.raises(ValueError, match=r"^reconstruct_blocks: calibration: the model cannot "
                       r"take batch 0: RuntimeError") as caught:  # fmt: skip
        reconstruct_blocks(model, reference, [torch.randn(5, 7)], steps=2, ends=True)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert _same(model, before)


def test_a_shallow_copy_as_reference_is_refused() -> None:
    model, _ = _pair()
    reference = copy.copy(model)  # shares every module, so it changes as the model is trained
    before = _state(model)
    with pytest.raises(ValueError, match=r"^reconstruct_blocks: invalid reference: it shares "
                       r"the parameter 'blocks\.0\.up\.weight' with the model \(as its "
                       r"'blocks\.0\.up\.weight'\), which is trained here"):  # fmt: skip
        reconstruct_blocks(model, reference, [torch.randn(5, 4)], steps=2)
    assert _same(model, before)


def test_a_reference_sharing_an_end_is_refused_only_where_that_end_trains() -> None:
    model, reference = _pair()
    reference.stem = model.stem  # the stem is trained with ends=True only
    before = _state(model)
    with pytest.raises(ValueError, match=r"invalid reference: it shares the parameter "
                       r"'stem\.weight'"):  # fmt: skip
        reconstruct_blocks(model, reference, [torch.randn(5, 4)], steps=2, ends=True)
    assert _same(model, before)
    errors = reconstruct_blocks(model, reference, [torch.randn(5, 4) for _ in range(3)], steps=5)
    assert errors[0][1] < errors[0][0]


class _Counting(_Ends):
    """_Ends counting its forwards in a buffer (as a model's own statistics would)."""

    def __init__(self, stem: torch.dtype, head: torch.dtype) -> None:
        super().__init__(stem, head)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x: Tensor) -> Tensor:
        self.seen += 1
        return super().forward(x)


def test_a_refusal_after_the_forward_that_finds_the_ends_leaves_its_buffers() -> None:
    torch.manual_seed(0)
    reference = _Counting(torch.float32, torch.float16)
    model = copy.deepcopy(reference)
    before = _state(model)
    with pytest.raises(ValueError, match=r"float16.*head\.weight"):
        reconstruct_blocks(model, reference, [torch.randn(5, 4)], steps=2, ends=True)
    assert int(model.seen) == 0 and _same(model, before)


def test_an_lr_beyond_what_the_parameters_dtype_holds_is_refused_by_name() -> None:
    model, reference = _pair()
    before = _state(model)
    with pytest.raises(ValueError, match=r"^reconstruct_blocks: invalid lr=1e\+300; expected "
                       r".*torch\.float32"):  # fmt: skip
        reconstruct_blocks(model, reference, [torch.randn(5, 4)], steps=2, lr=1e300)
    assert _same(model, before)
