"""Tiny Llama models with a tokenizer, as a Hugging Face folder or a GGUF file, for tests of the
GGUF export and of commands that start from a GGUF file.

``tiny_tokenizer(folder)`` trains a small byte-level BPE (SmolLM2's split: single digits, then
byte level) with ChatML special tokens and saves it as a Hugging Face tokenizer;
``tiny_llama(vocab)`` builds a random LlamaForCausalLM; ``tiny_llama_gguf(path)`` writes both as
one GGUF file (F32, architecture ``llama``), which ``AutoModelForCausalLM.from_pretrained(
path.parent, gguf_file=path.name)`` and ``AutoTokenizer`` (same arguments) load.
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
