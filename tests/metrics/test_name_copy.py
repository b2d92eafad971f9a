"""The name-copy rate: which words are names, and when a hypothesis copied one."""

from __future__ import annotations

import pytest

from transformer.data.corpus import read_lines
from transformer.metrics.name_copy import NameCopy, contains_word, find_names, name_copy
from transformer.paths import PROJECT_ROOT

SAMPLE = PROJECT_ROOT / "data" / "sample"
LUKE_SRC, LUKE_REF = "Mi chiamo Luke.", "My name is Luke."


def test_a_copied_name_counts_and_a_dropped_one_does_not():
    assert find_names(LUKE_SRC, LUKE_REF) == ["Luke"]
    assert name_copy([LUKE_SRC], ["I'm Luke."], [LUKE_REF]) == NameCopy(names=1, copied=1, sentences=1)
    dropped = name_copy([LUKE_SRC], ["Let's wake me up."], [LUKE_REF])
    assert dropped == NameCopy(names=1, copied=0, sentences=1) and dropped.rate == 0.0


def test_a_sentence_initial_capital_is_no_name():
    assert find_names("Luke dorme.", "Luke is sleeping.") == []
    # nor the first word after a sentence ends inside the line, nor after leading punctuation
    assert find_names("Ciao. Luke dorme!", "Hi. Luke is sleeping!") == []
    assert find_names("Dorme? Sì. Luke dorme.", "Is he asleep? Yes. Luke is.") == []
    assert find_names('- "Luke dorme", disse Anna.', '- "Luke is sleeping," said Anna.') == ["Anna"]


def test_a_name_the_reference_did_not_copy_is_not_counted():
    assert find_names("Vive a Firenze con Luke.", "She lives in Florence with Luke.") == ["Luke"]
    assert name_copy(["Vive a Firenze."], ["She lives in Firenze."], ["She lives in Florence."]) \
        == NameCopy(names=0, copied=0, sentences=0)
    assert find_names("Lo ha detto l'UE.", "The EU said so.") == []  # a short acronym, translated


def test_case_and_word_boundaries_matter():
    assert find_names("Parlo con Luke.", "I talk to LUKE.") == []
    assert find_names("Parlo con Luke.", "The tea is Lukewarm.") == []
    assert find_names("È la borsa di Luke.", "It is Luke's bag.") == ["Luke"]  # possessive: a boundary
    assert name_copy([LUKE_SRC], ["My name is luke."], [LUKE_REF]).copied == 0
    assert name_copy([LUKE_SRC], ["My name is Lukas."], [LUKE_REF]).copied == 0
    assert contains_word("A U-turn.", "U") and not contains_word("Uturn", "U")


def test_punctuation_apostrophes_and_accents():
    assert find_names("Il futuro dell'Europa (e dell’ONU).", "Europe's future (and the ONU's).") == ["ONU"]
    assert find_names("Parla di «Roma», non di Milano!", 'It is about "Roma", not Milano!') \
        == ["Roma", "Milano"]
    assert find_names("Ho visto Ángel e Jørgen Mohr.", "I saw Ángel and Jørgen Mohr.") \
        == ["Ángel", "Jørgen", "Mohr"]
    assert find_names("Dov'è Sant'Angelo?", "Where is Sant'Angelo?") == ["Angelo"]


def test_a_name_counts_once_per_sentence_and_sentences_with_names_are_counted():
    src = ["Tom e Mary vedono Tom.", "Piove.", "Chiama Mary."]
    ref = ["Tom and Mary see Tom.", "It's raining.", "Call Mary."]
    hyp = ["Tom and Maria see Tom.", "It rains.", "Call Mary."]
    result = name_copy(src, hyp, ref)
    assert result == NameCopy(names=3, copied=2, sentences=2)  # Mary, Tom (once); Mary
    assert result.rate == pytest.approx(2 / 3) and str(result) == "names 66.7% (2/3)"


def test_no_names_gives_no_rate_rather_than_a_division_by_zero():
    empty = name_copy(["Piove."], ["It rains."], ["It's raining."])
    assert empty.rate is None and str(empty) == "names n/a (0/0)"
    assert name_copy([], [], []).rate is None
    with pytest.raises(ValueError, match="line-aligned"):
        name_copy(["a", "b"], ["a"], ["a", "b"])


def test_the_references_as_hypotheses_copy_every_name():
    src, ref = read_lines(SAMPLE / "dev.it"), read_lines(SAMPLE / "dev.en")
    result = name_copy(src, ref, ref)
    assert result.names > 0 and result.rate == 1.0
    assert name_copy(src, [""] * len(src), ref).rate == 0.0
    assert name_copy(src, ref, ref) == result  # deterministic
