"""Sentence splitting: a user's line as the sentences the model was trained on.

The models learn from single sentences (Tatoeba; Europarl as the Moses sentence splitter
cut it), so a paragraph fed whole comes out short: the model stops after a sentence or
blends them. `segment` cuts every line into sentences with the Moses splitter
(`sentence-splitter`, the Python port of Koehn and Schroeder's `split-sentences.perl`)
and its Italian non-breaking prefixes, plus the Italian abbreviations below that the Moses
list lacks (why Moses: docs/decoding.md, "Documents: sentence splitting";
scripts/studies/compare_splitters.py measures the candidates). The decoder translates all
sentences of all lines together; `Segments.rejoin` puts each line back together, so every
input line still gives exactly one output line.

A sentence longer than the model's positional table is cut, never silently truncated:
at clause boundaries (after `,` `;` `:`) into the fewest pieces that fit, and a clause
that alone is too long at word boundaries. Only a single word longer than the limit
(hundreds of pieces) loses its end, with a warning.

    segs = segment(lines, tokenizer, max_len=512)        # split=False: one unit per line
    texts = translate(segs.ids)                          # one text per unit
    out = segs.rejoin(texts, join_texts)                 # one text per input line

`encode_sources` encodes lines whole, neither split nor cut into pieces but truncated
with a warning: what the attention plots, the mask inspector and the benchmarks feed.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import sentence_splitter

from transformer.data.corpus import normalize
from transformer.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

LANGUAGE = "it"
# Italian abbreviations missing from the Moses list, found by scripts/studies/compare_splitters.py's
# cases and by reading Europarl: titles and common short forms never end a sentence.
EXTRA_PREFIXES = (
    "sig", "sigg", "sig.ra", "Sig.ra", "sig.na", "Sig.na", "dott", "dott.ssa", "Dott.ssa",
    "prof", "prof.ssa", "Prof.ssa", "avv", "Avv", "ing", "arch", "geom", "rag", "On", "Sen",
    "sen", "Mons", "mons", "cfr", "Cfr", "ca", "cit", "vol", "voll",
)
# Abbreviations that do not end a sentence when a number follows (Moses's #NUMERIC_ONLY#):
# "art. 3", "pag. 12", "12 dic. 2000" split nowhere; "Legge l'art. Poi esce." splits.
NUMERIC_ONLY = (
    "art", "Art", "artt", "Artt", "par", "cap", "Cap", "pag", "pagg", "nn", "nr", "num", "tab",
    "gen", "feb", "mar", "apr", "mag", "giu", "lug", "ago", "set", "ott", "nov", "dic",
    *("no", "No"),  # Moses's English "number", kept in its Italian list: "Io no." ends a sentence
)
NUMERIC = "#NUMERIC_ONLY#"
WORDS = ("no", "No")  # numeric-only prefixes that are common words: the Argos package splits after them
# Clause boundaries for cutting a sentence too long for the model: after , ; : and before
# a dash between spaces.
CLAUSE = re.compile(r"(?<=[,;:])\s+|\s+(?=[–—-]\s)")

X = TypeVar("X")


def prefixes() -> list[str]:
    """Every non-breaking prefix the splitter uses, with " #NUMERIC_ONLY#" where it has one
    (the Moses file format): the library's Italian list, less the words NUMERIC_ONLY makes
    numeric-only, then EXTRA_PREFIXES and NUMERIC_ONLY. The Argos package's spaCy
    tokenizer gets the same list (argos.py)."""
    path = os.path.join(os.path.dirname(sentence_splitter.__file__), "non_breaking_prefixes",
                        f"{LANGUAGE}.txt")
    own: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            word = line.split("#")[0].strip()
            if word and word not in NUMERIC_ONLY:
                own.append(line.strip() if NUMERIC in line else word)
    words = {line.split("#")[0].strip() for line in own}
    return [*own, *(p for p in EXTRA_PREFIXES if p not in words),
            *(f"{p} {NUMERIC}" for p in NUMERIC_ONLY)]


@functools.cache
def _splitter() -> sentence_splitter.SentenceSplitter:
    # The library reads its prefixes from a file only: write ours to one, once.
    with tempfile.TemporaryDirectory(prefix="mt-prefixes-") as tmp:
        path = os.path.join(tmp, f"{LANGUAGE}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(f"{p}\n" for p in prefixes()))
        return sentence_splitter.SentenceSplitter(language=LANGUAGE, non_breaking_prefix_file=path)


def split_sentences(text: str) -> list[str]:
    """The sentences of one line of text (normalised first); [] for an empty line."""
    text = normalize(text)
    return [s for s in _splitter().split(text) if s] if text else []


def join_texts(texts: Sequence[str]) -> str:
    """Translated sentences back into one line: joined by single spaces, empty ones left out."""
    return " ".join(t for t in texts if t)


@dataclass
class Segments:
    """The units a batch of lines is translated in, and which line each belongs to.

    ids[k]: the source ids of unit k (a sentence, or a piece of a long one), no BOS/EOS;
    owner[k]: the index of its input line. Units of a line are in reading order.
    """

    n_lines: int
    ids: list[list[int]] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)
    sentences: int = 0  # sentences found (a line not split counts as one)
    cut: list[int] = field(default_factory=list)  # lines with a sentence too long, cut in pieces
    truncated: list[int] = field(default_factory=list)  # lines with a word longer than the limit

    def extend(self, more: Segments) -> None:
        """Append the units of `more`, whose lines follow this one's."""
        shift = self.n_lines
        self.n_lines += more.n_lines
        self.ids.extend(more.ids)
        self.owner.extend(line + shift for line in more.owner)
        self.sentences += more.sentences
        self.cut.extend(line + shift for line in more.cut)
        self.truncated.extend(line + shift for line in more.truncated)

    def rejoin(self, per_unit: Sequence[X], join: Callable[[list[X]], X], empty: X) -> list[X]:
        """One value per input line: `join` of its units' values, `empty` for a line with none."""
        parts: list[list[X]] = [[] for _ in range(self.n_lines)]
        for line, value in zip(self.owner, per_unit, strict=True):
            parts[line].append(value)
        return [join(p) if p else empty for p in parts]


def segment(lines: Sequence[str], tokenizer, max_len: int, split: bool = True) -> Segments:
    """Normalise, split into sentences (if `split`), encode, and cut every unit to at most
    `max_len` ids (`fit`). An empty line gives no unit."""
    segs = Segments(n_lines=len(lines))
    texts: list[str] = []
    for i, line in enumerate(lines):
        found = split_sentences(line) if split else [t for t in [normalize(line)] if t]
        texts.extend(found)
        segs.owner.extend([i] * len(found))
    segs.sentences = len(texts)
    owners, segs.owner = segs.owner, []
    for line, text, ids in zip(owners, texts, tokenizer.encode(texts), strict=True):
        pieces, truncated = [ids], False
        if len(ids) > max_len:
            pieces, truncated = fit(text, tokenizer, max_len)
            _note(segs.cut, line)
        if truncated:
            _note(segs.truncated, line)
        segs.ids.extend(pieces)
        segs.owner.extend([line] * len(pieces))
    return segs


def _note(lines: list[int], line: int) -> None:
    if not lines or lines[-1] != line:
        lines.append(line)


def fit(text: str, tokenizer, max_len: int) -> tuple[list[list[int]], bool]:
    """`text` as the fewest consecutive pieces of at most `max_len` ids, cut at clause
    boundaries, or at spaces inside a clause that alone is too long; and whether a single
    word had to lose its end. Pieces are packed by the sum of their parts' lengths, and
    checked after encoding."""
    pieces: list[list[int]] = []
    truncated = False
    for clause_group in _pack(CLAUSE.split(text), tokenizer, max_len):
        ids = tokenizer.encode([clause_group])[0]
        if len(ids) <= max_len:
            pieces.append(ids)
            continue
        for word_group in _pack(clause_group.split(" "), tokenizer, max_len):
            ids = tokenizer.encode([word_group])[0]
            truncated |= len(ids) > max_len
            pieces.append(ids[:max_len])
    return pieces, truncated


def _pack(parts: list[str], tokenizer, max_len: int) -> list[str]:
    """Consecutive `parts` joined by spaces into groups whose lengths in ids sum to at most
    `max_len` (a part longer than that makes a group of its own)."""
    parts = [p for p in parts if p]
    groups: list[str] = []
    current: list[str] = []
    size = 0
    for part, n in zip(parts, map(len, tokenizer.encode(parts)), strict=True):
        if current and size + n > max_len:
            groups.append(" ".join(current))
            current, size = [], 0
        current.append(part)
        size += n
    if current:
        groups.append(" ".join(current))
    return groups


def encode_sources(tokenizer: Tokenizer, lines: list[str], max_len: int) -> list[list[int]]:
    """Normalise as the training data was, encode, and cut to `max_len` (the model's
    max_positions)

    The ids are what `batching.collate` puts on the source side: no BOS, no EOS.
    """
    ids = tokenizer.encode([normalize(line) for line in lines])
    too_long = [i for i, seq in enumerate(ids) if len(seq) > max_len]
    if too_long:
        shown = ", ".join(str(i + 1) for i in too_long[:10]) + (", ..." if len(too_long) > 10 else "")
        log.warning("%d input line(s) longer than the model's limit of %d tokens were "
                    "truncated (line %s)", len(too_long), max_len, shown)
    return [seq[:max_len] for seq in ids]
