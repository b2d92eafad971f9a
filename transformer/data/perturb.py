"""Text as people type it: upper case, title case, no final punctuation, typos, merged lines.

One module for both of its uses, so a model is tested with exactly the transforms it may
have been trained with: training's augmentation (`augment.py`, `data.augment`, after
OpusTrainer's modifiers) changes training pairs with them, and `mt-evaluate perturb=NAME`
changes a test set's sources with them (`source`) and its references to match
(`reference`). Every function takes and returns one normalised line; none returns an
empty line for a non-empty one.
"""

from __future__ import annotations

import random

PERTURBATIONS = ("upper", "title", "nopunct", "typos")  # what mt-evaluate's perturb= may name
FINAL_PUNCTUATION = ".!?…;:,"  # what `nopunct` drops from the end of a line
TYPO_EVERY = 40  # characters per typo (at least one a line)


def upper(text: str) -> str:
    """Every letter upper-cased ("Un pallone." -> "UN PALLONE.")."""
    return text.upper()


def title(text: str) -> str:
    """The first letter of each space-separated word upper-cased, the rest left as it is
    ("l'aria è blu" -> "L'aria È Blu"). Not `str.title`, which also upper-cases the letter
    after an apostrophe ("It'S") and lower-cases the rest of the word ("Nasa" for "NASA")."""
    return " ".join(_capitalised(word) for word in text.split(" "))


def _capitalised(word: str) -> str:
    for i, c in enumerate(word):
        if c.isalpha():
            return word[:i] + c.upper() + word[i + 1 :]
    return word


def nopunct(text: str) -> str:
    """The line without its final punctuation (`FINAL_PUNCTUATION`, and the spaces before
    it): "Vieni?" -> "Vieni", "Aspetta..." -> "Aspetta". Quotes and brackets stay, as does
    a line that is nothing but punctuation."""
    kept = text.rstrip().rstrip(FINAL_PUNCTUATION).rstrip()
    return kept if kept else text


def typo_count(text: str) -> int:
    """How many typos `typos` makes in `text`: one per `TYPO_EVERY` characters, at least one."""
    return 1 + len(text) // TYPO_EVERY


def typos(text: str, seed: int | str) -> str:
    """`typo_count(text)` typos at letters drawn by `seed`: a letter swapped with the letter
    after it, dropped, or repeated (a swap of two equal letters, or a drop of a line's only
    letter, repeats it instead). Each typo changes the length by at most one character."""
    rng = random.Random(seed)
    chars = list(text)
    for _ in range(typo_count(text)):
        letters = [i for i, c in enumerate(chars) if c.isalpha()]
        if not letters:
            break
        i = rng.choice(letters)
        kind = rng.randrange(3)
        if kind == 0 and i + 1 < len(chars) and chars[i + 1].isalpha() and chars[i + 1] != chars[i]:
            chars[i], chars[i + 1] = chars[i + 1], chars[i]
        elif kind == 1 and len(letters) > 1:
            del chars[i]
        else:
            chars.insert(i, chars[i])
    return "".join(chars)


def merge(first: tuple[str, str], second: tuple[str, str]) -> tuple[str, str]:
    """Two pairs joined into one, each side with a space (OpusTrainer's merged lines)."""
    return f"{first[0]} {second[0]}", f"{first[1]} {second[1]}"


def source(name: str, text: str, seed: int | str = 0) -> str:
    """A source line perturbed by `name` (one of `PERTURBATIONS`); `seed` draws the typos."""
    if name == "typos":
        return typos(text, seed)
    return {"upper": upper, "title": title, "nopunct": nopunct}[name](text)


def reference(name: str, text: str) -> str:
    """A test set's reference matched to a source perturbed by `name`: upper- or
    title-cased like it; dropped punctuation and typos leave it as it is, the translation
    a user still wants."""
    return {"upper": upper, "title": title}.get(name, lambda t: t)(text)


def test_set(name: str, src: list[str], refs: list[str], seed: int = 1) -> tuple[list[str], list[str]]:
    """A test set's sources perturbed by `name` and its references matched (`source`,
    `reference`); line i's typos are drawn from (`seed`, i), whatever lines are scored."""
    return [source(name, s, f"{seed}:{i}") for i, s in enumerate(src)], [reference(name, r) for r in refs]


def tag(name: str, seed: int = 1) -> str:
    """A perturbation as it appears in file names: its name, and the seed of typos (`typos-seed1`)."""
    return f"typos-seed{seed}" if name == "typos" else name
