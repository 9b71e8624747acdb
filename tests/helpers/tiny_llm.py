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


def llama(vocab: int = 300, layers: int = 2, seed: int = 0, tied: bool = False) -> Any:
    """A tiny LlamaForCausalLM (hidden 32, 4 query heads in 2 key/value groups, MLP 64)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def sharded_folder(folder: Path, vocab: int = 300, layers: int = 2, tied: bool = False) -> Path:
    """The tiny Llama of `llama(vocab, layers, tied=tied)` saved in `folder` as shards of
    about 20 kB (about one matrix each, so more shards than blocks), without a tokenizer;
    returns the folder."""
    llama(vocab, layers, tied=tied).save_pretrained(str(folder), max_shard_size="20KB")
    assert len(list(folder.glob("*.safetensors"))) > layers  # sharded across the blocks
    return folder


def save_folder(folder: Path, sharded: bool = False, with_tokenizer: bool = True) -> Path:
    """A tiny Llama saved in `folder` (in shards of about 20 kB when `sharded`), with its
    tokenizer; returns the folder."""
    if sharded:
        sharded_folder(folder)
    else:
        llama().save_pretrained(str(folder), max_shard_size="1GB")
    if with_tokenizer:
        tokenizer().save_pretrained(str(folder))
    return folder


def text_file(path: Path, repeats: int = 60) -> Path:
    """A text file of TEXT repeated (a few thousand tokens)."""
    path.write_text(TEXT * repeats, encoding="utf-8")
    return path


def folder_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files of `folder`, by name."""
    from safetensors import safe_open

    found = {}
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), "pt") as opened:
            found.update({name: opened.get_tensor(name) for name in opened.keys()})  # noqa: SIM118
    return found
