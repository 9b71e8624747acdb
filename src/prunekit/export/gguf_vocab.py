"""The tokenizer a GGUF file carries, read from the model's source before anything is written.

Two sources: a GGUF file, whose ``tokenizer.*`` fields (tokens, types, scores, merges, the
pre-tokenizer name, special ids, the chat template) are copied as they are, or a Hugging
Face folder:

- a GPT-2-style byte-level BPE (``tokenizer.json`` with a ``ByteLevel`` decoder) becomes
  ``tokenizer.ggml.model = "gpt2"``: every token with its type (special added tokens are
  control tokens, other added tokens user-defined), the merges, the special ids, whether to
  add BOS/EOS and the chat template (the last three read by ``gguf.SpecialVocab``). llama.cpp
  splits text before BPE by a pre-tokenizer it knows by name (``tokenizer.ggml.pre``). Its
  converter names it by hashing the token ids the tokenizer gives for a fixed text; the same
  hash is computed here for the vocabularies of the families written, and otherwise the
  ``tokenizers`` pre-tokenizer is matched against the two llama.cpp splits it can be told from
  (``gpt-2``: byte-level alone; ``smollm``: single digits, then byte-level). Any other
  is refused: a wrong name would split text differently in llama.cpp, silently.
- a SentencePiece-style BPE with byte fallback (Llama 2, Mistral) becomes
  ``tokenizer.ggml.model = "llama"`` through ``gguf.vocab.LlamaHfVocab``.

Token ids beyond the tokenizer up to the embedding's rows are padded as unused tokens, as
llama.cpp needs one token a row.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf as gg

from prunekit.core.errors import value_error
from prunekit.export import gguf_reading

__all__ = ["CHECK_TEXT", "PRE_TOKENIZERS", "Vocab", "read_vocab"]

# the text llama.cpp's converter tokenizes, and hashes the ids of, to name a pre-tokenizer
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636"
    "\u200d\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 \U0001f999"
    "\U0001f999 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 \u1780"
    "\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785"
    "\U0001f601 ?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======="
    " \u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440"
    "\u0441\u043a\u0438 ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told h"
    "e's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We"
    "'Ve a'lL"
)
# sha256 of str(ids of CHECK_TEXT) -> llama.cpp's pre-tokenizer name, for the vocabularies of
# the families written (SmolLM/SmolLM2, Llama 3, Qwen2, GPT-2)
PRE_TOKENIZERS = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
}
_V = gg.GGUFValueType
# one key-value pair: key, value, its type, the type of its elements (arrays)
Field = tuple[str, Any, gg.GGUFValueType, gg.GGUFValueType | None]
_UNUSED = int(gg.TokenType.UNUSED)


@dataclass
class Vocab:
    """The tokenizer fields to write: (key, value, type, element type) each, in order.

    Attributes:
        fields: the ``tokenizer.*`` key-value pairs.
        special: the special ids, merges and chat template of a Hugging Face folder, written
            by ``gguf.SpecialVocab`` (None for a GGUF source).
        source: where they came from, for the report.
    """

    fields: list[Field]
    special: gg.SpecialVocab | None = None
    source: str = ""
    pre: str | None = field(default=None)

    def add_to(self, writer: gg.GGUFWriter) -> None:
        """Write the fields into `writer` (before its header is written)."""
        for key, value, vtype, sub in self.fields:
            writer.add_key_value(key, value, vtype, sub)
        if self.special is not None:
            self.special.add_to_gguf(writer, quiet=True)


def read_vocab(source: Path | None, rows: int) -> Vocab:
    """The tokenizer of `source`, padded to `rows` tokens.

    Args:
        source: a GGUF file or a Hugging Face folder.
        rows: the rows of the model's token embedding.

    Returns:
        The fields to write.

    Raises:
        ValueError: no source, one without a tokenizer it can write, or one with more tokens
            than the embedding has rows.
    """
    if source is None:
        raise value_error(
            "export: source=None; format='gguf' needs the tokenizer (a GGUF file without one "
            "does not run): expected the Hugging Face folder or GGUF file the model came from"
        )
    if source.is_file():
        return _from_gguf(source, rows)
    if source.is_dir():
        return _from_folder(source, rows)
    raise value_error(f"export: source={str(source)!r} does not exist; expected the Hugging "
                      f"Face folder or GGUF file the model came from")  # fmt: skip


def _from_gguf(path: Path, rows: int) -> Vocab:
    try:
        reader = gguf_reading.reader(path)
    except (ValueError, OSError) as error:
        raise value_error(f"export: source={str(path)!r} is not a GGUF file ({error}); "
                          f"expected a GGUF file or a Hugging Face folder") from None  # fmt: skip
    fields: list[Field] = []
    for key, found in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        if found.types[0] == _V.ARRAY:
            sub = found.types[-1]
            items = [bytes(found.parts[i]) if sub == _V.STRING else found.parts[i][0].item()
                     for i in found.data]  # fmt: skip
            fields.append((key, items, _V.ARRAY, sub))
        elif found.types[0] == _V.STRING:
            fields.append((key, bytes(found.parts[found.data[0]]), _V.STRING, None))
        else:
            fields.append((key, found.parts[found.data[0]][0].item(), found.types[0], None))
    names = {key for key, *_ in fields}
    if {"tokenizer.ggml.model", "tokenizer.ggml.tokens"} - names:
        raise value_error(f"export: source={str(path)!r} is a GGUF file without a tokenizer "
                          f"(tokenizer.ggml.model, tokenizer.ggml.tokens); expected one with "
                          f"it, or the Hugging Face folder")  # fmt: skip
    return Vocab(_pad(fields, rows, path), None, str(path))


def _pad(fields: list[Field], rows: int, source: Path) -> list[Field]:
    """Pad the per-token arrays to `rows` with unused tokens; refuse more tokens than rows."""
    lists = {key: value for key, value, *_ in fields}
    count = len(lists["tokenizer.ggml.tokens"])
    if count > rows:
        raise value_error(f"export: source={str(source)!r} has {count} tokens and the "
                          f"model's embedding {rows} rows; expected at most one token a "
                          f"row (is it the model's own tokenizer?)")  # fmt: skip
    extra: dict[str, list[Any]] = {
        "tokenizer.ggml.tokens": [f"[PAD{i}]".encode() for i in range(count, rows)],
        "tokenizer.ggml.token_type": [_UNUSED] * (rows - count),
        "tokenizer.ggml.scores": [-1000.0] * (rows - count),
    }
    return [(key, [*value, *extra[key]] if key in extra else value, vtype, sub)
            for key, value, vtype, sub in fields]  # fmt: skip


def _from_folder(folder: Path, rows: int) -> Vocab:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise value_error(f"export: source={str(folder)!r} has no tokenizer.json; expected a "
                          f"Hugging Face folder with one, or a GGUF file")  # fmt: skip
    spec = json.loads(path.read_text(encoding="utf-8"))
    model, decoder = spec.get("model") or {}, (spec.get("decoder") or {}).get("type")
    if model.get("type") == "BPE" and not model.get("byte_fallback") and decoder == "ByteLevel":
        return _byte_level(folder, spec, rows)
    if model.get("type") == "BPE" and model.get("byte_fallback"):
        return _sentencepiece(folder, rows)
    raise value_error(
        f"export: source={str(folder)!r} has a {model.get('type')!r} tokenizer with decoder "
        f"{decoder!r}; expected a byte-level BPE (GPT-2 style) or a BPE with byte fallback "
        f"(Llama/Mistral SentencePiece style), or a GGUF file to copy the tokenizer from"
    )


def _byte_level(folder: Path, spec: dict[str, Any], rows: int) -> Vocab:
    ids: dict[int, tuple[str, int]] = {i: (t, int(gg.TokenType.NORMAL))
                                       for t, i in spec["model"]["vocab"].items()}  # fmt: skip
    for added in spec.get("added_tokens") or ():
        kind = gg.TokenType.CONTROL if added.get("special") else gg.TokenType.USER_DEFINED
        ids[int(added["id"])] = (added["content"], int(kind))
    if max(ids) >= rows:
        raise value_error(f"export: source={str(folder)!r} has token id {max(ids)} and the "
                          f"model's embedding {rows} rows; expected the model's own "
                          f"tokenizer")  # fmt: skip
    tokens = [ids[i][0] if i in ids else f"[PAD{i}]" for i in range(rows)]
    types = [ids[i][1] if i in ids else _UNUSED for i in range(rows)]
    pre = _pre_tokenizer(folder, spec)
    fields: list[Field] = [
        ("tokenizer.ggml.model", "gpt2", _V.STRING, None),
        ("tokenizer.ggml.pre", pre, _V.STRING, None),
        ("tokenizer.ggml.tokens", tokens, _V.ARRAY, _V.STRING),
        ("tokenizer.ggml.token_type", types, _V.ARRAY, _V.INT32),
    ]
    fields += _space_prefix(folder)
    special = gg.SpecialVocab(folder, load_merges=True, n_vocab=rows)
    if not special.merges:
        raise value_error(f"export: source={str(folder)!r} has a byte-level BPE without "
                          f"merges; expected its tokenizer.json's model.merges")  # fmt: skip
    return Vocab(fields, special, str(folder), pre)


def _pre_tokenizer(folder: Path, spec: dict[str, Any]) -> str:
    """llama.cpp's name for how this tokenizer splits text before BPE (see the docstring)."""
    # optional dependency, imported where used (transformers is not needed by prunekit)
    from transformers import AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    ids = tokenizer.encode(CHECK_TEXT)
    found = PRE_TOKENIZERS.get(hashlib.sha256(str(ids).encode()).hexdigest())
    if found is not None:
        return found
    shape = _shape(spec.get("pre_tokenizer") or {})
    if shape == ["ByteLevel"]:
        return "gpt-2"
    if shape == ["Digits", "ByteLevel"]:
        return "smollm"
    raise value_error(
        f"export: source={str(folder)!r} has a byte-level BPE whose pre-tokenizer llama.cpp "
        f"does not name for the families written ({' + '.join(shape) or 'none'}); expected "
        f"the tokenizer of SmolLM, Llama 3, Qwen2 or GPT-2, or a GGUF file to copy the "
        f"tokenizer from"
    )


def _shape(pre: dict[str, Any]) -> list[str]:
    """The pre-tokenizer's steps, where they match a split llama.cpp knows ([] if not)."""
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    out = []
    for step in steps:
        kind = step.get("type")
        plain = step.get("use_regex", True) and not step.get("add_prefix_space")
        if not (
            (kind == "ByteLevel" and plain) or (kind == "Digits" and step.get("individual_digits"))
        ):
            return []
        out.append(kind)
    return out


def _space_prefix(folder: Path) -> list[Field]:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    prefix = config.get("add_prefix_space")
    return (
        [] if prefix is None else [("tokenizer.ggml.add_space_prefix", bool(prefix), _V.BOOL, None)]
    )


def _sentencepiece(folder: Path, rows: int) -> Vocab:
    vocab = gg.vocab.LlamaHfVocab(folder)
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text)
        scores.append(float(score))
        types.append(int(kind))
    fields: list[Field] = [
        ("tokenizer.ggml.model", "llama", _V.STRING, None),
        ("tokenizer.ggml.pre", "default", _V.STRING, None),
        ("tokenizer.ggml.tokens", tokens, _V.ARRAY, _V.STRING),
        ("tokenizer.ggml.scores", scores, _V.ARRAY, _V.FLOAT32),
        ("tokenizer.ggml.token_type", types, _V.ARRAY, _V.INT32),
    ]
    special = gg.SpecialVocab(folder, n_vocab=rows)
    return Vocab(_pad(fields, rows, folder), special, str(folder), "default")
