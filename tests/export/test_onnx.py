"""export(format='onnx'): compacted CNNs and encoders as one ONNX file, checked by ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import prunekit
from prunekit.export import export

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 12, 3, padding=1, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, 5),
    )  # fmt: skip


IMAGES = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def compacted_cnn() -> nn.Module:
    model = cnn()
    prunekit.prune_channels(model, IMAGES, 0.5)
    prunekit.compact(model, IMAGES, latency_runs=0)
    return model


def close(expected: torch.Tensor, found: object) -> float:
    """The largest difference over the largest magnitude; NaN where either side has one."""
    gap = (expected.detach().double() - torch.as_tensor(found).double()).abs()
    return float(gap.max()) / float(expected.abs().max())


def test_a_compacted_cnn_runs_in_onnx_runtime_with_equal_outputs(tmp_path: Path) -> None:
    model = compacted_cnn()
    assert model[0].out_channels == 4  # compacted, not masked
    path = tmp_path / "cnn.onnx"
    report = export(model, path, "onnx", example_inputs=IMAGES)
    assert report.path == path and report.files == ("cnn.onnx",)
    assert report.verified_by is not None and report.verified_by.startswith("onnxruntime")
    assert report.difference is not None and report.difference <= 1e-4
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (given,) = session.get_inputs()
    assert given.shape[0] == "batch" and given.shape[1:] == [3, 16, 16]
    other = torch.randn(5, 3, 16, 16)  # another batch size: the axis is dynamic
    (found,) = session.run(None, {given.name: other.numpy()})
    with torch.no_grad():
        assert close(model.eval()(other), found) <= 1e-4


def test_the_model_keeps_its_mode_and_weights(tmp_path: Path) -> None:
    model = compacted_cnn().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    export(model, tmp_path / "cnn.onnx", "onnx", example_inputs=IMAGES)
    assert all(m.training for m in model.modules())
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def tiny_bert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=40,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


def tokens(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 60, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length - 3 :] = 0  # padding in the last row
    return {"input_ids": ids, "attention_mask": mask}


def test_a_compacted_encoder_runs_in_onnx_runtime_at_any_batch_and_length(
    tmp_path: Path,
) -> None:
    model = tiny_bert()
    example = tokens(2, 9, seed=0)
    prunekit.prune_channels(model, example, 0.25, heads=0.5)
    with pytest.warns(UserWarning, match="cannot rebuild"):
        prunekit.compact(model, example, latency_runs=0)
    assert model.encoder.layer[0].intermediate.dense.out_features == 36
    path = tmp_path / "bert.onnx"
    report = export(model, path, "onnx", example_inputs=example)
    assert report.difference is not None and report.difference <= 1e-4
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    assert [o.name for o in session.get_outputs()] == ["last_hidden_state", "pooler_output"]
    assert all(i.shape == ["batch", "sequence"] for i in session.get_inputs())
    other = tokens(3, 14, seed=1)
    found = session.run(None, {k: v.numpy() for k, v in other.items()})
    with torch.no_grad():
        expected = model(**other)
    assert close(expected.last_hidden_state, found[0]) <= 1e-4
    assert close(expected.pooler_output, found[1]) <= 1e-4


def masked_cnn() -> nn.Module:
    model = cnn()
    prunekit.prune_channels(model, IMAGES, 0.5)
    return model


class Noisy(nn.Module):
    """A forward whose outputs ONNX Runtime cannot reproduce (fresh noise each run)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


class Undefined(nn.Module):
    """A forward whose output is NaN in both PyTorch and ONNX Runtime."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(-x.abs() - 1.0)


@pytest.mark.parametrize(
    ("make", "kwargs", "error", "match"),
    [
        (masked_cnn, {"example_inputs": IMAGES}, ValueError,
         r"module '0' still holds the pruning masks of bias, weight; call prunekit\.compact"),
        (compacted_cnn, {}, ValueError, r"example_inputs=None; expected the inputs to trace"),
        (compacted_cnn, {"example_inputs": IMAGES, "dtype": "float16"}, ValueError,
         r"dtype='float16' is not a type it writes; expected None .* or 'float32'"),
        (compacted_cnn, {"example_inputs": (IMAGES, 3)}, TypeError,
         r"example_inputs\[1\] is a int; expected a tensor"),
        (compacted_cnn, {"example_inputs": "images"}, TypeError,
         r"example_inputs is a str; expected a tensor, a tuple of tensors or a dict"),
        (Noisy, {"example_inputs": IMAGES}, RuntimeError,
         r"ONNX Runtime's output 'output' differs from the model's"),
        (Undefined, {"example_inputs": IMAGES}, RuntimeError,
         r"ONNX Runtime's output 'output' differs from the model's by nan"),
    ],
)  # fmt: skip
def test_a_refusal_or_a_failed_check_leaves_everything_as_it_was(
    tmp_path: Path, make: type[nn.Module], kwargs: dict[str, object], error: type, match: str
) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"the old file")
    with pytest.raises(error, match=match):
        export(make(), path, "onnx", **kwargs)
    assert path.read_bytes() == b"the old file"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
    with pytest.raises(error, match=match):
        export(make(), tmp_path / "new.onnx", "onnx", **kwargs)
    assert not (tmp_path / "new.onnx").exists()


def test_outputs_that_are_not_tensors_are_refused_before_writing(tmp_path: Path) -> None:
    class Counted(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
            return x * 2, 3

    with pytest.raises(TypeError, match=r"output output_1 is a int; expected tensors"):
        export(Counted(), tmp_path / "m.onnx", "onnx", example_inputs=IMAGES)
    assert not list(tmp_path.iterdir())


def test_verify_false_writes_without_checking(tmp_path: Path) -> None:
    report = export(Noisy(), tmp_path / "m.onnx", "onnx", example_inputs=IMAGES, verify=False)
    assert report.verified_by is None and report.difference is None
    assert (tmp_path / "m.onnx").stat().st_size > 0


def test_float32_writes_a_float32_copy_of_a_double_model(tmp_path: Path) -> None:
    model = compacted_cnn().double()
    report = export(model, tmp_path / "m.onnx", "onnx", example_inputs=IMAGES.double(),
                    dtype="float32")  # fmt: skip
    assert report.difference is not None and report.difference <= 1e-4
    assert all(p.dtype == torch.float64 for p in model.parameters())  # the model is unchanged
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(float)"


class MaskedLogits(nn.Module):
    """Logits with one class ruled out (-inf), as constrained decoding masks them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ruled_out = torch.tensor([False, True, False, False, False])
        return self.net(x).masked_fill(ruled_out, float("-inf"))


def test_outputs_with_equal_infinities_are_no_difference(tmp_path: Path) -> None:
    """-inf at one place in both outputs passes the check (inf - inf made it NaN)."""
    report = export(MaskedLogits(), tmp_path / "m.onnx", "onnx", example_inputs=IMAGES)
    assert report.difference is not None and report.difference <= 1e-4


def test_the_dynamic_axes_are_settled_once_for_the_trace_and_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ``Dim`` pair, settled once, serves the trace, the note on fixed axes and ONNX
    Runtime's check (the batch doubled on the axes the trace was given)."""
    from prunekit.export import onnx

    settled = onnx._dynamic
    calls: list[object] = []

    def counted(*args: object) -> object:
        calls.append(args)
        return settled(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx, "_dynamic", counted)
    report = export(compacted_cnn(), tmp_path / "cnn.onnx", "onnx", example_inputs=IMAGES)
    assert report.difference is not None and report.difference <= 1e-4
    assert len(calls) == 1


def test_a_cnn_exported_from_a_batch_of_one_takes_any_batch(tmp_path: Path) -> None:
    """A batch of 1 is traced on the image repeated to 2 (torch.export may take a 1 for a
    constant) and checked on the one image given."""
    model = compacted_cnn()
    path = tmp_path / "cnn.onnx"
    report = export(model, path, "onnx", example_inputs=IMAGES[:1])
    assert report.difference is not None and report.difference <= 1e-4
    assert any("traced on a batch of 2" in note for note in report.notes), report.notes
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (given,) = session.get_inputs()
    assert given.shape[0] == "batch"
    for images in (IMAGES[:1], torch.randn(3, 3, 16, 16)):
        (found,) = session.run(None, {given.name: images.numpy()})
        with torch.no_grad():
            assert close(model.eval()(images), found) <= 1e-4


@pytest.mark.parametrize(
    ("inputs", "wrong", "allowed"),
    [
        (torch.zeros(0, 3, 16, 16), r"is empty \(shape \(0, 3, 16, 16\)\)", "at least one entry"),
        (torch.zeros(2, 3, 16, 16, device="meta"), "is on the meta device", "values"),
    ],
    ids=["empty", "meta"],
)
def test_inputs_without_values_are_refused_without_offering_verify_false(
    tmp_path: Path, inputs: torch.Tensor, wrong: str, allowed: str
) -> None:
    """verify=False takes inputs holding NaN (nothing is compared), never inputs without
    values (nothing to trace on): the refusal offered it for both."""
    for verify in (True, False):
        with pytest.raises(ValueError, match=rf"example_inputs\[0\] {wrong}.*{allowed}") as caught:
            export(compacted_cnn(), tmp_path / "m.onnx", "onnx", example_inputs=inputs,
                   verify=verify)  # fmt: skip
        assert "verify=False" not in str(caught.value)
        assert not (tmp_path / "m.onnx").exists()
