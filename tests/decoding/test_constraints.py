"""A forced target prefix and no repeated n-grams: by hand on the step's logits, then in
greedy and beam search (our model and its export), through `Translator` and mt-translate.

Properties: every output starts with its prefix; its score is what `score` gives its
tokens (the prefix scored as the model scores it); no output repeats an n-gram; without
either the search is what it was; bad values are one-line errors naming the key.
"""

from __future__ import annotations

import itertools
import math
import sys

import pytest
import torch

from transformer import Translator
from transformer.commands import translate as translate_command
from transformer.config import ConfigError, DecodeConfig
from transformer.decoding.constraints import (
    ConstrainedSteps,
    Constraints,
    ban_repeats,
    force_prefix,
)
from transformer.decoding.search import search

from helpers import pad_batch, tiny_model

LINES = ["Che ore sono?", "Ti chiamo stasera.", "Sì, certo!", "Ciao", "Ci vediamo martedì alle due."]
PREFIXES = ["Hello there", None, "Yes", "", "We see"]
SHORT = dict(max_len_a=0, max_len_b=12)
SEARCHES = [dict(method="greedy"), dict(beam_size=3, nbest=2)]


def test_ban_repeats_rules_out_the_tokens_that_close_a_written_ngram():
    logits = torch.zeros(2, 10)
    written = torch.tensor([[5, 6, 7, 5], [4, 4, 4, 9]])  # row 0: 5 was followed by 6
    ban_repeats(logits, written, 2)
    assert (logits[0] == -math.inf).nonzero().flatten().tolist() == [6]
    assert not (logits[1] == -math.inf).any()  # 9 never came before
    logits = torch.zeros(2, 10)
    ban_repeats(logits, written, 1)  # a 1-gram: every token written
    assert (logits[0] == -math.inf).nonzero().flatten().tolist() == [5, 6, 7]
    logits = torch.zeros(2, 10)
    ban_repeats(logits, written, 3)  # (4, 4) was followed by 4
    assert (logits[1] == -math.inf).nonzero().flatten().tolist() == [] and not (logits[0] < 0).any()
    ban_repeats(logits, torch.tensor([[4, 4, 4], [1, 2, 3]]), 3)
    assert (logits[0] == -math.inf).nonzero().flatten().tolist() == [4]
    ban_repeats(logits, written[:, :1], 2)  # too short for any n-gram: nothing changes


def test_force_prefix_keeps_the_wanted_tokens_logit_only():
    logits = torch.arange(12.0).view(2, 6)
    force_prefix(logits, torch.tensor([4, -1]))  # row 1: its prefix is over
    assert logits[0].tolist() == [-math.inf] * 4 + [4.0, -math.inf]
    assert logits[1].tolist() == [6.0, 7.0, 8.0, 9.0, 10.0, 11.0]


def test_constrained_steps_keep_each_rows_history_through_a_reorder():
    """Row histories follow the search's choice of rows: after rows swap, each row's ban
    is of the bigrams it wrote itself (BOS 2; vocabulary of 8)."""
    steps = ConstrainedSteps(Constraints.build(None, 2, "cpu"), rows=2, bound=4, bos=2, device="cpu")
    for step, tokens in enumerate(([5, 6], [7, 7], [5, 6])):
        steps.advance(None, torch.tensor(tokens), step)
    steps.advance(torch.tensor([1, 0]), torch.tensor([6, 5]), 3)  # rows swap, then write
    # row 0 is the old row 1 (6 7 6) and then 6; row 1 the old row 0 (5 7 5) and then 5
    logp = steps(torch.zeros(2, 8), torch.tensor([0, 0]), 4)
    assert torch.isinf(logp[0]).nonzero().flatten().tolist() == [6, 7]  # "6 7", "6 6" written
    assert torch.isinf(logp[1]).nonzero().flatten().tolist() == [5, 7]  # "5 7", "5 5" written


def test_no_constraints_build_nothing_and_bad_sizes_are_refused():
    assert Constraints.build(None, 0, "cpu") is None
    assert Constraints.build([None, []], 0, "cpu") is None
    with pytest.raises(ValueError, match="no_repeat_ngram_size=17"):
        Constraints.build(None, 17, "cpu")


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_a_search_starts_with_its_prefix_and_repeats_no_ngram(method):
    model = tiny_model(seed=1)
    src = pad_batch([[5, 6, 7, 8], [9, 10], [11, 12, 13]])
    cfg = DecodeConfig(method=method, beam_size=3, nbest=1 if method == "greedy" else 3,
                       max_len_a=0, max_len_b=12, lenpen=0.0)
    plain = search(model, src, cfg)
    assert any(len(h.tokens) != len(set(h.tokens)) for hyps in plain for h in hyps)  # it repeats
    prefixes = [[20, 21, 20], None, [22]]
    found = search(model, src, cfg, prefixes)
    for prefix, hyps in zip(prefixes, found, strict=True):
        for h in hyps:
            assert h.tokens[:len(prefix or [])] == (prefix or [])
    for n in (1, 2, 3):
        no_repeats = search(model, src, DecodeConfig(**{**cfg.__dict__, "no_repeat_ngram_size": n}))
        for hyps in no_repeats:
            for h in hyps:
                grams = [tuple(h.tokens[i:i + n]) for i in range(len(h.tokens) - n + 1)]
                assert len(grams) == len(set(grams))
    assert search(model, src, cfg, [None, None, None]) == plain  # no prefix: as before


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_a_prefix_follows_its_sentence_when_the_batch_drops_a_finished_one(method):
    model = tiny_model(seed=1)
    src = pad_batch([[5], [9, 10, 11, 12, 13, 14]])  # limits |x|: 1 and 6 tokens
    cfg = DecodeConfig(method=method, beam_size=3, max_len_a=1.0, max_len_b=0, lenpen=0.0)
    short, long = search(model, src, cfg, [None, [20, 21, 22, 23]])
    assert len(short[0].tokens) == 1  # it ended at step 1, its rows left the batch
    assert long[0].tokens[:4] == [20, 21, 22, 23]  # steps 2 and 3 still forced


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_a_prefix_that_repeats_an_ngram_wins_over_the_ngram_rule(method):
    model = tiny_model(seed=1)
    src = pad_batch([[5, 6, 7, 8], [9, 10]])
    cfg = DecodeConfig(method=method, beam_size=3, max_len_a=0, max_len_b=10, lenpen=0.0,
                       no_repeat_ngram_size=2)
    prefixes = [[20, 21, 20, 21], None]  # (20, 21) twice
    for prefix, hyps in zip(prefixes, search(model, src, cfg, prefixes), strict=True):
        tokens, after = hyps[0].tokens, len(prefix or [])
        assert tokens[:after] == (prefix or []) and math.isfinite(hyps[0].score)
        grams = list(itertools.pairwise(tokens))  # grams[i] ends at token i + 1
        for i in range(max(after - 1, 0), len(grams)):  # those the search chose repeat none
            assert grams[i] not in grams[:i]


@pytest.mark.parametrize("keywords", SEARCHES, ids=["greedy", "beam"])
def test_a_prefixed_translation_is_scored_as_the_model_scores_it(checkpoint, keywords):
    translator = Translator.load(checkpoint, **SHORT)
    check_prefixes(translator, keywords)


@pytest.mark.parametrize("keywords", SEARCHES, ids=["greedy", "beam"])
def test_an_exports_prefix_and_ngram_rule_score_as_the_model_scores(checkpoint, keywords, tmp_path):
    pytest.importorskip("ctranslate2")
    from transformer.commands.export import export
    from transformer.deploy.ct2_export import ExportConfig

    out = export(ExportConfig(checkpoint=str(checkpoint), output=str(tmp_path / "ct2")))
    check_prefixes(Translator.load(out, device="cpu", threads=1, **SHORT), keywords)


def check_prefixes(translator: Translator, keywords: dict) -> None:
    found = translator.translate(LINES, target_prefix=PREFIXES, return_scores=True, **keywords)
    for line, prefix, entry in zip(LINES, PREFIXES, found, strict=True):
        start = translator.tokenizer.pieces(prefix) if prefix else []
        for t in entry if isinstance(entry, list) else [entry]:
            assert t.tokens[:len(start)] == start
            assert translator.score(line, t.tokens, **keywords) == pytest.approx(t.score, abs=1e-4)
    found = translator.translate(LINES, no_repeat_ngram_size=2, return_scores=True, **keywords)
    for line, entry in zip(LINES, found, strict=True):
        for t in entry if isinstance(entry, list) else [entry]:
            grams = list(zip(t.tokens, t.tokens[1:], strict=False))
            assert len(grams) == len(set(grams))
            assert translator.score(line, t.tokens, **keywords) == pytest.approx(t.score, abs=1e-4)
    one = translator.translate(LINES[0], target_prefix="Hello", return_scores=True, method="greedy")
    assert one.tokens[:2] == translator.tokenizer.pieces("Hello")[:2]


def test_bad_prefixes_and_ngram_sizes_are_one_line_errors(checkpoint):
    translator = Translator.load(checkpoint, method="greedy", **SHORT)
    with pytest.raises(ValueError, match="target_prefix holds 1 entries for 2 lines"):
        translator.translate(["Ciao", "Sì"], target_prefix=["Hi"])
    with pytest.raises(TypeError, match=r"target_prefix\[1\] is a int"):
        translator.translate(["Ciao", "Sì"], target_prefix=["Hi", 3])
    with pytest.raises(TypeError, match="give a str with a single line"):
        translator.translate("Ciao", target_prefix=["Hi"])
    with pytest.raises(ConfigError, match=r"^target_prefix of line 2: \d+ tokens, above its length limit of 2"):
        translator.translate(["Ciao", "Sì"], target_prefix=[None, "a long prefix here"], max_len_b=2)
    with pytest.raises(ConfigError, match=r"^no_repeat_ngram_size=17: must be <= 16"):
        translator.translate("Ciao", no_repeat_ngram_size=17)
    with pytest.raises(ConfigError, match=r"^no_repeat_ngram_size=-1: must be >= 0"):
        translator.translate("Ciao", no_repeat_ngram_size=-1)


def test_mt_translate_takes_the_ngram_rule_and_a_prefix_file(checkpoint, tmp_path, monkeypatch, capsys):
    source, prefix = tmp_path / "in.it", tmp_path / "prefix.en"
    source.write_text("\n".join(LINES) + "\n")
    prefix.write_text("\n".join(p or "" for p in PREFIXES) + "\n")
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={checkpoint}", f"input.file={source}",
                                      f"input.target_prefix_file={prefix}", "decode=greedy", "decode.max_len_a=0",
                                      "decode.max_len_b=12", "decode.no_repeat_ngram_size=2"])
    translate_command.main()
    printed = capsys.readouterr().out.splitlines()
    expected = Translator.load(checkpoint).translate(
        LINES, target_prefix=PREFIXES, method="greedy", no_repeat_ngram_size=2, **SHORT)
    assert printed == expected


def test_mt_translate_refuses_a_prefix_file_it_cannot_pair(checkpoint, tmp_path, monkeypatch):
    source, prefix = tmp_path / "in.it", tmp_path / "prefix.en"
    source.write_text("Ciao\nSì\n")
    prefix.write_text("Hi\n")
    for overrides, message in [
        ([f"input.file={source}"], f"mt-translate: error: input.target_prefix_file={prefix} has 1 line(s) "
                                   "and the input 2: give one prefix line"),
        ([], f"mt-translate: error: input.target_prefix_file='{prefix}': pairs its lines with input.file's"),
    ]:
        monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={checkpoint}",
                                          f"input.target_prefix_file={prefix}", *overrides])
        with pytest.raises(SystemExit) as exit_info:
            translate_command.main()
        assert str(exit_info.value.code).startswith(message)


def test_a_prefix_the_vocabulary_cannot_spell_is_refused_as_score_refuses_a_piece(checkpoint, tmp_path, monkeypatch,
                                                                                  capsys):
    """Characters outside the vocabulary would be forced as <unk> (the output beginning with
    "⁇"): refused, naming the prefix (Translator) or the file and line (mt-translate,
    before any line is translated), as `score` refuses a piece the vocabulary lacks."""
    translator = Translator.load(checkpoint, method="greedy", **SHORT)
    assert translator.tokenizer.unknown_characters("Hi 漢字 there 漢") == ["漢", "字"]
    with pytest.raises(ValueError, match=r"^target_prefix: '漢', '字' not in this model's vocabulary: forced as "
                                         r"<unk>, the translation would begin with '⁇'; remove or replace them$"):
        translator.translate("Ciao", target_prefix="漢字 hello")
    with pytest.raises(ValueError, match=r"^target_prefix\[1\]: '☃' not in this model's vocabulary"):
        translator.translate(["Ciao", "Sì"], target_prefix=["Hi", "☃ yes"])
    with pytest.raises(ValueError, match=r"^targets\[0\]: '☃' is not a piece"):  # score's refusal, for comparison
        translator.score("Ciao", ["☃"])
    source, prefix = tmp_path / "in.it", tmp_path / "prefix.en"
    source.write_text("Ciao\nSì\n")
    prefix.write_text("Hi\n☃ yes\n")
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={checkpoint}", f"input.file={source}",
                                      f"input.target_prefix_file={prefix}", "decode=greedy"])
    with pytest.raises(SystemExit) as exit_info:
        translate_command.main()
    assert exit_info.value.code == (f"mt-translate: error: {prefix}:2: '☃' not in this model's vocabulary: forced "
                                    "as <unk>, the translation would begin with '⁇'; remove or replace it")
    assert capsys.readouterr().out == ""  # refused before the first line


def test_a_prefix_above_the_models_limit_names_the_limit_not_max_len_b(checkpoint, tmp_path, monkeypatch, capsys):
    """Past the model's own limit (max_positions - 1: 31 here) no setting helps: the
    message names that limit; below it, past a * |x| + b, raising decode.max_len_b does."""
    translator = Translator.load(checkpoint, method="greedy", **SHORT)
    long = " ".join(["ciao"] * 40)
    assert len(translator.tokenizer.encode([long])[0]) > 31
    with pytest.raises(ConfigError, match=r"^target_prefix of line 1: \d+ tokens, above this model's limit of 31 "
                                          r"\(model.max_positions=32, one of them the BOS\): shorten the prefix$"):
        translator.translate("Ciao", target_prefix=long, max_len_b=200)
    source, prefix = tmp_path / "in.it", tmp_path / "prefix.en"
    source.write_text("Ciao\n")
    prefix.write_text(long + "\n")
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={checkpoint}", f"input.file={source}",
                                      f"input.target_prefix_file={prefix}", "decode=greedy"])
    with pytest.raises(SystemExit) as exit_info:
        translate_command.main()
    assert str(exit_info.value.code).startswith(f"mt-translate: error: {prefix}:1: a target prefix of ")
    assert "above this model's limit of 31 (model.max_positions=32" in exit_info.value.code
    assert "max_len_b" not in exit_info.value.code and capsys.readouterr().out == ""
