"""prunekit shrink writes the model in its source's floating type by default (a bfloat16 or
float16 folder stays so, a float32 one float32), or in the one ``--dtype`` /
``ShrinkConfig.dtype`` asks for; it prunes in float32 and rounds at the end, and the
perplexity it reports is of the model as written."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import tiny_llm
from prunekit.structure.measure import perplexity
from prunekit.tools.cli import main
from prunekit.tools.shrink import ShrinkConfig, shrink
from prunekit.tools.shrink_source import Source, source_dtype
from prunekit.tools.shrink_steps import text_windows

transformers = pytest.importorskip("transformers")

FAST: dict[str, Any] = dict(calibration_tokens=256, evaluation_tokens=128, length=32,
                            latency_runs=1)  # fmt: skip
FAST_FLAGS = ["--calibration-tokens", "256", "--eval-tokens", "128", "--length", "32",
              "--latency-runs", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llm.text_file(tmp_path_factory.mktemp("text") / "text.txt")


@pytest.fixture(scope="module")
def float32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llm.save_folder(tmp_path_factory.mktemp("float32") / "model")


def saved_in(dtype: torch.dtype, model: Any, folder: Path) -> Path:
    """`model` saved in `dtype` into `folder` as save_pretrained writes it, with the tiny
    tokenizer."""
    model.to(dtype).save_pretrained(str(folder))
    tiny_llm.tokenizer().save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def bfloat16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_in(torch.bfloat16, tiny_llm.llama(), tmp_path_factory.mktemp("bf16") / "model")


@pytest.fixture(scope="module")
def float16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_in(torch.float16, tiny_llm.llama(), tmp_path_factory.mktemp("f16") / "model")


def config(source: Path, out: Path, text: Path, **options: Any) -> ShrinkConfig:
    return ShrinkConfig(source, out, **{"params": 0.25, "calibration": text, **FAST, **options})


def stored_types(folder: Path) -> set[torch.dtype]:
    """The types of the tensors of the safetensors files of `folder`."""
    return {tensor.dtype for tensor in tiny_llm.folder_tensors(folder).values()}


def written_perplexity(out: Path, cfg: ShrinkConfig) -> float:
    """The perplexity of the written folder loaded in float32 by transformers alone, on the
    windows the report measured."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), trust_remote_code=True, dtype=torch.float32
    ).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    return perplexity(model, text_windows(cfg, tokenizer, model).evaluation)


def test_a_bfloat16_source_is_written_in_bfloat16_and_measured_as_written(
    bfloat16: Path, text: Path, tmp_path: Path
) -> None:
    """The default keeps the source's bfloat16: half the bytes of float32, the config saying
    so, and the perplexity after (distilled, so rounded again after the distillation) that of
    the written weights, not of the float32 model they were rounded from."""
    out = tmp_path / "out"
    cfg = config(bfloat16, out, text, distill=1.0)
    report = shrink(cfg)
    assert report.dtype == "bfloat16"
    assert report.storage == ("safetensors BF16", "safetensors BF16")
    assert stored_types(out) == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert report.bytes.before == (bfloat16 / "model.safetensors").stat().st_size
    assert report.bytes.after == (out / "model.safetensors").stat().st_size
    assert report.bytes.after < 0.9 * report.bytes.before  # a quarter of the MLP and heads
    assert report.distill_steps >= 1
    assert written_perplexity(out, cfg) == pytest.approx(report.perplexity.after, rel=1e-6)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), trust_remote_code=True, dtype="auto"
    )
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    found = json.loads((out / "report.json").read_text())
    assert found["dtype"] == "bfloat16"
    assert "; bfloat16 weights as written)" in report.summary()[0]
    assert "bfloat16 weights as written, computed in float32." in report.to_markdown()


def test_a_float16_source_is_written_in_float16_as_hf_and_gguf(
    float16: Path, text: Path, tmp_path: Path
) -> None:
    """GGUF's default type follows the source too: its matrices F16 (its vectors F32, as
    llama.cpp's converter writes them)."""
    gguf = pytest.importorskip("gguf")
    out = tmp_path / "out"
    cfg = config(float16, out, text, formats=("hf", "gguf"))
    report = shrink(cfg)
    assert report.dtype == "float16"
    assert report.storage == ("safetensors F16", "safetensors F16")
    assert stored_types(out / "hf") == {torch.float16}
    tensors = gguf.GGUFReader(out / "model.gguf").tensors
    assert [t.tensor_type.name for t in tensors] == [
        "F32" if len(t.shape) == 1 else "F16" for t in tensors
    ]
    assert report.bytes.after < report.bytes.before
    assert written_perplexity(out / "hf", cfg) == pytest.approx(report.perplexity.after, rel=1e-6)


def test_a_float32_source_is_written_in_float32_as_before(
    float32: Path, text: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    cfg = config(float32, out, text)
    report = shrink(cfg)
    assert report.dtype == "float32"
    assert report.storage == ("safetensors F32", "safetensors F32")
    assert stored_types(out) == {torch.float32}
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert written_perplexity(out, cfg) == pytest.approx(report.perplexity.after, rel=1e-6)


def test_the_command_writes_the_dtype_asked_for(float32: Path, text: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        status = main(["shrink", str(float32), "-o", str(out), "--params", "0.25",
                       "--calibration", str(text), "--dtype", "bfloat16", *FAST_FLAGS])  # fmt: skip
    assert status == 0
    found = json.loads((out / "report.json").read_text())
    assert found["dtype"] == "bfloat16"
    assert found["storage"] == ["safetensors F32", "safetensors BF16"]
    assert stored_types(out) == {torch.bfloat16}
    assert "(safetensors F32 -> safetensors BF16)" in printed.getvalue()
    cfg = config(float32, out, text)
    assert written_perplexity(out, cfg) == pytest.approx(found["perplexity"]["after"], rel=1e-6)


def test_float32_asked_for_a_bfloat16_source_writes_float32(
    bfloat16: Path, text: Path, tmp_path: Path
) -> None:
    """The former behaviour, asked for: the model as pruned and compensated in float32,
    unrounded; twice the bytes of bfloat16 a weight."""
    out = tmp_path / "out"
    cfg = config(bfloat16, out, text, dtype="float32")
    report = shrink(cfg)
    assert report.dtype == "float32"
    assert report.storage == ("safetensors BF16", "safetensors F32")
    assert stored_types(out) == {torch.float32}
    assert report.bytes.after > report.bytes.before
    assert written_perplexity(out, cfg) == pytest.approx(report.perplexity.after, rel=1e-6)


def test_onnx_beside_a_bfloat16_folder_is_float32_and_says_so(
    bfloat16: Path, text: Path, tmp_path: Path
) -> None:
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    out = tmp_path / "out"
    report = shrink(config(bfloat16, out, text, formats=("hf", "onnx"), kinds=("channels",)))
    assert report.dtype == "bfloat16" and stored_types(out / "hf") == {torch.bfloat16}
    onnx = report.exports[1]
    assert onnx.format == "onnx" and onnx.verified_by is not None
    assert "written in float32, not bfloat16: the type ONNX Runtime's CPU kernels run" in (
        onnx.notes
    )


def test_a_source_beyond_float16_is_refused_at_once(
    text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 weight that float16 would write as inf: refused before the pruning, with
    the tensor, the count, the largest value and the types that hold it."""
    model = tiny_llm.llama()
    with torch.no_grad():
        model.lm_head.weight[3, 5] = 1e5
    source = saved_in(torch.float32, model, tmp_path / "src")
    out = tmp_path / "out"

    def not_reached(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("pruned a model it cannot write")

    monkeypatch.setattr("prunekit.tools.shrink.prune_channels", not_reached)
    with pytest.raises(ValueError) as caught:
        shrink(config(source, out, text, dtype="float16"))
    assert str(caught.value) == (
        "shrink: the source's lm_head.weight holds 1 values beyond float16's range (largest "
        "100000; float16 holds up to 65504), which would be written as inf; expected "
        "dtype='bfloat16' or 'float32' (--dtype), which hold them"
    )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_shrunk_model_beyond_float16_is_refused_before_writing(
    float16: Path, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value the shrink itself puts beyond float16's range (a compensation's, a
    distillation's): refused before anything is written, an earlier output left as it was."""
    from prunekit.tools import shrink as module

    compacted = module._compact

    def and_grown(model: Any, example: Any) -> Any:
        done = compacted(model, example)
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight[0, 0] = -7e4
        return done

    monkeypatch.setattr(module, "_compact", and_grown)
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("{}")  # an earlier output
    with pytest.raises(ValueError, match=r"^shrink: the shrunk model's "
                       r"model\.layers\.0\.mlp\.down_proj\.weight holds 1 values beyond "
                       r"float16's range \(largest 70000;"):  # fmt: skip
        shrink(config(float16, out, text))
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


BAD = [
    ("float64", "'float64'"),
    ("BF16", "'BF16'"),
    ("", "''"),
    (torch.bfloat16, "torch.bfloat16"),
    (None, "None"),
]


@pytest.mark.parametrize(("value", "shown"), BAD, ids=[str(v) for v, _ in BAD])
def test_a_bad_dtype_is_named_with_what_is_allowed(
    value: Any, shown: str, float32: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError) as caught:
        ShrinkConfig(float32, tmp_path / "out", params=0.25, dtype=value)
    assert str(caught.value) == (
        f"ShrinkConfig: invalid dtype={shown}; expected one of 'auto', 'float32', 'float16', "
        "'bfloat16' (by name; 'auto': the source's precision)"
    )
    assert not (tmp_path / "out").exists()


def test_a_half_dtype_with_onnx_alone_is_refused(float32: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"dtype='float16' with formats=\('onnx',\); the onnx "
                       r"format is written in float32"):  # fmt: skip
        ShrinkConfig(float32, tmp_path / "out", params=0.25, dtype="float16", formats=("onnx",))
    for dtype in ("auto", "float32"):  # the onnx file is float32 either way
        ShrinkConfig(float32, tmp_path / "out", params=0.25, dtype=dtype, formats=("onnx",))


def test_the_command_refuses_a_dtype_it_does_not_know(
    float32: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["shrink", str(float32), "-o", str(tmp_path / "out"), "--params", "0.25",
                   "--dtype", "float64"])  # fmt: skip
    assert status == 2
    error = capsys.readouterr().err
    assert "argument --dtype: invalid choice: 'float64'" in error
    assert "'auto', 'float32', 'float16', 'bfloat16'" in error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("storage", "values", "expected"),
    [
        ("safetensors BF16", {"dtype": "float32"}, torch.bfloat16),  # the weights decide
        ("safetensors F16", {}, torch.float16),
        ("safetensors F32", {"torch_dtype": "bfloat16"}, torch.float32),
        ("safetensors I8", {"dtype": "bfloat16"}, torch.bfloat16),  # quantized: the config's
        ("safetensors I8", {"torch_dtype": "float16"}, torch.float16),  # older transformers'
        ("safetensors I8", {"dtype": "float64"}, torch.float32),
        ("safetensors", {}, torch.float32),
    ],
)
def test_the_source_dtype_is_its_weights_then_its_config(
    storage: str, values: dict[str, str], expected: torch.dtype, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **values}))
    source = Source(tmp_path, tmp_path, None, "llama", (), storage)
    assert source_dtype(source) is expected


@pytest.mark.parametrize(
    ("storage", "expected"),
    [("GGUF BF16", torch.bfloat16), ("GGUF F16", torch.float16), ("GGUF F32", torch.float32)],
)  # fmt: skip
def test_a_gguf_source_dtype_is_its_float_type(
    storage: str, expected: torch.dtype, tmp_path: Path
) -> None:
    source = Source(tmp_path / "m.gguf", tmp_path, "m.gguf", "llama", (), storage)
    assert source_dtype(source) is expected


def quantized_file(path: Path, matrix: str) -> Path:
    """A GGUF file of one Q8_0 matrix (most of its bytes), one `matrix` (F16 or BF16) matrix
    and one F32 vector: the layout of a quantized file whose embedding stayed a float."""
    gguf = pytest.importorskip("gguf")
    types = gguf.GGMLQuantizationType
    writer = gguf.GGUFWriter(str(path), "llama")
    values = torch.linspace(-1, 1, 64 * 256).reshape(256, 64).numpy()
    writer.add_tensor("blk.0.ffn_up.weight", gguf.quants.quantize(values, types.Q8_0),
                      raw_dtype=types.Q8_0)  # fmt: skip
    small = values[:4]
    writer.add_tensor("token_embd.weight", gguf.quants.quantize(small, types[matrix]),
                      raw_dtype=types[matrix])  # fmt: skip
    writer.add_tensor("output_norm.weight", values[0].copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(("matrix", "expected"), [("F16", torch.float16),
                                                  ("BF16", torch.bfloat16)])  # fmt: skip
def test_a_quantized_gguf_source_dtype_is_a_half_type_not_float32(
    matrix: str, expected: torch.dtype, tmp_path: Path
) -> None:
    """A quantized GGUF file is written in float16 (its blocks' scales are float16), or in
    bfloat16 where its unquantized matrices are: never in float32, which would take four
    bytes a weight where Q8_0 takes about one."""
    path = quantized_file(tmp_path / "m.gguf", matrix)
    source = Source(path, tmp_path, "m.gguf", "llama", (path,), "GGUF Q8_0")
    assert source_dtype(source) is expected


@pytest.fixture(scope="module")
def q8_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    from helpers import gguf_models

    path = tmp_path_factory.mktemp("q8_0") / "tiny.gguf"
    return gguf_models.tiny_llama_gguf(path, dtype="q8_0")[0]


@pytest.fixture(scope="module")
def q4_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    from helpers import gguf_models

    path = tmp_path_factory.mktemp("q4_0") / "tiny.gguf"
    return gguf_models.tiny_llama_gguf(path, dtype="q4_0")[0]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Q4_1 file whose embedding (tied to the output) is Q8_0, as SmolLM2's Q4_1 file
    keeps it."""
    pytest.importorskip("gguf")
    from helpers import gguf_models

    folder = tmp_path_factory.mktemp("mixed")
    q4_1 = gguf_models.tiny_llama_gguf(folder / "q4_1.gguf", dtype="q4_1")[0]
    return gguf_models.retyped_gguf(q4_1, folder / "tiny.gguf", {"token_embd.weight": "Q8_0"})


def gguf_types(path: Path) -> dict[str, str]:
    """Each tensor's type in the GGUF file at `path`, by name."""
    gguf = pytest.importorskip("gguf")
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


class FileLM(torch.nn.Module):
    """A written GGUF file's logits, computed from its dequantized tensors as llama.cpp's
    llama and deci graphs compute them (``gguf_models.gguf_logits``)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        from helpers import gguf_models

        return gguf_models.gguf_logits(self.path, input_ids)


def gguf_perplexity(path: Path, tokenizer_folder: Path, cfg: ShrinkConfig) -> float:
    """The perplexity of a written GGUF file (its weights as a reader dequantizes them), on
    the windows the report measured."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_folder))
    model = FileLM(path)
    return perplexity(model, text_windows(cfg, tokenizer, model).evaluation)


def test_a_q8_0_gguf_source_is_written_in_float16_as_hf(
    q8_0: Path, text: Path, tmp_path: Path
) -> None:
    """--dtype auto no longer inflates a quantized source to float32: float16 (its scales'
    type), measured as written."""
    out = tmp_path / "out"
    cfg = config(q8_0, out, text)
    report = shrink(cfg)
    assert report.dtype == "float16" and report.gguf_type == ""
    assert report.storage == ("GGUF Q8_0", "safetensors F16")
    assert stored_types(out) == {torch.float16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    assert written_perplexity(out, cfg) == pytest.approx(report.perplexity.after, rel=1e-6)


def test_a_q4_0_gguf_source_is_requantized_to_q4_0_and_measured_as_written(
    q4_0: Path, text: Path, tmp_path: Path
) -> None:
    """As gguf, the source's own type: its matrices Q4_0 (its vectors F32; widths kept
    whole blocks of 32 without being asked, so that every matrix is quantized), and the
    perplexity after that of the file as a reader dequantizes it; the hf folder beside it
    holds the same weights in float16."""
    gguf = pytest.importorskip("gguf")
    out = tmp_path / "out"
    cfg = config(q4_0, out, text, formats=("gguf", "hf"), kinds=("channels",))
    report = shrink(cfg)
    assert report.dtype == "float16" and report.gguf_type == "q4_0"
    assert report.storage == ("GGUF Q4_0", "GGUF Q4_0")
    tensors = gguf.GGUFReader(out / "model.gguf").tensors
    assert [t.tensor_type.name for t in tensors] == [
        "F32" if len(t.shape) == 1 else "Q4_0" for t in tensors
    ]
    assert report.bytes.after < report.bytes.before
    ppl = report.perplexity.after
    assert gguf_perplexity(out / "model.gguf", out / "hf", cfg) == pytest.approx(ppl, rel=1e-5)
    assert written_perplexity(out / "hf", cfg) == pytest.approx(ppl, rel=1e-3)
    assert "; float16 weights, matrices rounded to Q4_0, as written)" in report.summary()[0]
    assert "re-quantized to Q4_0, the source's type" in report.exports[0].notes
    assert json.loads((out / "report.json").read_text())["gguf_type"] == "q4_0"


def test_a_gguf_source_s_types_are_kept_tensor_by_tensor(
    mixed: Path, text: Path, tmp_path: Path
) -> None:
    """The embedding the source keeps in Q8_0 stays Q8_0, the other matrices Q4_1, the
    vectors F32 (it was written Q4_1 with the rest: the shrunk model lost what the source
    had not); the perplexity after is that of the file as a reader dequantizes it."""
    out = tmp_path / "out"
    cfg = config(mixed, out, text, formats=("gguf", "hf"), kinds=("channels",))
    report = shrink(cfg)
    written = gguf_types(out / "model.gguf")
    assert written["token_embd.weight"] == "Q8_0"
    assert written == gguf_types(mixed)
    ppl = report.perplexity.after
    assert gguf_perplexity(out / "model.gguf", out / "hf", cfg) == pytest.approx(ppl, rel=1e-5)
    assert written_perplexity(out / "hf", cfg) == pytest.approx(ppl, rel=1e-3)
    assert report.gguf_type == "q4_1,q8_0"
    assert "matrices rounded to the source's Q4_1 and Q8_0," in report.summary()[0]
    assert "in the source's types, tensor by tensor" in "\n".join(report.exports[0].notes)


def test_an_explicit_gguf_type_wins_over_the_source_s_types(
    mixed: Path, text: Path, tmp_path: Path
) -> None:
    """--gguf-type q4_1 asks for one type: the embedding too is Q4_1, as before."""
    out = tmp_path / "out"
    shrink(config(mixed, out, text, formats=("gguf",), kinds=("channels",), gguf_type="q4_1"))
    written = gguf_types(out / "model.gguf")
    assert written["token_embd.weight"] == "Q4_1"
    assert {kind for name, kind in written.items() if "norm" not in name} == {"Q4_1"}
    assert json.loads((out / "report.json").read_text())["gguf_type"] == "q4_1"


def test_the_source_s_types_of_a_folder_are_refused_before_anything_is_written(
    float32: Path, text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("{}")  # an earlier output: left as it was
    status = main(["shrink", str(float32), "-o", str(out), "--params", "0.25",
                   "--calibration", str(text), "--format", "gguf", "--gguf-type", "source",
                   *FAST_FLAGS])  # fmt: skip
    error = capsys.readouterr().err
    assert status == 1
    assert "gguf_type='source' writes each tensor in the type its GGUF source holds it in" in error
    assert "expected a GGUF source, or gguf_type one of f32, f16, bf16, q8_0" in error
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]
    assert (out / "report.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_gguf_type_asked_for_wins_over_the_source_s(
    q4_0: Path, text: Path, tmp_path: Path
) -> None:
    gguf = pytest.importorskip("gguf")
    out = tmp_path / "out"
    report = shrink(config(q4_0, out, text, formats=("gguf",), gguf_type="f16"))
    assert report.gguf_type == "" and report.storage == ("GGUF Q4_0", "GGUF F16")
    types = {t.tensor_type.name for t in gguf.GGUFReader(out / "model.gguf").tensors}
    assert types == {"F32", "F16"}


@pytest.mark.parametrize(
    ("kinds", "options", "expected"),
    [
        (("Q4_0", "F32"), {}, "re-quantized to Q4_0, the source's type"),
        (("Q4_1", "Q8_0", "F32"), {},
         "re-quantized in the source's types, tensor by tensor (Q4_1, Q8_0)"),
        (("Q4_K", "Q6_K", "Q8_0", "F32"), {}, "in the source's types, tensor by tensor, but "
         "F16 for those in Q4_K, Q6_K, which the gguf package does not quantize (llama.cpp's "
         "llama-quantize makes them from this file)"),
        (("Q4_K", "F32"), {"gguf_type": "q8_0"}, None),  # asked for: nothing to explain
        (("Q4_0", "F32"), {"dtype": "float32"}, None),  # a type asked for: written as asked
        (("F16", "F32"), {}, None),
        ((), {}, None),  # no GGUF source
    ],
)  # fmt: skip
def test_the_gguf_record_says_what_became_of_a_quantized_source_s_types(
    kinds: tuple[str, ...], options: dict[str, Any], expected: str | None, float32: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    from prunekit.tools.shrink import gguf_note

    gguf = bool(kinds)
    source = Source(tmp_path / "m.gguf", tmp_path, "m.gguf" if gguf else None, "llama", ())
    cfg = ShrinkConfig(float32, tmp_path / "out", params=0.25, formats=("gguf",), **options)
    written = cfg.written_dtype(torch.float16)
    assert gguf_note(cfg, cfg.written_gguf_type(source, written), kinds) == expected


def test_weights_a_quantized_type_cannot_scale_are_refused_and_left_as_they_were() -> None:
    """Q8_0 keeps a block's scale (its largest value / 127) in float16: a block beyond
    127 x 65504 would be written with an inf scale. Refused, naming the tensor, before any
    weight of the model is rounded."""
    pytest.importorskip("gguf")
    from prunekit.tools.shrink import _as_written

    model = torch.nn.Sequential(torch.nn.Linear(32, 4), torch.nn.Linear(32, 4))
    with torch.no_grad():
        model[1].weight[2, 7] = 1e7
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"^shrink: the shrunk model's 1\.weight holds values "
                       r"whose q8_0 blocks would be written with an inf scale \(largest 1e\+07"
                       ):  # fmt: skip
        _as_written(model, torch.bfloat16, "q8_0")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
