"""transformer/data/perturb.py: each transform does what its name says and nothing else,
on every line of the sample corpus; typos are seeded and bounded; references follow the
source's case only."""

from __future__ import annotations

import pytest

from transformer.data import perturb
from transformer.data.corpus import read_lines
from transformer.paths import PROJECT_ROOT

SAMPLE = PROJECT_ROOT / "data" / "sample"
LINES = read_lines(SAMPLE / "train.it") + read_lines(SAMPLE / "train.en")


def test_upper_leaves_no_lower_case_letter_and_changes_nothing_else():
    for line in LINES:
        up = perturb.upper(line)
        assert not any(c.islower() for c in up)
        assert up.lower() == line.lower()


def test_title_upper_cases_the_first_letter_of_each_word_and_nothing_else():
    assert perturb.title("l'aria è blu, \"dice\" lui.") == "L'aria È Blu, \"Dice\" Lui."
    assert perturb.title("it's NASA's") == "It's NASA's"  # not str.title's "It'S Nasa'S"
    for line in LINES:
        titled = perturb.title(line)
        assert len(titled) == len(line) and titled.lower() == line.lower()
        for word, before in zip(titled.split(" "), line.split(" "), strict=True):
            letters = [i for i, c in enumerate(word) if c.isalpha()]
            if letters:
                first = letters[0]
                assert word[first] == before[first].upper() and word[first + 1:] == before[first + 1:]


def test_nopunct_removes_only_the_final_punctuation():
    assert perturb.nopunct("Vieni?") == "Vieni"
    assert perturb.nopunct("Aspetta... ") == "Aspetta"
    assert perturb.nopunct("Ciao !") == "Ciao"
    assert perturb.nopunct('Disse "sì".') == 'Disse "sì"'  # the quote stays
    assert perturb.nopunct("Sì, certo") == "Sì, certo"  # nothing final to drop
    assert perturb.nopunct("...") == "..."  # never an empty line
    changed = 0
    for line in LINES:
        out = perturb.nopunct(line)
        assert line.startswith(out) and out
        dropped = line[len(out):]
        assert all(c in perturb.FINAL_PUNCTUATION or c.isspace() for c in dropped)
        assert not out.endswith(tuple(perturb.FINAL_PUNCTUATION))
        changed += out != line
    assert changed > len(LINES) // 2  # most sample lines end with punctuation


def test_typos_are_seeded_bounded_and_change_only_letters_near_where_they_were():
    changed = 0
    for k, line in enumerate(LINES):
        out = perturb.typos(line, k)
        assert out == perturb.typos(line, k)  # the same seed, the same typos
        n = perturb.typo_count(line)
        assert abs(len(out) - len(line)) <= n and out
        # only letters move: every other character keeps its order and count
        assert [c for c in out if not c.isalpha()] == [c for c in line if not c.isalpha()]
        changed += out != line
    assert changed == len(LINES)  # every line has a letter, and a typo changes it
    assert len({perturb.typos(LINES[0], seed) for seed in range(20)}) > 5  # seeds differ


def test_typos_leave_a_line_without_letters_alone():
    assert perturb.typos("123 ... 45", 0) == "123 ... 45"


def test_merge_joins_two_pairs_with_a_space():
    assert perturb.merge(("Ciao.", "Hi."), ("Vieni?", "Coming?")) == ("Ciao. Vieni?", "Hi. Coming?")


@pytest.mark.parametrize("name", perturb.PERTURBATIONS)
def test_references_follow_the_case_of_the_source_and_nothing_else(name):
    for k, line in enumerate(LINES):
        src, ref = perturb.source(name, line, k), perturb.reference(name, line)
        if name in ("upper", "title"):
            assert src == ref == getattr(perturb, name)(line)
        else:
            assert ref == line and src == getattr(perturb, name)(*((line, k) if name == "typos" else (line,)))


def test_a_test_sets_typos_are_drawn_per_line_whatever_lines_are_scored():
    src, refs = LINES[:30], LINES[30:60]
    full_src, full_refs = perturb.test_set("typos", src, refs, seed=3)
    first_src, _ = perturb.test_set("typos", src[:10], refs[:10], seed=3)
    assert first_src == full_src[:10] and full_refs == refs
    assert perturb.test_set("typos", src, refs, seed=4)[0] != full_src
    assert perturb.test_set("upper", src, refs)[1] == [r.upper() for r in refs]
    assert perturb.tag("typos", 3) == "typos-seed3" and perturb.tag("title") == "title"
