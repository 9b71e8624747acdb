"""A tiny Llama with a small byte-level BPE tokenizer, saved as a Hugging Face folder (one
weights file or shards), for tests of what reads a model from disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TEXT = (
    "The quick brown fox jumps over the lazy dog. A pruned model keeps the units that matter "
    "and drops the rest; compaction removes them for real, so the model is smaller and faster. "
)


def tokenizer(vocab: int = 300) -> Any:
    """A byte-level BPE tokenizer of `vocab` tokens trained on TEXT (every byte has a token,
    so any text tokenizes)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT] * 4, vocab_size=vocab, min_frequency=1, show_progress=False,
                            special_tokens=["<|endoftext|>"])  # fmt: skip
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>")  # fmt: skip


def llama(vocab: int = 300, layers: int = 2, seed: int = 0) -> Any:
    """A tiny LlamaForCausalLM (hidden 32, 4 query heads in 2 key/value groups, MLP 64)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def save_folder(folder: Path, sharded: bool = False, with_tokenizer: bool = True) -> Path:
    """A tiny Llama saved in `folder` (in shards of about 20 kB when `sharded`), with its
    tokenizer; returns the folder."""
    model = llama()
    model.save_pretrained(str(folder), max_shard_size="20KB" if sharded else "1GB")
    if with_tokenizer:
        tokenizer().save_pretrained(str(folder))
    return folder


def text_file(path: Path, repeats: int = 60) -> Path:
    """A text file of TEXT repeated (a few thousand tokens)."""
    path.write_text(TEXT * repeats, encoding="utf-8")
    return path


def save_gguf(path: Path, with_tokenizer: bool = True) -> Path:
    """A tiny Llama written as a GGUF file (llama architecture, float32) with its byte-level
    BPE tokenizer, as llama.cpp's converter lays them out; returns the path."""
    import json

    import gguf

    model, bpe = llama(), tokenizer()
    c = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    if with_tokenizer:
        state = json.loads(bpe.backend_tokenizer.to_str())
        vocab = state["model"]["vocab"]
        tokens = sorted(vocab, key=vocab.__getitem__)
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens)
        writer.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
        merges = state["model"]["merges"]
        writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
        writer.add_bos_token_id(vocab["<|endoftext|>"])
        writer.add_eos_token_id(vocab["<|endoftext|>"])
    for name, tensor in _gguf_tensors(model).items():
        writer.add_tensor(name, tensor.detach().float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gguf_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The model's tensors under llama.cpp's names, query and key rows in its rotary order."""
    c = model.config

    def rotary(w: torch.Tensor, heads: int) -> torch.Tensor:
        return (
            w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape)
        )

    found = {
        "token_embd.weight": model.model.embed_tokens.weight,
        "output_norm.weight": model.model.norm.weight,
        "output.weight": model.lm_head.weight,
    }
    for i, layer in enumerate(model.model.layers):
        a, m = layer.self_attn, layer.mlp
        found |= {
            f"blk.{i}.attn_norm.weight": layer.input_layernorm.weight,
            f"blk.{i}.attn_q.weight": rotary(a.q_proj.weight, c.num_attention_heads),
            f"blk.{i}.attn_k.weight": rotary(a.k_proj.weight, c.num_key_value_heads),
            f"blk.{i}.attn_v.weight": a.v_proj.weight,
            f"blk.{i}.attn_output.weight": a.o_proj.weight,
            f"blk.{i}.ffn_norm.weight": layer.post_attention_layernorm.weight,
            f"blk.{i}.ffn_gate.weight": m.gate_proj.weight,
            f"blk.{i}.ffn_up.weight": m.up_proj.weight,
            f"blk.{i}.ffn_down.weight": m.down_proj.weight,
        }
    return found
