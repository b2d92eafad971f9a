"""The filter report: each rule's removals counted alone and in preparation's order, with
a sample of examples drawn from what it removed."""

from __future__ import annotations

from transformer.config import DataConfig, FilterConfig
from transformer.inspection.filter_report import filter_report, format_report, preparation_seconds

GOOD = [(f"Ho {n} gatti e nessun cane, signora {n}.", f"I have {n} cats and no dog, madam {n}.") for n in range(60)]
BAD = {"char_ratio=3": [("Sì.", "Yes, yes, of course, yes.")],
       "numbers": [("Ho 3 gatti.", "I have 4 cats."), ("Ho due gatti.", "I have 2 cats.")],
       "script=0.1": [("Привет, мир.", "Hello, world.")],
       "dedup=pairs": [GOOD[1]]}


def corpus(tmp_path) -> DataConfig:
    pairs = [*GOOD, *(p for rows in BAD.values() for p in rows), ("Ho sette gatti, signora 7, e nessun cane.", GOOD[7][1])]
    files = {}
    for side, lang in (("src", "it"), ("tgt", "en")):
        path = tmp_path / f"train.{lang}"
        path.write_text("".join(p[side == "tgt"] + "\n" for p in pairs), encoding="utf-8")
        files[f"train_{side}"] = str(path)
    return DataConfig(name="files", dev_src=files["train_src"], dev_tgt=files["train_tgt"], num_proc=1, **files)


def test_each_rule_alone_counts_and_shows_what_it_removed(tmp_path):
    cfg = FilterConfig(char_ratio=3, numbers=True, script=0.1, dedup="pairs")
    report = filter_report(corpus(tmp_path), cfg, examples=1, seed=0)
    assert report.pairs == len(GOOD) + 6
    removed = {name: r.removed for name, r in report.alone.items()}
    assert removed == {"char_ratio=3": 1, "numbers": 2, "script=0.1": 1, "dedup=pairs": 1,
                       "dedup=target": 2}  # target: GOOD[1] again, and GOOD[7]'s target with another source
    for name, rows in BAD.items():
        r = report.alone[name]
        assert len(r.examples) == 1 and r.examples[0][:2] in rows
    assert report.chain == {"char_ratio": 1, "numbers": 2, "script": 1, "dedup": 1}  # the rules on
    assert sum(report.chain.values()) + report.kept == report.pairs
    text = format_report(report)
    assert "| numbers | 2 (3.03%) | 0 |" in text and "Привет" in text


def test_the_examples_are_a_sample_of_all_removals(tmp_path):
    cfg = FilterConfig(numbers=True)
    samples = {tuple(filter_report(corpus(tmp_path), cfg, examples=1, seed=s).alone["numbers"].examples[0][:2])
               for s in range(20)}
    assert samples == set(BAD["numbers"])  # each of the two, over seeds


def test_preparation_is_timed_with_and_without_the_filters(tmp_path):
    seconds = preparation_seconds(corpus(tmp_path), FilterConfig(numbers=True))
    assert set(seconds) == {"cleaning", "cleaning and filters"} and min(min(s) for s in seconds.values()) >= 0
