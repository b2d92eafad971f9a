"""Filters of the training pairs (`data.filters`), applied at preparation after cleaning.

The rules of OpusCleaner's default configuration that this corpus pair can use, each off
until asked for: a character-length ratio, numbers that differ between the sides, letters
outside the Latin script, language identification (`langid.py`), duplicates. They run in
that order, cheapest first, and a pair is counted under the first rule that drops it.
All but `dedup` look at one pair at a time and run in preparation's worker processes, a
chunk at a time (`chunk_filter`); `Dedup` remembers what it has seen, so it runs in the
main process, over the chunks in order. Dev and test sets are never filtered.
"""

from __future__ import annotations

import hashlib
import logging
import re
import unicodedata
from collections.abc import Sequence

import numpy as np

from transformer.config import DataConfig, FilterConfig
from transformer.data.corpus import DataError
from transformer.data.langid import language_id

log = logging.getLogger(__name__)

RULES = ("char_ratio", "numbers", "script", "langid", "dedup")  # in the order they run
# `dedup` remembers 8 bytes a pair (its hash) for at most this many pairs (800 MB); the
# pairs past it are compared with those only
MAX_DEDUP_PAIRS = 100_000_000

_DIGITS = re.compile(r"\d+")
# The Latin script's letters: those Unicode names LATIN (from A to the full-width Latin
# letters), ª and º (Latin by Unicode's Scripts.txt; their names do not say so) and µ
# (the micro sign, a letter of no script).
_LATIN = "ªºµ" + "".join(c for c in map(chr, range(0x80, 0x10000)) if "LATIN" in unicodedata.name(c, ""))
# A word character that is not a digit, _ or Latin: a letter (or a number such as ½ or ²,
# which `non_latin_share` leaves out: str.isalpha is the test of a letter)
_NON_LATIN = re.compile(f"[^\\W\\d_A-Za-z{_LATIN}]")


def check_filters(cfg: DataConfig) -> None:
    """Refuse, before any work, filters that cannot run: a language py3langid does not know."""
    if cfg.filters.langid is None:
        return
    known = language_id().languages
    for key, lang in (("data.src_lang", cfg.src_lang), ("data.tgt_lang", cfg.tgt_lang)):
        if lang not in known:
            raise DataError(f"data.filters.langid: {key}={lang!r} is not a language py3langid "
                            f"identifies ({', '.join(sorted(set(known)))})")


def char_ratio_ok(src: Sequence[str], tgt: Sequence[str], ratio: float) -> np.ndarray:
    """Pairs whose longer side has at most `ratio` times the characters of the shorter."""
    s = np.fromiter(map(len, src), np.int64, len(src))
    t = np.fromiter(map(len, tgt), np.int64, len(tgt))
    return np.maximum(s, t) <= ratio * np.maximum(1, np.minimum(s, t))


def numbers(text: str) -> set[str]:
    """The runs of digits in `text`, without leading zeros: `1.000,50` -> {1, 0, 50}."""
    return {run.lstrip("0") or "0" for run in _DIGITS.findall(text)}


def numbers_ok(src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
    """Pairs whose sides' numbers differ by no more numbers than they share (OpusCleaner's
    num_mismatch with ratio 1: (shared + 1) / (differing + 1) >= 1); a pair without digits passes."""
    keep = np.ones(len(src), dtype=bool)
    for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
        if _has_digit(s) or _has_digit(t):
            a, b = numbers(s), numbers(t)
            keep[i] = len(a & b) >= len(a ^ b)
    return keep


def _has_digit(text: str) -> bool:
    return _DIGITS.search(text) is not None


def non_latin_share(text: str) -> float:
    """The share of `text`'s letters that are not in the Latin script (0 without letters)."""
    if text.isascii() or _NON_LATIN.search(text) is None:  # the common case: one scan, no lists
        return 0.0
    non_latin = sum(c.isalpha() for c in _NON_LATIN.findall(text))
    return non_latin / sum(c.isalpha() for c in text) if non_latin else 0.0


def script_ok(src: Sequence[str], tgt: Sequence[str], share: float) -> np.ndarray:
    """Pairs with at most `share` of their letters outside the Latin script, on both sides."""
    return np.array([non_latin_share(s) <= share and non_latin_share(t) <= share
                     for s, t in zip(src, tgt, strict=True)], dtype=bool)


def langid_ok(src: Sequence[str], tgt: Sequence[str], langs: tuple[str, str], min_prob: float) -> np.ndarray:
    """Pairs each of whose sides is its language of `langs` (source, target) with
    probability `min_prob` or more. A side without any n-gram the model knows (digits,
    punctuation alone) passes: the model has nothing to say of it."""
    model = language_id()
    keep = np.ones(len(src), dtype=bool)
    for side, lang in zip((src, tgt), langs, strict=True):
        probs, featureless = model.probabilities(side)
        keep &= (probs[:, model.languages.index(lang)].numpy() >= min_prob) | featureless
    return keep


def chunk_filter(src: list[str], tgt: list[str], cfg: FilterConfig,
                 langs: tuple[str, str]) -> tuple[np.ndarray, dict[str, int]]:
    """The rows of a chunk's pairs that pass every rule but `dedup` (`RULES`' order; each
    rule looks only at the pairs the earlier ones kept), and how many each rule dropped."""
    rows = np.arange(len(src))
    counts: dict[str, int] = {}
    rules = {"char_ratio": (cfg.char_ratio is not None, lambda s, t: char_ratio_ok(s, t, cfg.char_ratio)),
             "numbers": (cfg.numbers, numbers_ok),
             "script": (cfg.script is not None, lambda s, t: script_ok(s, t, cfg.script)),
             "langid": (cfg.langid is not None, lambda s, t: langid_ok(s, t, langs, cfg.langid))}
    for rule, (on, passes) in rules.items():
        if not on:
            continue
        ok = passes([src[i] for i in rows], [tgt[i] for i in rows]) if len(rows) else np.ones(0, bool)
        counts[rule] = int(len(rows) - ok.sum())
        rows = rows[ok]
    return rows, counts


class Dedup:
    """Drops pairs seen before (`mode="pairs"`) or whose target was (`"target"`), over the
    chunks of a split in order. It keeps 8-byte hashes in sorted runs that merge as they grow
    (a log-structured set: memory 8 bytes a remembered pair, a chunk's check one binary
    search per run), at most MAX_DEDUP_PAIRS of them."""

    def __init__(self, mode: str, label: str) -> None:
        self.mode, self.label = mode, label
        self.runs: list[np.ndarray] = []
        self.remembered = 0
        self.full = False

    def keep(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """Which of a chunk's pairs are the first of their kind (bool per pair)."""
        hashes = self._hashes(src, tgt)
        unique, first = np.unique(hashes, return_index=True)
        fresh = np.ones(len(unique), dtype=bool)
        for run in self.runs:
            at = np.minimum(np.searchsorted(run, unique), len(run) - 1)
            fresh &= run[at] != unique
        keep = np.zeros(len(hashes), dtype=bool)
        keep[first[fresh]] = True
        self._remember(unique[fresh])
        return keep

    def _hashes(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        texts = tgt if self.mode == "target" else (f"{s}\t{t}" for s, t in zip(src, tgt, strict=True))
        digests = b"".join(hashlib.blake2b(x.encode("utf-8", "surrogatepass"), digest_size=8).digest()
                           for x in texts)
        return np.frombuffer(digests, dtype=np.uint64)

    def _remember(self, new: np.ndarray) -> None:
        room = MAX_DEDUP_PAIRS - self.remembered
        if len(new) > room and not self.full:
            self.full = True
            log.warning("%s: data.filters.dedup remembers at most %d pairs; later pairs are compared "
                        "with those only", self.label, MAX_DEDUP_PAIRS)
        new = new[:room]
        if not len(new):
            return
        self.remembered += len(new)
        self.runs.append(new)
        while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
            last = self.runs.pop()
            self.runs[-1] = np.union1d(self.runs[-1], last)
