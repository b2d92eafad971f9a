"""The name-copy rate: how many of the names a reference copied from its source the
hypothesis copies too.

A *name* of a sentence pair is a word of the Italian source that

- starts with an uppercase letter (`Luke`, `Ehud`, `Àlex`, `ONU`),
- is not the first word of the sentence, nor the first after `.`, `!`, `?` or `…` inside
  it (there a capital says nothing: `Mi chiamo Luke. Piacere.` has no name `Piacere`),
- and occurs verbatim in the reference: same case, whole word (`Luke` in `I'm Luke.` and
  in `Luke's`, not in `Lukewarm`): the reference copied it, so a translation should too.

A word is a whitespace-separated token with its surrounding punctuation stripped
(`(Roma),` -> `Roma`) and, for Italian elided articles and prepositions, only what follows
the last apostrophe (`dell'Europa` -> `Europa`, `l’ONU` -> `ONU`). Short all-caps words
(`UE`, `ONU`, `II`) need no rule of their own: the reference test already keeps only
those the reference copied (`UE` becomes `EU` and is no name; `II` in `Giovanni Paolo II`
is one).

Each distinct name counts once per sentence pair; it is copied when the hypothesis holds
it verbatim as a whole word. The rate is copied / names, None when there are no names.
A name the rules miss (one that starts a sentence, one after an initial's full stop as
in `Jan O. Karlsson`) is left out; what they let in, the reference vouches for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SIGNATURE = "src:capitalised,not-sentence-initial|ref:verbatim|hyp:verbatim|unit:name-per-sentence"
_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$")
_APOSTROPHES = re.compile(r"['’]")
_SENTENCE_END = re.compile(r"[.!?…][\W_]*$")  # `Luke.` `fine!»` `davvero?)`


@dataclass(frozen=True)
class NameCopy:
    names: int  # names found (distinct per sentence pair, summed)
    copied: int  # of them, how many the hypothesis holds
    sentences: int  # sentence pairs with at least one name

    @property
    def rate(self) -> float | None:
        """copied / names; None when no name was found (never a division by zero)."""
        return self.copied / self.names if self.names else None

    def __str__(self) -> str:
        if self.rate is None:
            return "names n/a (0/0)"
        return f"names {100 * self.rate:.1f}% ({self.copied}/{self.names})"

    def verbose(self) -> str:
        """The long form, in the style of sacrebleu's `BLEU = ...` lines (mt-evaluate's report)."""
        if self.rate is None:
            return "names = n/a (the references copy no name)"
        return f"names = {100 * self.rate:.2f} ({self.copied}/{self.names} copied, {self.sentences} sentences)"


def contains_word(text: str, word: str) -> bool:
    """`word` occurs in `text` verbatim and as a whole word (no letter, digit or `_` beside it)."""
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


def _word(token: str) -> str:
    """A token's word: surrounding punctuation stripped, elision before an apostrophe dropped."""
    return _EDGE_PUNCT.sub("", _APOSTROPHES.split(_EDGE_PUNCT.sub("", token))[-1])


def find_names(source: str, reference: str) -> list[str]:
    """The names of one sentence pair (see the module docstring), in source order, each once."""
    names: list[str] = []
    starts_sentence = True
    for token in source.split():
        word = _word(token)
        capitalised = bool(word) and not starts_sentence and word[0].isupper()
        if capitalised and word not in names and contains_word(reference, word):
            names.append(word)
        if word:  # a token of punctuation alone (`-`, `«`) is no first word
            starts_sentence = False
        if _SENTENCE_END.search(token):
            starts_sentence = True
    return names


def name_copy(sources: list[str], hypotheses: list[str], references: list[str]) -> NameCopy:
    """Count the names of each (source, reference) pair and how many its hypothesis copied."""
    if not len(sources) == len(hypotheses) == len(references):
        raise ValueError(f"name_copy: {len(sources)} sources, {len(hypotheses)} hypotheses and "
                         f"{len(references)} references: they must be line-aligned")
    names = copied = sentences = 0
    for src, hyp, ref in zip(sources, hypotheses, references):
        found = find_names(src, ref)
        names += len(found)
        copied += sum(contains_word(hyp, name) for name in found)
        sentences += bool(found)
    return NameCopy(names=names, copied=copied, sentences=sentences)
