"""Sequential calibration (prune_model's default for Wanda and SparseGPT, prune_streamed,
compensation) on models whose blocks are called with different arguments by kind: a
sliding-window layer gets another attention mask than a full one, and Gemma 3's global
layers another rotary embedding than its local ones. Each block must be calibrated on the
arguments the model's own forward gives it, not on the first block's."""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import prunekit
from hostile.support import refused
from prunekit.export.streamed_shrink import ShrinkStreamedConfig, shrink_streamed
from prunekit.io.streamed import prune_streamed
from prunekit.structure.budget import Budget
from prunekit.structure.compensation.reconstruct import reconstruct_blocks

T = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

VOCAB = 50
SMALL = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, intermediate_size=24, max_position_embeddings=64)  # fmt: skip


def _llama() -> Any:
    return T.LlamaForCausalLM(T.LlamaConfig(**SMALL))


def _qwen2() -> Any:  # layer 0 attends over everything, layer 1 over a window of 4
    config = T.Qwen2Config(**SMALL, sliding_window=4, use_sliding_window=True, max_window_layers=1)
    return T.Qwen2ForCausalLM(config)


def _gemma3() -> Any:  # layer 0 local (window 4, local rope), layer 1 global
    config = T.Gemma3TextConfig(**SMALL, head_dim=8, sliding_window=4,
                                layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    return T.Gemma3ForCausalLM(config)


BUILDERS = [_llama, _qwen2, _gemma3]
IDS = ["llama", "qwen2-sliding", "gemma3"]


def _calibration() -> list[torch.Tensor]:  # 16 tokens: longer than the window
    return [torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(k))
            for k in range(2)]  # fmt: skip


def _model(builder: Callable[[], Any]) -> Any:
    torch.manual_seed(1)
    return builder().eval()


def _block_by_block(model: Any, calibration: list[torch.Tensor], **options: Any) -> None:
    """What sequential pruning promises, by hand: each block pruned on the inputs the
    model's own forward gives it, the blocks before it pruned already."""
    for i in range(len(model.model.layers)):
        prunekit.prune_model(model, 0.5, calibration=calibration, sequential=False,
                             include=[f"model.layers.{i}.*"], **options)  # fmt: skip


def _differing(model: Any, want: Any) -> list[str]:
    """The masks and weights in which two pruned models differ."""
    theirs = {**dict(want.named_buffers()), **dict(want.named_parameters())}
    ours = {**dict(model.named_buffers()), **dict(model.named_parameters())}
    return [k for k, v in ours.items() if not torch.equal(v, theirs[k])]


@pytest.mark.parametrize("options", [{"method": "wanda"}, {"method": "sparsegpt"}],
                         ids=["wanda", "sparsegpt"])  # fmt: skip
@pytest.mark.parametrize("builder", BUILDERS, ids=IDS)
def test_sequential_equals_block_by_block(
    builder: Callable[[], Any], options: dict[str, Any]
) -> None:
    model = _model(builder)
    want = copy.deepcopy(model)
    prunekit.prune_model(model, 0.5, calibration=_calibration(), sequential=True, **options)
    _block_by_block(want, _calibration(), **options)
    assert _differing(model, want) == []


@pytest.mark.parametrize("builder", BUILDERS[1:], ids=IDS[1:])
def test_layer_by_layer_uses_each_blocks_own_arguments(builder: Callable[[], Any]) -> None:
    """sequential='layers' differs from block by block (each group of a block sees the
    pruned groups before it), but only by that: with the later block's arguments wrong,
    its masks follow the first block's mask instead. Against the same run with every
    block given the first block's arguments by hand, the later block's masks differ."""
    model = _model(builder)
    first = copy.deepcopy(model)
    prunekit.prune_model(model, 0.5, method="wanda", calibration=_calibration(),
                         sequential="layers")  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:  # the old behaviour: block 0's arguments
        patch.setattr(prunekit.calibrate, "block_calls", lambda *_, **__: None)
        prunekit.prune_model(first, 0.5, method="wanda", calibration=_calibration(),
                             sequential="layers")  # fmt: skip
    changed = _differing(model, first)
    assert changed and all(name.startswith("model.layers.1.") for name in changed)


def test_streamed_equals_block_by_block_with_sliding_layers(tmp_path: Path) -> None:
    model = _model(_qwen2)
    model.save_pretrained(tmp_path / "in", max_shard_size="20KB")
    calibration = _calibration()
    prune_streamed(tmp_path / "in", tmp_path / "out", "wanda", 0.5, calibration=calibration)
    got = T.Qwen2ForCausalLM.from_pretrained(tmp_path / "out").eval()
    _block_by_block(model, calibration, method="wanda")
    differing = []
    for name, param in got.named_parameters():  # the pruning made permanent: orig x mask
        path, _, leaf = name.rpartition(".")
        if not torch.equal(param, getattr(model.get_submodule(path), leaf)):
            differing.append(name)
    assert differing == []


def _same(one: Any, other: Any) -> bool:
    if isinstance(one, tuple | list):
        return len(one) == len(other) and all(_same(a, b) for a, b in zip(one, other, strict=True))
    if isinstance(one, torch.Tensor):
        return isinstance(other, torch.Tensor) and torch.equal(one, other)
    return bool(one is None and other is None)


def _record_calls(model: Any) -> tuple[list[Any], Any]:
    """What the last block is called with (its mask and rotary embedding), each time."""
    seen: list[Any] = []

    def hook(_: Any, args: Any, kwargs: dict[str, Any]) -> None:
        seen.append((kwargs.get("attention_mask"), kwargs.get("position_embeddings")))

    return seen, model.model.layers[-1].register_forward_pre_hook(hook, with_kwargs=True)


def _own_arguments(builder: Callable[[], Any], run: Callable[[Any, Any], object]) -> None:
    """Every call `run` makes of a model's last block has the mask and rotary embedding the
    model's own forward gives that block."""
    model = _model(builder)
    reference = copy.deepcopy(model)
    batch = _calibration()[0]
    real, handle = _record_calls(model)
    with torch.no_grad():
        model(batch)
    handle.remove()
    seen, handle = _record_calls(model)
    run(model, reference)
    handle.remove()
    assert seen and all(_same(one, real[0]) for one in seen)


@pytest.mark.parametrize("builder", BUILDERS[1:], ids=IDS[1:])
def test_compensation_runs_each_block_with_its_own_arguments(builder: Callable[[], Any]) -> None:
    def run(model: Any, _: Any) -> None:
        batch = _calibration()[0]
        prunekit.prune_channels(model, batch, 0.5, compensate=True, calibration=[batch],
                                exclude=["model.layers.0.*"])  # fmt: skip

    _own_arguments(builder, run)


@pytest.mark.parametrize("builder", BUILDERS[1:], ids=IDS[1:])
def test_reconstruction_runs_each_block_with_its_own_arguments(
    builder: Callable[[], Any],
) -> None:
    def run(model: Any, reference: Any) -> None:
        reconstruct_blocks(model, reference, [_calibration()[0]], steps=2)

    _own_arguments(builder, run)


def test_a_streamed_shrink_with_sliding_layers_is_the_in_memory_result(tmp_path: Path) -> None:
    model = _model(_qwen2)
    model.save_pretrained(tmp_path / "in", max_shard_size="20KB")
    calibration = _calibration()
    config = ShrinkStreamedConfig(Budget(params=0.3))
    with warnings.catch_warnings():  # few calibration rows: compensation warns; compact:
        warnings.simplefilter("ignore", UserWarning)  # widths its config cannot rebuild
        done = shrink_streamed(tmp_path / "in", tmp_path / "out", calibration=calibration,
                               config=config)  # fmt: skip
        chosen = prunekit.prune_channels(model, calibration[0],
                                         config=config.channels(calibration))  # fmt: skip
        prunekit.compact(model, calibration[0], latency_runs=0)
    assert [(p.group.name, p.units) for p in done.budget] == [
        (p.group.name, p.units) for p in chosen
    ]
    got = T.AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=True)
    want = model.state_dict()
    for name, tensor in got.state_dict().items():
        torch.testing.assert_close(tensor, want[name], rtol=1e-6, atol=1e-7, msg=name)


class _Passing(torch.nn.Module):
    """A block that returns (hidden states, a bias the next block takes: the first block's
    input's mean, taken off each block's input), as T5's do."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, hidden: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
        bias = hidden.mean(-1, keepdim=True) if bias is None else bias
        return hidden + self.down(torch.relu(self.up(hidden - bias))), bias


class _Stack(torch.nn.Module):
    """Two _Passing blocks, called in `order`."""

    def __init__(self, order: tuple[int, ...] = (0, 1)) -> None:
        super().__init__()
        self.order = order
        self.blocks = torch.nn.ModuleList(_Passing() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None
        for i in self.order:
            x, bias = self.blocks[i](x, bias=bias)
        return x


def _by_hand(model: Any, prefix: str, count: int, calibration: list[Any]) -> None:
    """Each of `count` blocks under `prefix` pruned with Wanda on the inputs the model's own
    forward gives it, the blocks before it pruned already."""
    for i in range(count):
        prunekit.prune_model(model, 0.5, method="wanda", calibration=calibration,
                             sequential=False, include=[f"{prefix}.{i}.*"])  # fmt: skip


def test_a_forward_that_reads_more_than_the_hidden_states_gives_each_block_its_own() -> None:
    """Blocks passed through cannot give what such a forward reads from their outputs (the
    bias block 0 computes for the next): the calls were not recorded (None), and block 1
    computed a bias of its own from its input, calibrated on what the model never computes.
    They are now recorded with the blocks run, each block given the bias the model gives it."""
    torch.manual_seed(0)
    model = _Stack()
    calibration = [torch.randn(2, 5, 8), torch.randn(2, 5, 8)]  # unpacked as two rows
    calls = prunekit.calibrate.block_calls(model, model.blocks, calibration, owner="test")
    assert calls is not None and all(kwargs["bias"] is not None for _, kwargs in calls[1])
    assert not any(b._forward_pre_hooks or "forward" in vars(b) for b in model.blocks)
    want, before = copy.deepcopy(model), copy.deepcopy(model)
    prunekit.prune_model(model, 0.5, method="wanda", calibration=calibration)
    _by_hand(want, "blocks", 2, calibration)
    assert _differing(model, want) == []
    with pytest.MonkeyPatch.context() as patch:  # the old behaviour: block 0's arguments
        patch.setattr(prunekit.calibrate, "block_calls", lambda *_, **__: None)
        prunekit.prune_model(before, 0.5, method="wanda", calibration=calibration)
    assert _differing(before, want)


def test_a_block_with_a_forward_of_its_own_is_recorded_and_left_as_it_was() -> None:
    """A block whose forward is an instance attribute (accelerate's hooks set one): the
    recording set it aside by calling its type with no argument (a function's needs one),
    a TypeError from inside the library."""
    torch.manual_seed(0)
    model = _Stack()
    want = copy.deepcopy(model)
    for stack in (model, want):
        original = stack.blocks[0].forward
        stack.blocks[0].forward = functools.partial(original)  # type: ignore[method-assign]
    own = model.blocks[0].forward
    calibration = [torch.randn(2, 5, 8)]
    calls = prunekit.calibrate.block_calls(model, model.blocks, calibration, owner="test")
    assert calls is not None and len(calls[1]) == 1
    assert vars(model.blocks[0])["forward"] is own
    prunekit.prune_model(model, 0.5, method="wanda", calibration=calibration)
    _by_hand(want, "blocks", 2, calibration)
    assert _differing(model, want) == []


def test_such_a_forward_calling_a_block_again_is_refused() -> None:
    """Where the forward could not run with its blocks passed through (here: it unpacks a
    block's output, four rows, as two values), no order was checked: block 0 run again
    after block 1 was calibrated on its first call alone."""
    torch.manual_seed(0)
    model = _Stack((0, 1, 0))
    refused(
        lambda: prunekit.prune_model(model, 0.5, method="wanda", sequential=True,
                                     calibration=[torch.randn(4, 8)]),
        ValueError,
        r"^prune_model: calibration: the model's forward calls block 0 a second time of its "
        r"2 blocks "
        r"\(_Passing\) on batch 0 \(called: 0, 1, 0\)",
        model=model,
    )  # fmt: skip


def test_t5_blocks_are_calibrated_on_the_position_bias_block_0_computes() -> None:
    """T5's block 0 computes the relative position bias (with the mask added) and the stack
    hands it to every later block; with block 0's arguments (no bias) the later blocks
    attended without it, and their masks differed from block by block by hand."""
    torch.manual_seed(1)
    config = T.T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=24, num_layers=3,
                        num_heads=2, relative_attention_num_buckets=8,
                        relative_attention_max_distance=16, dropout_rate=0.0)  # fmt: skip
    model = T.T5EncoderModel(config).eval()
    want = copy.deepcopy(model)
    prunekit.prune_model(model, 0.5, method="wanda", calibration=_calibration(), sequential=True)
    _by_hand(want, "encoder.block", 3, _calibration())
    assert _differing(model, want) == []


def test_a_failure_of_the_recording_itself_is_raised_not_taken_for_the_fallback() -> None:
    """`block_calls` gives None (each block then gets the first block's arguments) where the
    model's forward cannot run with its blocks passed through; an error of prunekit's own
    recording is a bug and must surface, not turn into that fallback silently."""
    model = _model(_qwen2)

    def broken(_: Any) -> Any:
        raise RuntimeError("recording failed")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prunekit.calibrate.block_inputs, "cacheless", broken)
        with pytest.raises(RuntimeError, match="recording failed"):
            prunekit.calibrate.block_calls(model, model.model.layers, _calibration(), owner="test")
