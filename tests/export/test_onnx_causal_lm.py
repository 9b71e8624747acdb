"""export(format='onnx') of a causal LM whose config asks for a key/value cache: the cache is
no tensor ONNX can output, so the graph is traced without it (logits only), and the config
is as it was afterwards, also when the export fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prunekit.export import export

T = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))


def llama() -> Any:
    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=48)  # fmt: skip
    return T.LlamaForCausalLM(config).eval()


def test_a_causal_lm_with_its_cache_on_exports_its_logits(tmp_path: Path) -> None:
    model = llama()
    assert model.config.use_cache is True
    saved = model.config.to_dict()
    report = export(model, tmp_path / "lm.onnx", "onnx", example_inputs={"input_ids": IDS})
    assert report.difference is not None and report.difference <= 1e-4
    assert any("use_cache" in note for note in report.notes)
    assert model.config.use_cache is True and model.config.to_dict() == saved
    session = ort.InferenceSession(str(tmp_path / "lm.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits"]
    (found,) = session.run(None, {"input_ids": IDS.numpy()})
    with torch.no_grad():
        expected = model(IDS, use_cache=False).logits
    assert float((expected - torch.from_numpy(found)).abs().max()) <= 1e-4 * float(
        expected.abs().max()
    )


def test_a_failed_export_leaves_the_config_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = llama()
    saved = model.config.to_dict()
    seen: list[bool] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        seen.append(model.config.use_cache)
        raise RuntimeError("the exporter broke")

    monkeypatch.setattr("prunekit.export.onnx._exported", failing)
    with pytest.raises(RuntimeError, match="the exporter broke"):
        export(model, tmp_path / "lm.onnx", "onnx", example_inputs={"input_ids": IDS})
    assert seen == [False]  # traced without the cache
    assert model.config.use_cache is True and model.config.to_dict() == saved
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mask", [False, True])
def test_a_causal_lm_exports_from_a_one_token_example(tmp_path: Path, mask: bool) -> None:
    """One token failed inside torch.export (transformers' attention turns the length into
    is_causal, a SymBool where the example's 1 leaves it undecided): the trace runs on the
    token repeated to two, the length stays dynamic, and the file is checked on the one
    token given."""
    model = llama()
    one = {"input_ids": IDS[:, :1]}
    if mask:
        one["attention_mask"] = torch.ones_like(one["input_ids"])
    report = export(model, tmp_path / "lm.onnx", "onnx", example_inputs=one)
    assert report.difference is not None and report.difference <= 1e-4
    assert any("traced on 2 tokens" in note for note in report.notes), report.notes
    session = ort.InferenceSession(str(tmp_path / "lm.onnx"), providers=["CPUExecutionProvider"])
    for length in (1, 5):
        feed = {k: v.repeat(1, length) for k, v in one.items()}
        (found,) = session.run(None, {k: v.numpy() for k, v in feed.items()})
        with torch.no_grad():
            expected = model(**feed, use_cache=False).logits
        assert float((expected - torch.from_numpy(found)).abs().max()) <= 1e-4 * float(
            expected.abs().max()
        )


@pytest.mark.parametrize("length", [7, 1])
def test_a_causal_lm_exports_from_a_batch_of_one(tmp_path: Path, length: int) -> None:
    """A batch of 1 was fixed in the graph by the LM's code, and the export refused: the
    trace runs on the example repeated to a batch of 2 (and a token repeated to 2), both
    axes stay dynamic, and the file is checked on the example as given."""
    model = llama()
    one = {"input_ids": IDS[:1, :length], "attention_mask": torch.ones(1, length, dtype=torch.long)}
    report = export(model, tmp_path / "lm.onnx", "onnx", example_inputs=one)
    assert report.difference is not None and report.difference <= 1e-4
    assert any("traced on a batch of 2" in note for note in report.notes), report.notes
    assert any("traced on 2 tokens" in note for note in report.notes) == (length == 1)
    session = ort.InferenceSession(str(tmp_path / "lm.onnx"), providers=["CPUExecutionProvider"])
    assert [i.shape for i in session.get_inputs()] == [["batch", "sequence"]] * 2
    for rows, times in ((1, 1), (3, 2)):
        feed = {k: v.repeat(rows, times) for k, v in one.items()}
        feed["input_ids"] = (feed["input_ids"] + torch.arange(rows)[:, None]) % 100
        (found,) = session.run(None, {k: v.numpy() for k, v in feed.items()})
        with torch.no_grad():
            expected = model(**feed, use_cache=False).logits
        assert float((expected - torch.from_numpy(found)).abs().max()) <= 1e-4 * float(
            expected.abs().max()
        )
