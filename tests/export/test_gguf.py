"""prunekit.export format='gguf': one file llama.cpp runs, read back by gguf's own reader and,
for uniform llama files, loaded back by transformers' GGUF loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf as gg
import pytest
import torch

import prunekit
from helpers.gguf_models import (
    gguf_logits,
    retyped_gguf,
    tiny_llama,
    tiny_llama_gguf,
    tiny_sentencepiece_tokenizer,
    tiny_tokenizer,
)
from prunekit.export import decoder_layers, export

transformers = pytest.importorskip("transformers")

Q = gg.GGMLQuantizationType
IDS = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    tiny_tokenizer(folder)
    return folder


def value(reader: gg.GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    assert field is not None, key
    return field.contents()


def tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (type, shape in torch's order)"""
    found = gg.GGUFReader(path).tensors
    return {t.name: (t.tensor_type.name, tuple(reversed(t.shape.tolist()))) for t in found}


def budgeted(layers: int = 4) -> torch.nn.Module:
    """A tiny Llama whose layers a Budget leaves at different widths."""
    model = tiny_llama(320, num_hidden_layers=layers, intermediate_size=128)
    prunekit.prune_channels(model, IDS, budget=prunekit.Budget(params=0.3))
    with pytest.warns(UserWarning, match="cannot rebuild the compacted model from its config"):
        prunekit.compact(model, IDS, latency_runs=0)
    return model


def test_uniform_widths_are_the_llama_architecture(tmp_path: Path, tokenizer: Path) -> None:
    model = tiny_llama(320, num_hidden_layers=3, tie_word_embeddings=False)
    report = export(model, tmp_path / "m.gguf", "gguf", source=tokenizer)
    reader = gg.GGUFReader(tmp_path / "m.gguf")
    assert value(reader, "general.architecture") == "llama"
    expected = {
        "llama.block_count": 3, "llama.embedding_length": 64, "llama.feed_forward_length": 96,
        "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
        "llama.attention.key_length": 16, "llama.rope.dimension_count": 16,
        "llama.context_length": 256, "llama.vocab_size": 320, "general.file_type": 0,
    }  # fmt: skip
    assert {key: value(reader, key) for key in expected} == expected
    assert value(reader, "llama.rope.freq_base") == 10000.0
    assert value(reader, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    found = tensors(tmp_path / "m.gguf")
    params = dict(model.named_parameters())
    assert len(found) == len(params) == 3 * 9 + 3
    assert found["output.weight"] == ("F32", (320, 64))
    assert found["blk.2.attn_k.weight"] == (
        "F32",
        tuple(params["model.layers.2.self_attn.k_proj.weight"].shape),
    )
    assert found["blk.0.ffn_down.weight"] == ("F32", (64, 96))
    assert report.verified_by is not None and "transformers" in report.verified_by
    assert report.difference is not None and report.difference <= 1e-5


def test_per_layer_widths_are_deci_arrays(tmp_path: Path, tokenizer: Path) -> None:
    model = budgeted()
    layers = decoder_layers(model)
    assert len({layer.ffn for layer in layers}) > 1
    report = export(model, tmp_path / "m.gguf", "gguf", source=tokenizer)
    reader = gg.GGUFReader(tmp_path / "m.gguf")
    assert value(reader, "general.architecture") == "deci"
    assert value(reader, "deci.feed_forward_length") == [layer.ffn for layer in layers]
    assert value(reader, "deci.attention.head_count") == [layer.heads for layer in layers]
    assert value(reader, "deci.attention.head_count_kv") == [layer.kv_heads for layer in layers]
    assert value(reader, "deci.attention.key_length") == 16
    found = tensors(tmp_path / "m.gguf")
    for i, layer in enumerate(model.model.layers):
        assert found[f"blk.{i}.ffn_gate.weight"][1] == (layers[i].ffn, 64)
        assert found[f"blk.{i}.ffn_down.weight"][1] == (64, layers[i].ffn)
        assert found[f"blk.{i}.attn_q.weight"][1] == tuple(layer.self_attn.q_proj.weight.shape)
        assert found[f"blk.{i}.attn_output.weight"][1] == tuple(layer.self_attn.o_proj.weight.shape)
    assert "output.weight" not in found  # tied
    assert report.verified_by is not None and "GGUFReader" in report.verified_by
    assert "architecture deci" in report.notes[0]
    with torch.no_grad():  # run the way llama.cpp's deci graph runs it
        expected = model(IDS[:1]).logits
    torch.testing.assert_close(
        gguf_logits(tmp_path / "m.gguf", IDS[:1]), expected, rtol=1e-4, atol=1e-5
    )


def test_f32_file_loaded_by_transformers_gives_the_model_logits(tmp_path: Path) -> None:
    # transformers undoes llama.cpp's q/k row order: equal logits check the permutation
    path, model = tiny_llama_gguf(tmp_path / "m.gguf")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf")
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, model(IDS).logits, rtol=1e-5, atol=1e-5)
    q = gg.GGUFReader(path).tensors[
        [t.name for t in gg.GGUFReader(path).tensors].index("blk.0.attn_q.weight")
    ]
    assert not torch.equal(
        torch.from_numpy(q.data.copy()), model.model.layers[0].self_attn.q_proj.weight
    )


@pytest.mark.parametrize(("dtype", "matrix"), [("f16", "F16"), ("bf16", "BF16"), ("q8_0", "Q8_0")])
def test_tensor_types(tmp_path: Path, tokenizer: Path, dtype: str, matrix: str) -> None:
    model = tiny_llama(320, intermediate_size=80)  # down_proj rows of 80: not Q8_0 blocks
    report = export(model, tmp_path / "m.gguf", "gguf", source=tokenizer, dtype=dtype)
    found = tensors(tmp_path / "m.gguf")
    assert found["blk.0.attn_norm.weight"][0] == found["output_norm.weight"][0] == "F32"
    assert found["blk.1.attn_q.weight"][0] == found["token_embd.weight"][0] == matrix
    assert found["blk.1.ffn_down.weight"][0] == ("F16" if dtype == "q8_0" else matrix)
    assert found["blk.1.ffn_up.weight"][0] == matrix
    assert report.difference is not None and 0 < report.difference < 0.06


@pytest.mark.parametrize("dtype", ["q5_1", "q5_0", "q4_1", "q4_0"])
def test_the_legacy_quantized_types(tmp_path: Path, tokenizer: Path, dtype: str) -> None:
    """llama.cpp's 4- and 5-bit types, as the gguf package quantizes them: the file's
    matrices hold what ``stored`` says, its logits those of those values."""
    from prunekit.export.gguf_writer import stored

    model = tiny_llama(320, intermediate_size=80)
    report = export(model, tmp_path / "m.gguf", "gguf", source=tokenizer, dtype=dtype)
    found = tensors(tmp_path / "m.gguf")
    assert found["blk.1.attn_q.weight"][0] == found["blk.1.ffn_up.weight"][0] == dtype.upper()
    assert found["blk.1.ffn_down.weight"][0] == "F16"  # rows of 80: not blocks of 32
    assert found["blk.0.attn_norm.weight"][0] == "F32"
    assert [note for note in report.notes if note.startswith("F16 for")] == [  # norms: F32
        f"F16 for 2 matrices with rows of 80 values, not whole {dtype.upper()} blocks of 32: "
        "blk.0.ffn_down.weight, blk.1.ffn_down.weight"
    ]
    assert report.difference is not None and 0 < report.difference < 0.25
    reader = gg.GGUFReader(tmp_path / "m.gguf")
    up = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
    held = gg.quants.dequantize(up.data, up.tensor_type).reshape(80, 64)
    weight = model.model.layers[0].mlp.up_proj.weight
    assert torch.equal(torch.from_numpy(held.copy()), stored(weight, dtype))
    again = stored(stored(weight, dtype), dtype)  # written once more, the same values
    assert torch.equal(again, stored(weight, dtype))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Q4_1 file of mixed types, as llama.cpp's quantizer writes them: its embedding Q8_0,
    an up projection Q5_0, a value projection F16, a key projection in Q4_K (which the gguf
    package does not quantize), the rest Q4_1, the vectors F32."""
    folder = tmp_path_factory.mktemp("mixed")
    q4_1, _ = tiny_llama_gguf(folder / "q4_1.gguf", dtype="q4_1")
    return retyped_gguf(q4_1, folder / "mixed.gguf", {
        "token_embd.weight": "Q8_0", "blk.1.ffn_up.weight": "Q5_0",
        "blk.0.attn_v.weight": "F16", "blk.1.attn_k.weight": "Q4_K"})  # fmt: skip


def test_each_tensor_is_written_in_its_source_s_type(tmp_path: Path, mixed: Path) -> None:
    """dtype='source': each tensor in the type the source holds it in; F16 for the Q4_K one
    and for the down projections (rows of 80: not Q4_1 blocks), each named in the notes;
    every value is what ``stored`` says for its parameter's type (``written_types``)."""
    from prunekit.export.gguf_writer import source_types, stored, written_types

    model = tiny_llama(320, intermediate_size=80, seed=1)
    report = export(model, tmp_path / "m.gguf", "gguf", source=mixed, dtype="source")
    found = {name: kind for name, (kind, _) in tensors(tmp_path / "m.gguf").items()}
    held = source_types(mixed)
    fallback = {"blk.1.attn_k.weight", "blk.0.ffn_down.weight", "blk.1.ffn_down.weight"}
    assert found == {name: "F16" if name in fallback else kind for name, kind in held.items()}
    assert found["token_embd.weight"] == "Q8_0" and found["blk.1.ffn_up.weight"] == "Q5_0"
    assert found["blk.0.attn_v.weight"] == "F16" and found["blk.0.attn_q.weight"] == "Q4_1"
    # the file type: the type of most bytes, here F16 (the down projections, a key and a
    # value projection: 28,672 bytes against Q4_1's 22,400 and Q8_0's 21,760)
    assert value(gg.GGUFReader(tmp_path / "m.gguf"), "general.file_type") == 1  # MOSTLY_F16
    assert report.notes[0].endswith("in the source's types, tensor by tensor")
    assert ("F16 for 1 matrix held in Q4_K by the source, a type the gguf package does not "
            "quantize (llama.cpp's llama-quantize makes it from this file): "
            "blk.1.attn_k.weight") in report.notes  # fmt: skip
    assert ("F16 for 2 matrices with rows of 80 values, not whole Q4_1 blocks of 32: "
            "blk.0.ffn_down.weight, blk.1.ffn_down.weight") in report.notes  # fmt: skip
    assert report.difference is not None and 0 < report.difference < 0.25
    types = written_types(model, held)
    assert types["lm_head.weight"] == types["model.embed_tokens.weight"] == "q8_0"  # tied
    assert types["model.layers.1.self_attn.k_proj.weight"] == "f16"
    assert types["model.norm.weight"] == "f32"
    reader = gg.GGUFReader(tmp_path / "m.gguf")
    file = {t.name: gg.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    compared = 0
    for path, parameter in model.named_parameters():
        if "q_proj" in path or "k_proj" in path:  # rows reordered for the rotation
            continue
        held_values = torch.from_numpy(file[gguf_name(path)].copy()).reshape(parameter.shape)
        assert torch.equal(held_values, stored(parameter, types[path])), path
        compared += 1
    assert compared == 2 + 2 * 7  # embedding, final norm; each layer's but q and k


_LAYER_NAMES = {"input_layernorm": "attn_norm", "v_proj": "attn_v", "o_proj": "attn_output",
                "post_attention_layernorm": "ffn_norm", "gate_proj": "ffn_gate",
                "up_proj": "ffn_up", "down_proj": "ffn_down"}  # fmt: skip


def gguf_name(path: str) -> str:
    """The GGUF tensor of a tiny Llama's parameter (but q_proj, k_proj and lm_head)."""
    top = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight"}  # fmt: skip
    if path in top:
        return top[path]
    _, _, layer, *rest = path.split(".")  # model.layers.N.[self_attn.|mlp.]NAME.weight
    return f"blk.{layer}.{_LAYER_NAMES[rest[-2]]}.weight"


def test_an_explicit_type_wins_over_the_source_s(tmp_path: Path, mixed: Path) -> None:
    model = tiny_llama(320, seed=1)
    export(model, tmp_path / "m.gguf", "gguf", source=mixed, dtype="q4_1")
    found = tensors(tmp_path / "m.gguf")
    assert {kind for name, (kind, shape) in found.items() if len(shape) == 2} == {"Q4_1"}


def test_no_dtype_keeps_the_model_s_float_type(tmp_path: Path, tokenizer: Path) -> None:
    model = tiny_llama(320).to(torch.bfloat16)
    export(model, tmp_path / "m.gguf", "gguf", source=tokenizer)
    assert tensors(tmp_path / "m.gguf")["blk.0.attn_v.weight"][0] == "BF16"
    assert value(gg.GGUFReader(tmp_path / "m.gguf"), "general.file_type") == 32


def test_the_tokenizer_is_copied_from_a_gguf_source(tmp_path: Path) -> None:
    source, _ = tiny_llama_gguf(tmp_path / "source.gguf")
    model = tiny_llama(330, seed=1)  # ten rows more than the source's tokens
    export(model, tmp_path / "m.gguf", "gguf", source=source)
    old, new = gg.GGUFReader(source), gg.GGUFReader(tmp_path / "m.gguf")
    keys = [key for key in old.fields if key.startswith("tokenizer.")]
    assert {"tokenizer.ggml.merges", "tokenizer.chat_template", "tokenizer.ggml.pre"} <= set(keys)
    assert keys == [key for key in new.fields if key.startswith("tokenizer.")]
    for key in keys:
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            assert value(new, key)[:320] == value(old, key)
            assert len(value(new, key)) == 330
        else:
            assert value(new, key) == value(old, key), key
    assert value(new, "tokenizer.ggml.tokens")[325] == "[PAD325]"
    assert value(new, "tokenizer.ggml.token_type")[325] == gg.TokenType.UNUSED


def test_the_tokenizer_of_a_hugging_face_folder(tmp_path: Path, tokenizer: Path) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(tokenizer)
    export(tiny_llama(320), tmp_path / "m.gguf", "gguf", source=tokenizer)
    reader = gg.GGUFReader(tmp_path / "m.gguf")
    assert value(reader, "tokenizer.ggml.model") == "gpt2"
    assert value(reader, "tokenizer.ggml.pre") == "smollm"  # single digits, then byte level
    tokens = value(reader, "tokenizer.ggml.tokens")
    types = value(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == 320
    for text, i in hf.get_vocab().items():
        assert tokens[i] == text
    assert types[hf.convert_tokens_to_ids("<|im_end|>")] == gg.TokenType.CONTROL
    assert types[hf.convert_tokens_to_ids("a")] == gg.TokenType.NORMAL
    assert types[310] == gg.TokenType.UNUSED and tokens[310] == "[PAD310]"
    assert len(value(reader, "tokenizer.ggml.merges")) > 0
    assert value(reader, "tokenizer.ggml.bos_token_id") == hf.bos_token_id
    assert value(reader, "tokenizer.ggml.eos_token_id") == hf.eos_token_id
    assert "im_start" in value(reader, "tokenizer.chat_template")
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    text = "Pruning 2048 weights, then compaction."
    assert loaded(text).input_ids[-8:] == hf(text).input_ids[-8:]


def test_the_sentencepiece_tokenizer_of_a_hugging_face_folder(tmp_path: Path) -> None:
    hf = tiny_sentencepiece_tokenizer(tmp_path / "sp")
    export(tiny_llama(320), tmp_path / "m.gguf", "gguf", source=tmp_path / "sp")
    reader = gg.GGUFReader(tmp_path / "m.gguf")
    assert value(reader, "tokenizer.ggml.model") == "llama"
    tokens, types = (
        value(reader, "tokenizer.ggml.tokens"),
        value(reader, "tokenizer.ggml.token_type"),
    )
    assert len(tokens) == len(value(reader, "tokenizer.ggml.scores")) == 320
    assert tokens[:4] == ["<unk>", "<s>", "</s>", "<0x00>"]
    assert types[3] == gg.TokenType.BYTE and types[1] == gg.TokenType.CONTROL
    assert types[319] == gg.TokenType.UNUSED
    assert value(reader, "tokenizer.ggml.bos_token_id") == hf.bos_token_id
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    text = "Pruning removes weights"
    assert loaded(text, add_special_tokens=False).input_ids == hf(text).input_ids


def test_qwen2_biases_are_written_in_llama_s_row_order(tmp_path: Path, tokenizer: Path) -> None:
    config = transformers.Qwen2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, vocab_size=320, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.bias.copy_(torch.arange(32.0))
    report = export(model, tmp_path / "m.gguf", "gguf", source=tokenizer)
    reader = gg.GGUFReader(tmp_path / "m.gguf")
    found = {t.name: t for t in reader.tensors}
    assert found["blk.0.attn_v.bias"].tensor_type == Q.F32
    # each head of 16: its halves (0..7, 8..15) interleaved in pairs
    assert found["blk.1.attn_k.bias"].data[:6].tolist() == [0, 8, 1, 9, 2, 10]
    assert report.verified_by is not None and "GGUFReader" in report.verified_by
    with torch.no_grad():
        expected = model(IDS[:1]).logits
    torch.testing.assert_close(
        gguf_logits(tmp_path / "m.gguf", IDS[:1]), expected, rtol=1e-4, atol=1e-5
    )


def test_llama3_rotary_scaling_is_written_as_rope_factors(tmp_path: Path, tokenizer: Path) -> None:
    rope = {"rope_type": "llama3", "factor": 8.0, "rope_theta": 10000.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
    model = tiny_llama(320, rope_parameters=rope)
    export(model, tmp_path / "m.gguf", "gguf", source=tokenizer)
    factors = {t.name: t for t in gg.GGUFReader(tmp_path / "m.gguf").tensors}["rope_freqs.weight"]
    assert factors.tensor_type == Q.F32 and factors.data.shape == (8,)
    assert factors.data[0] == pytest.approx(1.0) and factors.data[-1] == pytest.approx(8.0)
    with torch.no_grad():
        expected = model(IDS[:1]).logits
    torch.testing.assert_close(
        gguf_logits(tmp_path / "m.gguf", IDS[:1]), expected, rtol=1e-4, atol=1e-5
    )


def refused(tmp_path: Path, model: torch.nn.Module, match: str, error: type = ValueError,
            **kwargs: Any) -> None:  # fmt: skip
    """The export is refused with `match`; the file there and its folder stay as they were."""
    target = tmp_path / "m.gguf"
    target.write_bytes(b"old")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(error, match=match):
        export(model, target, "gguf", **kwargs)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_model_with_masks_installed_is_refused(tmp_path: Path, tokenizer: Path) -> None:
    model = tiny_llama(320)
    prunekit.prune_channels(model, IDS, amount=0.25)
    refused(tmp_path, model, r"masks installed.*prunekit\.compact", source=tokenizer)


def test_qwen3_and_other_families_are_refused(tmp_path: Path, tokenizer: Path) -> None:
    config = transformers.Qwen3Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, intermediate_size=48, vocab_size=320,
    )  # fmt: skip
    refused(tmp_path, transformers.Qwen3ForCausalLM(config), r"qwen3.*q_norm/k_norm.*format='hf'",
            source=tokenizer)  # fmt: skip
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2))
    refused(tmp_path, gpt2, r"model_type 'gpt2'.*llama, mistral, qwen2", TypeError,
            source=tokenizer)  # fmt: skip


def test_unknown_dtype_is_named(tmp_path: Path, tokenizer: Path) -> None:
    refused(tmp_path, tiny_llama(320), r"dtype='q4_k'.*f32, f16, bf16, q8_0, q5_1, q5_0, "
            r"q4_1, q4_0, 'source' \(each tensor in its GGUF source's type\) \(or None",
            source=tokenizer, dtype="q4_k")  # fmt: skip


def test_the_source_s_types_need_a_gguf_source(tmp_path: Path, tokenizer: Path) -> None:
    """'source' reads the types from a GGUF file: a folder, no source or a file that is no
    GGUF is refused, naming dtype and what it takes; the file there stays as it was."""
    for source, why in [(None, r"source=None"), (tokenizer, r"which is no file"),
                        (tokenizer / "tokenizer.json", r"which is no GGUF file")]:  # fmt: skip
        refused(tmp_path, tiny_llama(320), rf"^export: dtype='source'.*{why}.*expected the "
                r"GGUF file the model came from, or a dtype among f32, f16, bf16, q8_0",
                source=source, dtype="source")  # fmt: skip


def test_no_tokenizer_is_refused(tmp_path: Path, tokenizer: Path) -> None:
    refused(tmp_path, tiny_llama(320), r"source=None.*tokenizer")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(tmp_path, tiny_llama(320), r"source=.*empty.*no tokenizer\.json", source=empty)
    refused(tmp_path, tiny_llama(100), r"300 tokens.*100 rows|token id \d+ and the model's "
            r"embedding 100 rows", source=tokenizer)  # fmt: skip


def test_what_llama_cpp_would_misread_is_refused(tmp_path: Path, tokenizer: Path) -> None:
    yarn = tiny_llama(320, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                            "rope_theta": 10000.0,
                                            "original_max_position_embeddings": 64})  # fmt: skip
    refused(tmp_path, yarn, r"rope_type 'yarn'", source=tokenizer)
    gelu = tiny_llama(320, hidden_act="gelu")
    refused(tmp_path, gelu, r"hidden_act 'gelu'.*silu", source=tokenizer)
    model = tiny_llama(320)
    model.model.layers[0].mlp.extra = torch.nn.Linear(2, 2)
    refused(tmp_path, model, r"parameter 'model\.layers\.0\.mlp\.extra\.weight'", source=tokenizer)


def test_bad_example_inputs_are_refused(tmp_path: Path, tokenizer: Path) -> None:
    refused(tmp_path, tiny_llama(320), r"example_inputs.*token ids", source=tokenizer,
            example_inputs=torch.randn(2, 3))  # fmt: skip


def test_verify_false_writes_without_reading_back(tmp_path: Path, tokenizer: Path) -> None:
    report = export(tiny_llama(320), tmp_path / "m.gguf", "gguf", source=tokenizer, verify=False)
    assert report.verified_by is None and report.difference is None
    assert value(gg.GGUFReader(tmp_path / "m.gguf"), "general.architecture") == "llama"
