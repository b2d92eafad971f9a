"""Corpus filters (`data.filters`): each rule keeps the good pairs and drops the bad ones,
counted under the first rule that drops them; off changes nothing; dev sets are never
filtered; the setting is part of the prepared cache's key."""

from __future__ import annotations

import importlib.util
import json
import logging
import random
import unicodedata

import numpy as np
import pytest

from transformer.config import DataConfig, FilterConfig, to_dataclass
from transformer.data import filters, pipeline
from transformer.data.corpus import DataError, read_lines
from transformer.data.filters import (
    Dedup,
    char_ratio_ok,
    check_filters,
    chunk_filter,
    non_latin_share,
    numbers_ok,
    script_ok,
)
from transformer.data.pipeline import prepare_data
from transformer.errors import ConfigError
from transformer.paths import PROJECT_ROOT

from helpers import compose_cfg

SAMPLE = PROJECT_ROOT / "data" / "sample"
needs_langid = pytest.mark.skipif(importlib.util.find_spec("py3langid") is None,
                                  reason="py3langid not installed (pip install 'transformer-mt[filters]')")

GOOD = [("Ho tre gatti.", "I have three cats."), ("Dov'è la stazione?", "Where is the station?"),
        ("Il treno parte alle 8.", "The train leaves at 8."), ("Perché è così?", "Why is it so?")]


def split(pairs):
    return [s for s, _ in pairs], [t for _, t in pairs]


def test_char_ratio_keeps_pairs_within_the_ratio_either_way_round():
    src, tgt = split([("Sì.", "Yes."), ("Sì.", "Yes, it is, of course it is."),
                      ("Sì, certo che lo è, naturalmente.", "Yes."), ("abc", "abcdef"), ("abc", "abcdefg")])
    assert char_ratio_ok(src, tgt, 2.0).tolist() == [True, False, False, True, False]
    assert char_ratio_ok(src, tgt, 100.0).all()


@pytest.mark.parametrize(("src", "tgt", "kept"), [
    ("Ho 3 gatti.", "I have 3 cats.", True),
    ("Costa 1.000,50 euro.", "It costs 1,000.50 euros.", True),  # separators differ, numbers agree
    ("Il 05 maggio.", "On 5 May.", True),  # leading zeros
    ("Ho tre gatti.", "I have three cats.", True),  # no digits
    ("L'articolo 5 del 1999.", "Article 5.", True),  # one shared, one differs: OpusCleaner keeps it
    ("Ho 3 gatti.", "I have 4 cats.", False),
    ("Ho due gatti.", "I have 2 cats.", False),
    ("Le 10 e 20.", "At 11 and 21.", False),
])
def test_numbers_drops_pairs_whose_numbers_differ(src, tgt, kept):
    assert numbers_ok([src], [tgt]).tolist() == [kept]


def test_the_latin_letters_are_those_unicode_names_latin():
    """Every letter of the Basic Multilingual Plane: Latin for the filter iff its Unicode
    name says LATIN (ª and º, Latin by Unicode's script property, and µ, of no script, aside)."""
    letters = (chr(c) for c in range(0x80, 0x10000) if chr(c).isalpha())
    wrong = [c for c in letters if ("LATIN" in unicodedata.name(c, "")) != (non_latin_share(c) == 0)]
    assert wrong == ["ª", "µ", "º"]


def test_numbers_and_symbols_are_not_letters():
    assert non_latin_share("3 ½ hours, 1000 m², 180 µg/m3, ¾ of it") == 0
    assert non_latin_share("½ Ω") == 1  # the ohm sign is a Greek letter


def test_script_counts_the_share_of_letters_and_drops_above_it():
    assert non_latin_share("Perché è così? Łódź, Việt Nam, ﬁne.") == 0
    assert non_latin_share("Привет, мир!") == 1
    assert non_latin_share("123 ... !!!") == 0  # no letters
    assert non_latin_share("Αβ cd") == 0.5  # digits, spaces, punctuation do not count
    src, tgt = split([("Il valore di π è circa 3,14.", "The value of π is about 3.14."),
                      ("Привет.", "Hello."), ("Ciao.", "東京へ行く"), *GOOD])
    assert script_ok(src, tgt, 0.1).tolist() == [True, False, False, True, True, True, True]
    assert not script_ok(src[:1], tgt[:1], 0.0).any()


def reference_dedup(pairs, mode):
    seen, keep = set(), []
    for s, t in pairs:
        key = t if mode == "target" else (s, t)
        keep.append(key not in seen)
        seen.add(key)
    return keep


@pytest.mark.parametrize("mode", ["pairs", "target"])
def test_dedup_keeps_the_first_of_each_kind_across_chunks(mode):
    """Against a set of what was seen, over chunks of many sizes (its runs merge as they grow)."""
    rng = random.Random(0)
    pairs = [(f"s{rng.randrange(40)}", f"t{rng.randrange(30)}") for _ in range(3000)]
    dedup, keep, at = Dedup(mode, "train"), [], 0
    while at < len(pairs):
        n = rng.randrange(1, 300)
        keep += dedup.keep(*split(pairs[at:at + n])).tolist()
        at += n
    assert keep == reference_dedup(pairs, mode)
    assert len(dedup.runs) < 12  # merged: a few runs, not one per chunk


def test_dedup_by_pairs_keeps_a_target_with_another_source():
    src, tgt = split([("Sono stanco.", "I'm tired."), ("Sono stanca.", "I'm tired."), ("Sono stanco.", "I'm tired.")])
    assert Dedup("pairs", "train").keep(src, tgt).tolist() == [True, True, False]
    assert Dedup("target", "train").keep(src, tgt).tolist() == [True, False, False]


def test_dedup_remembers_at_most_its_bound(monkeypatch, caplog):
    monkeypatch.setattr(filters, "MAX_DEDUP_PAIRS", 5)
    dedup = Dedup("target", "train")
    with caplog.at_level(logging.WARNING):
        first = dedup.keep([""] * 8, [f"t{i}" for i in range(8)])
        again = dedup.keep([""] * 8, [f"t{i}" for i in range(8)])
    assert first.all() and dedup.remembered == 5
    assert again.sum() == 3  # those past the bound were never remembered
    assert sum("remembers at most 5" in r.message for r in caplog.records) == 1


def test_chunk_filter_counts_each_pair_under_the_first_rule_that_drops_it():
    bad = [("Sì.", "Yes, of course, it is 12 o'clock."),  # char_ratio and numbers: char_ratio's
           ("Ho 3 gatti.", "I have 4 cats."),  # numbers
           ("Привет.", "Hello.")]  # script
    src, tgt = split([*GOOD, *bad, *GOOD])
    rows, counts = chunk_filter(src, tgt, FilterConfig(char_ratio=3, numbers=True, script=0.1), ("it", "en"))
    assert counts == {"char_ratio": 1, "numbers": 1, "script": 1}
    assert [src[i] for i in rows] == split(GOOD * 2)[0]
    rows, counts = chunk_filter(src, tgt, FilterConfig(numbers=True), ("it", "en"))
    assert counts == {"numbers": 2} and len(rows) == len(src) - 2


def test_chunk_filter_off_keeps_everything():
    src, tgt = split([*GOOD, ("Ho 3 gatti.", "I have 4 cats."), ("Привет.", "Hello.")])
    rows, counts = chunk_filter(src, tgt, FilterConfig(), ("it", "en"))
    assert rows.tolist() == list(range(len(src))) and counts == {}
    assert not FilterConfig().active() and FilterConfig(numbers=True).active()
    assert FilterConfig(script=0.0).active()  # any letter outside the Latin script drops the pair
    src, tgt = split([*GOOD, ("Il valore di π.", "The value of π.")])
    assert chunk_filter(src, tgt, FilterConfig(script=0.0), ("it", "en"))[1] == {"script": 1}


@needs_langid
def test_langid_drops_a_side_in_another_language_and_keeps_the_rest():
    src, tgt = split([
        ("Il Parlamento approva la relazione della commissione.", "Parliament adopts the committee's report."),
        ("Parliament adopts the committee's report.", "Parliament adopts the committee's report."),  # English source
        ("Il Parlamento approva la relazione.", "Il Parlamento approva la relazione."),  # Italian target
        ("Il Parlamento approva la relazione.", "Das Parlament nimmt den Bericht an."),  # German target
        ("1999/0067", "1999/0067"),  # nothing the model knows of language: no verdict
    ])
    assert filters.langid_ok(src, tgt, ("it", "en"), 0.01).tolist() == [True, False, False, False, True]
    assert filters.langid_ok(src, tgt, ("it", "en"), 0.0).all()


@needs_langid
def test_a_language_py3langid_does_not_know_is_refused_before_any_work():
    check_filters(DataConfig(filters=FilterConfig(langid=0.01)))
    with pytest.raises(DataError, match=r"data.filters.langid: data.tgt_lang='xx' is not a language"):
        check_filters(DataConfig(tgt_lang="xx", filters=FilterConfig(langid=0.01)))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("char_ratio", 0.5, r"data.filters.char_ratio=0.5: must be >= 1"),
    ("script", 1.0, r"data.filters.script=1.0: must be in \[0, 1\)"),
    ("langid", -0.1, r"data.filters.langid=-0.1: must be in \[0, 1\)"),
    ("dedup", "source", r"data.filters.dedup='source': choose pairs or target"),
])
def test_bad_settings_are_refused_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message):
        DataConfig(filters=FilterConfig(**{key: value})).validate()


def test_langid_without_py3langid_is_one_line_naming_the_key(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "py3langid" else real(name, *a))
    with pytest.raises(ConfigError, match=r"data.filters.langid=0.01: needs py3langid: pip install"):
        DataConfig(filters=FilterConfig(langid=0.01)).validate()


def test_filters_compose_from_the_command_line():
    cfg = compose_cfg("data=sample", "data.filters.numbers=true", "data.filters.dedup=pairs", config="prepare")
    assert to_dataclass(DataConfig, cfg.data).filters == FilterConfig(numbers=True, dedup="pairs")


# --- at preparation --------------------------------------------------------------------


def write_corpus(folder, pairs, dev_pairs):
    folder.mkdir(parents=True, exist_ok=True)
    for split_name, rows in (("train", pairs), ("dev", dev_pairs)):
        (folder / f"{split_name}.it").write_text("".join(s + "\n" for s, _ in rows), encoding="utf-8")
        (folder / f"{split_name}.en").write_text("".join(t + "\n" for _, t in rows), encoding="utf-8")
    return {f"{k}_{side}": str(folder / f"{k}.{lang}")
            for k in ("train", "dev") for side, lang in (("src", "it"), ("tgt", "en"))}


def files_cfg(tmp_path, files, **filter_settings):
    return DataConfig(name="files", cache_dir=str(tmp_path / "cache"), spm_vocab_size=90, num_proc=1,
                      filters=FilterConfig(**filter_settings), **files)


def test_preparation_filters_training_pairs_only_logs_and_counts_each_rule(tmp_path, caplog):
    rng = np.random.default_rng(0)
    good = [(f"Ho {n} gatti e {n + 1} cani.", f"I have {n} cats and {n + 1} dogs.") for n in rng.integers(0, 10**6, 200)]
    bad = [("Ho 3 gatti.", "I have 4 cats."), ("Привет, мир.", "Hello, world."), good[0]]
    files = write_corpus(tmp_path / "c", [*good, *bad], [("Ho 3 gatti.", "I have 4 cats."), *good[:5]])
    with caplog.at_level(logging.INFO):
        prepared = prepare_data(files_cfg(tmp_path, files, numbers=True, script=0.1, dedup="pairs"))
    assert prepared.stats["dropped"]["train"] == {"empty": 0, "numbers": 1, "script": 1, "dedup": 1,
                                                 "too_long": 0, "length_ratio": 0}
    assert len(prepared.train) == len(good)
    assert prepared.dev["src"][0] == "Ho 3 gatti."  # dev sets are never filtered
    assert "dev" not in prepared.stats["dropped"] or set(prepared.stats["dropped"]["dev"]) == {"empty"}
    assert "train: data.filters.numbers dropped 1 of 203 pairs (numbers that differ" in caplog.text


def test_the_filters_are_part_of_the_cache_key_and_off_changes_nothing(tmp_path):
    pairs = list(dict.fromkeys(zip(read_lines(SAMPLE / "train.it"), read_lines(SAMPLE / "train.en"), strict=True)))[:150]
    files = write_corpus(tmp_path / "c", [*pairs, *pairs[:10]], pairs[:5])
    off = prepare_data(files_cfg(tmp_path, files))
    assert len(off.train) == 160 and set(off.stats["dropped"]["train"]) == {"empty", "too_long", "length_ratio"}
    on = prepare_data(files_cfg(tmp_path, files, dedup="pairs"))
    assert not on.from_cache and on.path != off.path and len(on.train) == 150
    other = prepare_data(files_cfg(tmp_path, files, dedup="target"))
    assert not other.from_cache and other.path not in (on.path, off.path)
    again = prepare_data(files_cfg(tmp_path, files))
    assert again.from_cache and again.path == off.path
    # off, the key is the one data prepared before the filters existed had
    assert "filters" not in json.loads(pipeline._settings(files_cfg(tmp_path, files)))[2]


def test_a_split_the_filters_empty_is_one_error_saying_so(tmp_path):
    files = write_corpus(tmp_path / "c", [("Ho 3 gatti.", "I have 4 cats.")] * 3, [("Ciao.", "Hi.")])
    with pytest.raises(DataError, match=r"train split is empty after cleaning and data.filters"):
        prepare_data(files_cfg(tmp_path, files, numbers=True))
