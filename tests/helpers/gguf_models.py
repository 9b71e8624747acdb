"""Tiny Llama models with a tokenizer, as a Hugging Face folder or a GGUF file, for tests of the
GGUF export and of commands that start from a GGUF file.

``tiny_tokenizer(folder)`` trains a small byte-level BPE (SmolLM2's split: single digits, then
byte level) with ChatML special tokens and saves it as a Hugging Face tokenizer;
``tiny_llama(vocab)`` builds a random LlamaForCausalLM; ``tiny_llama_gguf(path)`` writes both as
one GGUF file (F32, architecture ``llama``), which ``AutoModelForCausalLM.from_pretrained(
path.parent, gguf_file=path.name)`` and ``AutoTokenizer`` (same arguments) load;
``retyped_gguf(source, path, types)`` copies a GGUF file with some tensors in other types (a
source of mixed types, as llama.cpp's quantizer writes them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = [
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "Pruning removes the weights a model needs least; compaction makes it smaller.",
    "llama.cpp runs GGUF files: tokens, merges, tensors and their types.",
] * 4


def tiny_tokenizer(folder: Path, vocab: int = 300) -> Any:
    """Train a byte-level BPE of `vocab` tokens and save it into `folder` (made if missing).

    Returns:
        The transformers tokenizer (PreTrainedTokenizerFast).
    """
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    split = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )  # fmt: skip
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = split
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    core.train_from_iterator(TEXT, trainer=trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>",
        unk_token="<|endoftext|>", pad_token="<|im_end|>",
    )  # fmt: skip
    tokenizer.chat_template = CHAT
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    return tokenizer


def tiny_sentencepiece_tokenizer(folder: Path, vocab: int = 300) -> Any:
    """Train a SentencePiece-style BPE (Llama 2's: "▁" for spaces, byte fallback to 256 byte
    tokens, <unk> <s> </s>) of `vocab` tokens and save it into `folder`.

    Returns:
        The transformers tokenizer (PreTrainedTokenizerFast).
    """
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    core.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
         decoders.Strip(" ", 1, 0)]
    )  # fmt: skip
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False)
    core.train_from_iterator(TEXT, trainer=trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    return tokenizer


def tiny_llama(vocab: int, seed: int = 0, **config: Any) -> torch.nn.Module:
    """A random LlamaForCausalLM: hidden 64, 2 layers, 4 query and 2 key/value heads of 16,
    MLP 96, tied embeddings; `config` overrides any LlamaConfig field."""
    import transformers

    fields: dict[str, Any] = dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, vocab_size=vocab, tie_word_embeddings=True,
        max_position_embeddings=256, rope_theta=10000.0,
    )  # fmt: skip
    fields.update(config)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields)).eval()
    # random norms, so that a norm written in the wrong place shows in the logits
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
    return model


def tiny_llama_gguf(
    path: Path, dtype: str = "f32", vocab: int = 320
) -> tuple[Path, torch.nn.Module]:
    """Write a tiny Llama with a tokenizer as one GGUF file at `path`.

    Its Hugging Face tokenizer folder is made beside it (``<name>.tokenizer``). The model's
    embedding has `vocab` rows (more than the tokenizer's 300 tokens: padded ids).

    Returns:
        The path and the model it was written from.
    """
    from prunekit.export import export

    folder = path.parent / f"{path.name}.tokenizer"
    tiny_tokenizer(folder)
    model = tiny_llama(vocab)
    export(model, path, "gguf", source=folder, dtype=dtype)
    return path, model


def retyped_gguf(source: Path, path: Path, types: dict[str, str]) -> Path:
    """Copy the GGUF file `source` to `path`, each tensor named in `types` in that type (a
    ``GGMLQuantizationType`` name such as ``"Q8_0"``), the others as they are.

    Every field is copied but ``general.file_type``, which is set from the type holding most
    of the new file's bytes. A type the ``gguf`` package cannot quantize (``"Q4_K"``) is
    written as zero bytes of that type's size: a tensor of zeros, for tests of the types a
    writer reads, not of its values.

    Returns:
        `path`.
    """
    import gguf as gg
    import numpy as np

    reader = gg.GGUFReader(source)
    arch = reader.get_field("general.architecture")
    assert arch is not None
    writer = gg.GGUFWriter(str(path), str(arch.contents()))
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        sub = field.types[-1] if field.types[0] == gg.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    sizes: dict[gg.GGMLQuantizationType, int] = {}
    for tensor in reader.tensors:
        qtype = gg.GGMLQuantizationType[types.get(tensor.name, tensor.tensor_type.name)]
        shape = tuple(int(n) for n in reversed(tensor.shape))  # rows last, as numpy has them
        if qtype == tensor.tensor_type:
            data = np.array(tensor.data)
        else:
            values = gg.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
            if qtype == gg.GGMLQuantizationType.F32:
                data = values.astype(np.float32)
            elif qtype == gg.GGMLQuantizationType.F16:
                data = values.astype(np.float16)
            elif qtype in (gg.GGMLQuantizationType.Q4_K, gg.GGMLQuantizationType.Q6_K):
                block, size = gg.GGML_QUANT_SIZES[qtype]
                data = np.zeros((*shape[:-1], shape[-1] // block * size), dtype=np.uint8)
            else:
                data = gg.quants.quantize(values.astype(np.float32), qtype)
        writer.add_tensor(tensor.name, data, raw_dtype=qtype)
        sizes[qtype] = sizes.get(qtype, 0) + data.nbytes
    main = max(sizes, key=lambda t: sizes[t])
    writer.add_file_type(gg.LlamaFileType[f"MOSTLY_{main.name}"] if main.name != "F32"
                         else gg.LlamaFileType.ALL_F32)  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gguf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    """Logits of a ``llama`` or ``deci`` GGUF file on one sequence of `ids` (shape (1, T)),
    computed in torch the way llama.cpp's graph for those architectures does: RMS norms,
    rotary embedding of consecutive pairs (llama.cpp's "normal" rope, with ``rope_freqs``
    factors where present), grouped-query causal attention, SiLU-gated MLP, each layer at the
    widths of its entry in the per-layer arrays. A test reference, not a runtime."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = reader.get_field("general.architecture").contents()

    def key(name: str, layer: int | None = None) -> Any:
        found = reader.get_field(f"{arch}.{name}").contents()
        return found[layer] if isinstance(found, list) and layer is not None else found

    weights = {}
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        weights[tensor.name] = torch.from_numpy(data.copy()).float().reshape(shape)
    eps, dim = key("attention.layer_norm_rms_epsilon"), key("attention.key_length")
    steps = ids.shape[1]
    freqs = key("rope.freq_base") ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if "rope_freqs.weight" in weights:
        freqs = freqs / weights["rope_freqs.weight"].double()
    angles = torch.arange(steps, dtype=torch.float64)[:, None] * freqs[None]
    cos, sin = angles.cos().float()[:, None], angles.sin().float()[:, None]

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weights[name]

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        out = x @ weights[f"{name}.weight"].T
        return out + weights[f"{name}.bias"] if f"{name}.bias" in weights else out

    def rotate(x: torch.Tensor) -> torch.Tensor:  # (T, heads, dim), pairs (2i, 2i + 1)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)

    x = weights["token_embd.weight"][ids[0]]
    causal = torch.full((steps, steps), float("-inf")).triu(1)
    for i in range(key("block_count")):
        heads, groups = key("attention.head_count", i), key("attention.head_count_kv", i)
        h = norm(x, f"blk.{i}.attn_norm.weight")
        q = rotate(linear(h, f"blk.{i}.attn_q").view(steps, heads, dim))
        k = rotate(linear(h, f"blk.{i}.attn_k").view(steps, groups, dim))
        v = linear(h, f"blk.{i}.attn_v").view(steps, groups, dim)
        k, v = (t.repeat_interleave(heads // groups, dim=1) for t in (k, v))
        scores = torch.einsum("qhd,khd->hqk", q, k) / dim**0.5 + causal
        mixed = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(steps, -1)
        x = x + linear(mixed, f"blk.{i}.attn_output")
        h = norm(x, f"blk.{i}.ffn_norm.weight")
        gated = torch.nn.functional.silu(linear(h, f"blk.{i}.ffn_gate")) * linear(
            h, f"blk.{i}.ffn_up"
        )
        x = x + linear(gated, f"blk.{i}.ffn_down")
    out = weights.get("output.weight", weights["token_embd.weight"])
    return (norm(x, "output_norm.weight") @ out.T)[None]
