"""`Translator` translates as mt-translate does; `import transformer` stays torch-free.

Each equality test runs mt-translate (in this process, as tests/commands/test_translate.py
does) on a file and `Translator` on the same lines with the same settings, on a random tiny
checkpoint and on its CTranslate2 export: the lines include paragraphs of several
sentences (split, translated and joined again) and empty lines.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch

from transformer import CheckpointError, Translation, Translator
from transformer import device as device_module
from transformer.bounds import MAX_BATCH_TOKENS
from transformer.checkpoint import load_model, save_checkpoint
from transformer.commands import translate
from transformer.config import ConfigError, DecodeConfig
from transformer.data.corpus import read_lines
from transformer.data.sentences import split_sentences
from transformer.decoding import loading as loading_module
from transformer.decoding import settings
from transformer.decoding import text as text_module
from transformer.errors import UserError
from transformer.paths import PROJECT_ROOT

from helpers import end_sentences, tiny_checkpoint

LINES = ["Che ore sono? Ti chiamo stasera. Ci vediamo martedì alle due.", "",
         "Sì, certo!", "   ", "Il sig. Rossi è arrivato. Poi è partito."]
# mt-translate's overrides and Translator's keywords for the same settings
SETTINGS = {
    "greedy": (["decode=greedy", "decode.max_len_a=0", "decode.max_len_b=6"],
               dict(method="greedy", max_len_a=0, max_len_b=6)),
    "beam": (["decode=beam", "decode.beam_size=3", "decode.max_len_a=0", "decode.max_len_b=5"],
             dict(beam_size=3, max_len_a=0, max_len_b=5)),
    "unsplit": (["decode=greedy", "decode.max_len_b=6", "decode.split_sentences=false"],
                dict(method="greedy", max_len_b=6, split_sentences=False)),
    "sample": (["decode=sample", "decode.seed=4", "decode.sampling_topp=0.9", "decode.max_len_b=6"],
               dict(method="sample", seed=4, sampling_topp=0.9, max_len_b=6)),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "best", max_positions=32)


@pytest.fixture(scope="module")
def export_dir(checkpoint, tmp_path_factory) -> Path:
    pytest.importorskip("ctranslate2")
    from transformer.commands.export import export
    from transformer.deploy.ct2_export import ExportConfig

    out = tmp_path_factory.mktemp("export") / "ct2"
    return export(ExportConfig(checkpoint=str(checkpoint), output=str(out)))


def mt_translate(monkeypatch, tmp_path: Path, model: Path, *overrides: str) -> list[str]:
    """mt-translate's output file for LINES, run as the console script would run it."""
    src, out = tmp_path / "in.it", tmp_path / "out.en"
    src.write_text("".join(f"{line}\n" for line in LINES), encoding="utf-8")
    out.unlink(missing_ok=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={model}", f"input.file={src}",
                                      f"output={out}", "progress=false", *overrides])
    translate.main()
    return read_lines(out)


def test_the_lines_hold_paragraphs_and_empty_lines():
    assert len(split_sentences(LINES[0])) == 3 and len(split_sentences(LINES[4])) == 2
    assert LINES[1] == "" and not LINES[3].strip()


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_checkpoint_translates_as_mt_translate_does(checkpoint, name, tmp_path, monkeypatch):
    overrides, keywords = SETTINGS[name]
    expected = mt_translate(monkeypatch, tmp_path, checkpoint, *overrides)
    translator = Translator.load(checkpoint)
    assert translator.translate(LINES, **keywords) == expected
    assert Translator.load(checkpoint, **keywords).translate(LINES) == expected  # as defaults
    assert expected[1] == expected[3] == "" and all(expected[i] for i in (0, 2, 4))


@pytest.mark.parametrize("name", ["greedy", "beam"])
def test_an_export_translates_as_mt_translate_does(export_dir, name, tmp_path, monkeypatch):
    overrides, keywords = SETTINGS[name]
    expected = mt_translate(monkeypatch, tmp_path, export_dir, "threads=1", *overrides)
    translator = Translator.load(export_dir, device="cpu", threads=1)
    assert type(translator.model).__name__ == "CT2Model"
    assert translator.translate(LINES, **keywords) == expected
    assert expected[1] == expected[3] == ""


def test_nbest_gives_mt_translates_hypotheses(checkpoint, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={checkpoint}",
                                      "input.text='Che ore sono? Sì.\n\nCiao!'", "decode.beam_size=3",
                                      "decode.nbest=2", "decode.max_len_a=0", "decode.max_len_b=5"])
    translate.main()
    expected: list[list[str]] = [[], [], []]
    for line in capsys.readouterr().out.splitlines():
        i, hyp, _ = line.split(" ||| ")
        expected[int(i)].append(hyp)
    translator = Translator.load(checkpoint)
    found = translator.translate(["Che ore sono? Sì.", "", "Ciao!"], beam_size=3, nbest=2,
                                 max_len_a=0, max_len_b=5)
    assert found == expected and [len(h) for h in found] == [2, 1, 2]
    best = translator.translate(["Che ore sono? Sì.", "Ciao!"], beam_size=3, max_len_a=0, max_len_b=5)
    assert best == [found[0][0], found[2][0]]


def test_a_model_in_memory_translates_as_its_checkpoint(checkpoint):
    model, tokenizer = load_model(checkpoint)
    settings = DecodeConfig(method="greedy", max_len_b=6)
    assert Translator(model, tokenizer, decode=settings).translate(LINES) == \
        Translator.load(checkpoint, method="greedy", max_len_b=6).translate(LINES)
    with pytest.raises(ConfigError, match=r"^beam_size=0: must be >= 1$"):
        Translator(model, tokenizer, decode=DecodeConfig(beam_size=0))
    with pytest.raises(ConfigError, match=r"^threads=100000: must be <= \d+, the CPU cores"):
        Translator(model, tokenizer, threads=100_000)  # as load bounds it


def test_one_string_in_one_string_out(checkpoint):
    translator = Translator.load(checkpoint, method="greedy", max_len_b=6)
    assert translator.translate("Sì, certo!") == translator.translate(["Sì, certo!"])[0]
    assert translator.translate(x for x in ["Ciao", ""]) == translator.translate(["Ciao", ""])
    with pytest.raises(TypeError, match=r"lines\[1\] is a NoneType, not a str"):
        translator.translate(["Ciao", None])


@pytest.mark.parametrize(("lines", "message"), [
    (b"Ciao", r"^lines is bytes, not str: decode it first"),
    (bytearray(b"Ciao"), r"^lines is bytearray, not str: decode it first"),
    (42, r"^lines is a int, not a str or an iterable of str$"),
    (None, r"^lines is a NoneType, not a str or an iterable of str$"),
    (["Ciao", b"Grazie"], r"^lines\[1\] is a bytes, not a str: decode it first"),
])
def test_bytes_or_a_non_iterable_are_named_not_taken_for_lines(checkpoint, lines, message):
    """b"Ciao" was taken for the lines 67, 105, ...: `line 1 is a int, not a str` (#51.5)."""
    with pytest.raises(TypeError, match=message):
        Translator.load(checkpoint, method="greedy").translate(lines)


def test_device_and_precision_are_honoured(checkpoint, monkeypatch):
    used = []

    def spy(model, dtype):  # the dtype each call's weights are held in
        used.append((dtype, next(model.parameters()).device.type))
        return real(model, dtype)

    real = text_module.held_in
    monkeypatch.setattr(text_module, "held_in", spy)
    translator = Translator.load(checkpoint, device="cpu", precision="fp32", method="greedy",
                                 max_len_b=4)
    assert translator.device == torch.device("cpu") and translator.decode.precision == "fp32"
    assert {(p.device.type, p.dtype) for p in translator.model.parameters()} == {("cpu", torch.float32)}
    translator.translate(["Ciao"])
    translator.translate(["Ciao"], precision="bf16")  # emulated on this CPU: a warning, and it runs
    assert used == [(torch.float32, "cpu"), (torch.bfloat16, "cpu")]
    assert Translator.load(checkpoint, device=torch.device("cpu")).device == torch.device("cpu")
    assert "device=cpu, precision=fp32" in repr(translator)


@pytest.mark.parametrize("where", ["missing", "empty", "file"])
def test_a_bad_path_is_one_user_error_naming_it(checkpoint, tmp_path, where):
    path = {"missing": tmp_path / "nowhere", "empty": tmp_path,
            "file": checkpoint / "model.json"}[where]
    with pytest.raises(UserError) as info:
        Translator.load(path)
    msg = str(info.value)
    assert str(path) in msg and "\n" not in msg
    assert "checkpoint directory" in msg and "CTranslate2 export" in msg


def test_a_bad_setting_is_mt_translates_config_error_naming_the_keyword(checkpoint, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={checkpoint}", "input.text=Ciao",
                                      "decode.beam_size=0"])
    with pytest.raises(SystemExit) as exit_info:
        translate.main()
    message = "decode.beam_size=0: must be >= 1"
    assert exit_info.value.code == f"mt-translate: error: {message}"
    translator = Translator.load(checkpoint)
    with pytest.raises(ConfigError) as info:
        translator.translate(["Ciao"], beam_size=0)
    assert str(info.value) == message.removeprefix("decode.")  # the keyword, not the key
    with pytest.raises(ConfigError, match=r"^beam_size=0: must be >= 1$"):
        Translator.load(checkpoint, beam_size=0)
    refused = {
        "nbest": (dict(nbest=4, beam_size=3), r"^nbest=4: cannot exceed beam_size=3$"),
        "greedy": (dict(nbest=2, method="greedy"), r"^nbest=2: .* use method='beam' for an n-best"),
        "method": (dict(method="beamm"), r"^method='beamm': choose greedy, beam or sample$"),
        "type": (dict(max_len_b="six"), r"^max_len_b: Value 'six' .* could not be converted"),
        "finite": (dict(lenpen=float("nan")), r"^lenpen=nan: must be a finite number$"),
        "topp": (dict(method="sample", sampling_topp=0), r"^sampling_topp=0.0: must be in \(0, 1\]$"),
        "unknown": (dict(beam=3), r"^beam: not a decode setting; the settings are method, "),
        "precision": (dict(precision="fp16"), r"^precision='fp16' needs CUDA .* use precision='auto'"),
    }
    for keywords, pattern in refused.values():
        with pytest.raises(ConfigError, match=pattern) as bad:
            translator.translate(["Ciao"], **keywords)
        assert "decode." not in str(bad.value) and "decode=" not in str(bad.value)


@pytest.mark.parametrize("keywords, pattern", [
    (dict(precision="fp16"), r"^precision='fp16' needs CUDA"),
    (dict(precision="fp64"), r"^precision='fp64': choose one of auto, fp32, bf16, fp16$"),
    (dict(device="gpu"), r"^device='gpu': choose auto, cpu, cuda or cuda:N$"),
    (dict(threads=0), r"^threads=0: must be >= 1"),
    (dict(nbest=2), r"^nbest: give it to translate\(\)"),
])
def test_a_bad_load_keyword_names_its_key(checkpoint, keywords, pattern):
    with pytest.raises(ConfigError, match=pattern):
        Translator.load(checkpoint, **keywords)


def test_an_export_takes_precision_auto_only(export_dir):
    with pytest.raises(ConfigError, match=r"^precision='fp32': an exported model computes"):
        Translator.load(export_dir, device="cpu", precision="fp32")


def test_import_transformer_does_not_import_torch_or_change_the_process():
    """The package's face is lazy: LibreTranslate's venv imports transformer.deploy.serving,
    with only the standard library. Importing it sets nothing (OMP_WAIT_POLICY is the
    commands': `transformer.commands` sets it, before torch loads)."""
    code = """if True:
        import os, sys
        import transformer
        assert "torch" not in sys.modules, "import transformer imported torch"
        assert "OMP_WAIT_POLICY" not in os.environ, "import transformer set OMP_WAIT_POLICY"
        names = {"Transformer", "Translator", "Translation", "UserError", "ConfigError",
                 "CheckpointError", "DataError", "OutputError", "ExportError"}
        assert names <= set(dir(transformer)) & set(transformer.__all__)
        assert set(transformer._LAZY) | {"__version__"} == set(transformer.__all__)
        from transformer import ConfigError, UserError
        from transformer.errors import ConfigError as C
        assert ConfigError is C and issubclass(ConfigError, UserError)
        assert "torch" not in sys.modules, "the errors imported torch"
        for name in transformer._LAZY:
            assert isinstance(getattr(transformer, name), type), name
        from transformer import Translator, Transformer
        from transformer.decoding.translator import Translator as T
        from transformer.model.transformer import Transformer as M
        assert (Translator, Transformer) == (T, M) and "torch" in sys.modules
        assert transformer.Translator is T
        assert "OMP_WAIT_POLICY" not in os.environ
        try:
            transformer.Translatr
        except AttributeError as e:
            assert "has no attribute 'Translatr'" in str(e)
        else:
            raise AssertionError("a misspelt name resolved")
    """
    commands = """if True:
        import os, sys
        import transformer.commands.translate
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    """
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    for source in (code, commands):
        done = subprocess.run([sys.executable, "-c", source], cwd=PROJECT_ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr


def test_the_package_is_typed():
    assert (PROJECT_ROOT / "transformer" / "py.typed").is_file()
    assert 'transformer = ["py.typed"]' in (PROJECT_ROOT / "pyproject.toml").read_text()
    overloads = typing.get_overloads(Translator.translate)
    assert len(overloads) == 8  # str or iterable x nbest or not x scores or not
    returns = {typing.get_type_hints(f)["return"] for f in overloads}
    assert {str, list[str], Translation, list[list[Translation]]} <= returns
    assert len(typing.get_overloads(Translator.translate_iterable)) == 4
    assert len(typing.get_overloads(Translator.score)) == 4  # str or iterable x return_tokens


# --- scores, lazy iteration, forced scoring --------------------------------------------

ONE_SENTENCE = ["Che ore sono?", "Ti chiamo stasera.", "Sì, certo!", "Ciao", "Dove sei?",
                "Ci vediamo martedì alle due.", "Il sig. Rossi è arrivato.", "Vado a casa."]
SHORT = dict(max_len_a=0, max_len_b=10)


@pytest.fixture(scope="module")
def words(tmp_path_factory) -> Path:
    """A random tiny model that writes only whole-word pieces (each the one piece
    SentencePiece encodes its word to) and ends about a third of its sentences early:
    its translations tokenise back to the pieces the search chose, so `score` of the text
    must give the search's own score."""
    model, tokenizer = load_model(tiny_checkpoint(tmp_path_factory.mktemp("w") / "ckpt",
                                                  max_positions=32, seed=3))
    end_sentences(model, rate=0.3)
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    whole = {i for i, p in enumerate(pieces) if p.startswith("▁") and len(p) > 2
             and tokenizer.encode([p[1:]])[0] == [i]}
    assert len(whole) > 50
    with torch.no_grad():  # coordinate 0 of the last norm's output is 1 (end_sentences)
        for i in set(range(tokenizer.vocab_size)) - whole - {model.cfg.eos_id}:
            model.out_proj.weight[i, 0] = -30.0
    return save_checkpoint(tmp_path_factory.mktemp("w") / "words", model, tokenizer, "", {})


def flat(found) -> list[Translation]:
    return [t for entry in found for t in (entry if isinstance(entry, list) else [entry])]


@pytest.mark.parametrize("keywords", [dict(method="greedy"), dict(beam_size=4, nbest=3),
                                      dict(beam_size=3, lenpen=1.0)])
def test_a_translation_scores_the_same_both_ways(words, keywords):
    translator = Translator.load(words)
    lengths = set()
    for limit in (10, 1):  # hypotheses that end with EOS, and all cut at the limit (forced EOS)
        found = translator.translate(ONE_SENTENCE, return_scores=True, max_len_a=0,
                                     max_len_b=limit, **keywords)
        hyps = flat(found)
        sources = [src for src, entry in zip(ONE_SENTENCE, found, strict=True)
                   for _ in (entry if isinstance(entry, list) else [entry])]
        assert len(hyps) == len(ONE_SENTENCE) * keywords.get("nbest", 1)
        lengths |= {(len(h.text.split()), limit) for h in hyps}
        scores = translator.score(sources, [h.text for h in hyps], **keywords)
        assert scores == pytest.approx([h.score for h in hyps], abs=1e-4)
    assert any(n < limit for n, limit in lengths) and (1, 1) in lengths
    if "nbest" in keywords:  # in score order, and the texts are translate's own
        assert all(a.score >= b.score for entry in found for a, b in itertools.pairwise(entry))
        assert [[h.text for h in e] for e in found] == translator.translate(
            ONE_SENTENCE, max_len_a=0, max_len_b=1, **keywords)
    else:
        assert [h.text for h in found] == translator.translate(ONE_SENTENCE, max_len_a=0,
                                                               max_len_b=1, **keywords)
    one = translator.translate(ONE_SENTENCE[0], return_scores=True, **SHORT, **keywords)
    assert isinstance(translator.score(ONE_SENTENCE[0], flat([one])[0].text, **keywords), float)


def test_scores_are_mt_translates_nbest_scores(words, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={words}", "input.text='Ciao!\n\nDove sei?'",
                                      "decode.beam_size=3", "decode.nbest=2", "decode.max_len_b=6"])
    translate.main()
    printed = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    found = Translator.load(words).translate(["Ciao!", "", "Dove sei?"], beam_size=3, nbest=2,
                                             max_len_b=6, return_scores=True)
    assert [(int(i), text, float(score)) for i, text, score in printed] == [
        (i, t.text, pytest.approx(t.score, abs=5e-5)) for i, entry in enumerate(found) for t in entry]
    assert found[1] == [Translation("", 0.0)]


def test_a_line_of_sentences_scores_the_sum_of_theirs(words):
    translator = Translator.load(words, method="greedy", **SHORT)
    line = "Che ore sono? Ti chiamo stasera. Vado a casa."
    whole = translator.translate(line, return_scores=True)
    alone = translator.translate(split_sentences(line), return_scores=True)
    assert whole.text == " ".join(t.text for t in alone)
    assert whole.score == pytest.approx(sum(t.score for t in alone), abs=1e-4)
    # score() splits a translation of as many sentences, pairs them and sums
    targets = ["It is late.", "I call you tonight.", "I go home."]
    parts = translator.score(split_sentences(line), targets)
    assert translator.score(line, " ".join(targets)) == pytest.approx(sum(parts), abs=1e-4)
    assert translator.score(["", "Ciao"], ["", "Hi"])[0] == 0.0


def test_a_translation_that_does_not_split_like_its_source_is_scored_whole(words, caplog):
    translator = Translator.load(words)
    line, target = "Che ore sono? Vado a casa.", "It is late and I go home."
    with caplog.at_level(logging.WARNING):
        found = translator.score(["Ciao", line], ["Hi", target])
    assert "scored whole (line 2)" in caplog.text
    assert found[1] == pytest.approx(translator.score(line, target, split_sentences=False), abs=1e-5)


PARAGRAPHS = ["Che ore sono? Ti chiamo stasera. Vado a casa.", "", "Sì, certo! Dove sei?", "Ciao"]


@pytest.mark.parametrize("keywords", [dict(method="greedy"), dict(beam_size=3, nbest=2, lenpen=1.0)])
def test_a_translation_rescores_to_its_own_score_on_lines_of_several_sentences(words, keywords):
    """The words model writes no full stop, so its translation of a line of several
    sentences is one sentence of text: the Translation's segments, not the splitter, pair
    its pieces with the source's sentences (the text alone is scored whole, otherwise)."""
    translator = Translator.load(words, precision="fp32", **SHORT)
    found = translator.translate(PARAGRAPHS, return_scores=True, **keywords)
    hyps, sources = flat(found), [line for line, entry in zip(PARAGRAPHS, found, strict=True)
                                  for _ in (entry if isinstance(entry, list) else [entry])]
    best = [entry if isinstance(entry, Translation) else entry[0] for entry in found]
    alone = translator.translate(split_sentences(PARAGRAPHS[0]), return_scores=True, **keywords)
    assert segments_of(best[0]) == [(a if isinstance(a, Translation) else a[0]).tokens for a in alone]
    assert best[1].segments == [] and best[3].segments == [len(best[3].tokens)]
    assert any(len(h.segments) > 1 and len(split_sentences(h.text)) == 1 for h in hyps)
    assert translator.score(sources, hyps, **keywords) == pytest.approx([h.score for h in hyps], abs=1e-4)
    for (score, per_token), h in zip(translator.score(sources, hyps, return_tokens=True, **keywords),
                                     hyps, strict=True):
        assert per_token == pytest.approx(h.token_scores, abs=1e-4)
        assert score == pytest.approx(h.score, abs=1e-4)
    as_text = translator.score(sources, [h.text for h in hyps], **keywords)  # scored whole
    assert max(abs(a - h.score) for a, h in zip(as_text, hyps, strict=True)) > 0.1
    lazily = flat(translator.translate_iterable(PARAGRAPHS, return_scores=True, batch_tokens=5, **keywords))
    assert translator.score(sources, lazily, **keywords) == pytest.approx([h.score for h in lazily], abs=1e-4)


def segments_of(t: Translation) -> list[list[str]]:
    """A Translation's tokens cut into its units' pieces."""
    ends = list(itertools.accumulate(t.segments))
    return [t.tokens[end - n:end] for end, n in zip(ends, t.segments, strict=True)]


def test_a_line_translated_in_pieces_rescores_to_its_own_score(words):
    """A sentence longer than the model reads (32 positions here, 512 in the recipes) is
    translated in pieces, here into more tokens than the model writes at once (31): its
    Translation is scored piece by piece, as it was translated; its text or its tokens
    alone, which nothing pairs with the pieces, are refused in one line naming the limit."""
    translator = Translator.load(words, precision="fp32")
    line = ", ".join(["il gatto dorme sul divano della nonna"] * 5) + "."
    assert len(translator.tokenizer.encode([line])[0]) > 32
    t = translator.translate(line, return_scores=True, max_len_a=0, max_len_b=12, min_len=10)
    assert len(t.segments) > 1 and len(t.tokens) > 31 and sum(t.segments) == len(t.tokens)
    assert translator.score(line, t) == pytest.approx(t.score, abs=1e-4)
    total, per_token = translator.score([line], [t], return_tokens=True)[0]
    assert per_token == pytest.approx(t.token_scores, abs=1e-4) and total == pytest.approx(t.score, abs=1e-4)
    for alone in (t.text, t.tokens):
        with pytest.raises(ValueError) as info:
            translator.score(["Ciao", line], ["Hi", alone])
        assert re.fullmatch(r"line 2: a source of \d+ tokens, translated in \d+ sentences or pieces, "
                            r"and a translation of 1: it cannot be scored whole, as this model reads "
                            r"at most 32 tokens \(model.max_positions\); give the Translation itself, "
                            r"whose segments pair them", str(info.value))
    with pytest.raises(ValueError, match=rf"^targets\[0\]: a translation of {len(t.segments)} "
                                         r"sentences or pieces for a source of 1: score it with the line"):
        translator.score("Ciao", t)
    with pytest.raises(ValueError, match=r"^targets\[0\]: its segments \[1\] do not add up to its 2 tokens"):
        translator.score("Ciao", Translation("Hi there", -1.0, ["▁Hi", "▁there"], segments=[1]))


def test_score_refuses_what_it_cannot_pair(words):
    translator = Translator.load(words)
    with pytest.raises(ValueError, match="2 sources but 1 targets"):
        translator.score(["Ciao", "Sì"], ["Hi"])
    with pytest.raises(TypeError, match="both as a str, or both as lists"):
        translator.score(["Ciao"], "Hi")
    with pytest.raises(TypeError, match=r"both as a str \(or a str and a list of pieces, or a Translation\)"):
        translator.score("Ciao", ("Hi",))
    with pytest.raises(ValueError, match=r"^targets\[0\]: 'Hi' is not a piece of this model's vocabulary"):
        translator.score("Ciao", ["Hi"])  # a str and a list: the list is pieces
    with pytest.raises(TypeError, match=r"targets\[1\] is a int"):
        translator.score(["Ciao", "Sì"], ["Hi", 3])
    with pytest.raises(ValueError, match="this model writes at most 31"):
        translator.score("Ciao", " ".join(["live"] * 40))
    with pytest.raises(ConfigError, match=r"^lenpen=-1\.0: must be >= 0"):
        translator.score("Ciao", "Hi", lenpen=-1.0)


@pytest.mark.parametrize("call", ["translate", "translate_iterable", "score"])
def test_bytes_are_refused_with_a_clear_message(words, call):
    translator = Translator.load(words)
    args = {"translate": (b"Ciao",), "translate_iterable": (b"Ciao",), "score": (b"Ciao", "Hi")}
    with pytest.raises(TypeError, match=r"is bytes, not str: decode it first"):
        getattr(translator, call)(*args[call])


def test_translate_iterable_is_lazy_and_keeps_input_order(words):
    translator = Translator.load(words, method="greedy", **SHORT)
    pulled = []

    def endless():  # never ends: reading it whole would never return
        for line in itertools.cycle(ONE_SENTENCE):
            pulled.append(line)
            yield line

    first = list(itertools.islice(translator.translate_iterable(endless(), batch_tokens=12), 20))
    assert first == translator.translate([*ONE_SENTENCE, *ONE_SENTENCE, *ONE_SENTENCE][:20])
    assert len(pulled) < 20 + 12  # at most a window of 12 tokens (or lines) read ahead
    beam = dict(method="beam", beam_size=2, return_scores=True, nbest=1)
    lazily = flat(translator.translate_iterable(ONE_SENTENCE, batch_tokens=5, **beam))
    at_once = flat(translator.translate(ONE_SENTENCE, **beam))
    assert [t.text for t in lazily] == [t.text for t in at_once]
    assert [t.score for t in lazily] == pytest.approx([t.score for t in at_once], abs=1e-5)
    with pytest.raises(ConfigError, match=r"^beam_size=0"):  # at the call, before any line
        translator.translate_iterable(endless(), beam_size=0)
    with pytest.raises(TypeError, match="for one str use translate"):
        translator.translate_iterable("Ciao")
    with pytest.raises(TypeError, match=r"lines\[1\] is a NoneType"):
        list(translator.translate_iterable(["Ciao", None]))


def test_threads_apply_to_the_translators_calls_only(words, monkeypatch):
    from transformer.decoding import scoring, translations
    from transformer.decoding import translator as translator_module

    before = torch.get_num_threads()
    inside = []

    def spying(real):
        def spy(*args, **kwargs):
            inside.append(torch.get_num_threads())
            return real(*args, **kwargs)
        return spy

    monkeypatch.setattr(translations, "translate_nbest", spying(text_module.translate_nbest))
    monkeypatch.setattr(translator_module, "score_lines", spying(scoring.score_lines))
    threads = 1 if before > 1 else 2
    translator = Translator.load(words, threads=threads, method="greedy", **SHORT)
    assert torch.get_num_threads() == before  # loading sets nothing
    translator.translate(["Ciao"])
    translator.score("Ciao", "Hi")
    results = translator.translate_iterable(["Ciao", "Sì"], batch_tokens=1)
    next(results)
    assert torch.get_num_threads() == before  # not while the iterator waits
    list(results)
    assert inside == [threads] * 4 and torch.get_num_threads() == before


def test_loading_leaves_the_allocator_alone(words, monkeypatch):
    def refuse():
        raise AssertionError("Translator changed glibc's allocator options")

    monkeypatch.setattr(device_module, "keep_large_blocks_in_the_heap", refuse)
    monkeypatch.setattr(loading_module, "keep_large_blocks_in_the_heap", refuse)
    assert Translator.load(words, device="cpu").translate("Ciao", method="greedy", **SHORT)


@pytest.mark.parametrize("keywords", [dict(method="greedy"), dict(beam_size=3, nbest=2)])
def test_an_exports_translation_scores_the_same_both_ways(words, keywords, tmp_path):
    pytest.importorskip("ctranslate2")
    from transformer.commands.export import export
    from transformer.deploy.ct2_export import ExportConfig

    out = export(ExportConfig(checkpoint=str(words), output=str(tmp_path / "ct2")))
    translator = Translator.load(out, device="cpu", threads=1)
    found = translator.translate(ONE_SENTENCE, return_scores=True, **SHORT, **keywords)
    hyps = flat(found)
    sources = [src for src, entry in zip(ONE_SENTENCE, found, strict=True)
               for _ in (entry if isinstance(entry, list) else [entry])]
    scores = translator.score(sources, [h.text for h in hyps], **keywords)
    assert scores == pytest.approx([h.score for h in hyps], abs=1e-4)


# --- the examples of the README and the manual run verbatim ----------------------------

EXAMPLE_PAGES = [PROJECT_ROOT / "README.md", PROJECT_ROOT / "docs" / "python-api.md"]


def translator_examples(page: Path) -> str:
    """The page's ```python blocks that use a Translator, in order, as one program."""
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)
    return "\n".join(b for b in blocks if "translator" in b.lower())


@pytest.mark.parametrize("precision", ["as-written", "bf16"])
@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=lambda p: p.name)
def test_the_translator_examples_run_verbatim(page, precision, words, monkeypatch):
    """Each page's examples, the checkpoint path replaced by a real checkpoint's: scores,
    n-best with scores, iteration over a generator and forced scoring. Their asserts hold
    as written (`auto`: fp32 under the suite's pin) and in bf16, what `auto` gives on a
    CPU with native bf16 and on a GPU: the load is given precision and dtype bf16."""
    code = translator_examples(page)
    for needed in ("return_scores=True", "nbest=3", "translate_iterable(", ".score("):
        assert needed in code, f"{page.name} shows no {needed}"
    if page.name == "python-api.md":  # and the manual's fuller examples
        for needed in ("t.token_scores", "return_attention=True", "return_tokens=True",
                       "target_prefix=", "no_repeat_ngram_size=", "max_batch_size=",
                       "ThreadPoolExecutor", "dtype="):
            assert needed in code, f"{page.name} shows no {needed}"
    given = "" if precision == "as-written" else f", precision={precision!r}, dtype={precision!r}"
    code, n = re.subn(r'"runs/\w+/checkpoints/best"', repr(str(words)) + given, code)
    assert n == 1
    monkeypatch.setattr("builtins.print", lambda *args, **kwargs: None)
    found: dict = {}
    exec(compile(code, str(page), "exec"), found)
    held = {p.dtype for p in found["translator"].model.parameters()}
    assert held == {torch.bfloat16 if precision == "bf16" else torch.float32}
    top3 = found["top3"] if page.name == "python-api.md" else found["top3"][0]  # one line's
    assert isinstance(found["best"][0], Translation) and len(top3) == 3


def test_a_busy_machine_without_a_wait_policy_gets_no_advice_from_the_library(words, monkeypatch, caplog):
    """The OpenMP wait policy is the process's, which a library does not own: on a busy
    machine without OMP_WAIT_POLICY, loading and translating say nothing about it (the
    mt-* commands set it; docs/python-api.md, "Nothing process-wide", advises the user)."""
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with caplog.at_level(logging.DEBUG):
        translator = Translator.load(words, device="cpu", threads=2)
        translator.translate(["Ciao."], method="greedy", max_len_a=0, max_len_b=4)
    assert "OMP_WAIT_POLICY" not in caplog.text and "busy" not in caplog.text
    assert "OMP_WAIT_POLICY" not in os.environ  # nor set for the user


# --- batch control and threads ------------------------------------------------------------

def test_max_batch_size_caps_the_sentences_of_a_batch_and_changes_no_result(words, monkeypatch):
    from transformer.data.batching import length_batches
    from transformer.decoding import search as search_module

    assert length_batches([3, 1, 2, 2, 1], 100, max_rows=2) == [[0, 2], [3, 1], [4]]
    assert length_batches([3, 1, 2], 100) == [[0, 2, 1]]
    rows = []
    real = search_module.search

    def spy(model, src_ids, cfg, prefixes=None, keys=None):
        rows.append(src_ids.size(0))
        return real(model, src_ids, cfg, prefixes, keys)

    monkeypatch.setattr(text_module, "search", spy)
    translator = Translator.load(words, beam_size=3, **SHORT)
    whole = translator.translate(ONE_SENTENCE, return_scores=True)
    assert max(rows) > 2
    rows.clear()
    capped = translator.translate(ONE_SENTENCE, return_scores=True, max_batch_size=2)
    assert max(rows) == 2 and sum(rows) == len(ONE_SENTENCE)
    assert [t.text for t in capped] == [t.text for t in whole]
    assert [t.score for t in capped] == pytest.approx([t.score for t in whole], abs=1e-5)
    with pytest.raises(ConfigError, match=r"^max_batch_size=0: must be >= 1"):
        translator.translate("Ciao", max_batch_size=0)
    with pytest.raises(ConfigError, match=r"^batch_tokens=1000000: must be <= 131072"):
        translator.translate("Ciao", batch_tokens=1_000_000)


def test_the_gpu_batch_size_is_resolved_once_per_translator(words, monkeypatch):
    """On CUDA a null batch_tokens is sized to the free memory when the Translator is made;
    a call never sizes it again (the free memory mocked, as test_batch_memory.py does)."""
    model, tokenizer = load_model(words)
    monkeypatch.setattr(settings, "available_memory", lambda device: 200 * 10**9)
    translator = Translator(model, tokenizer, device="cuda", decode=DecodeConfig(precision="fp16"))
    resolved = translator.decode.batch_tokens
    assert resolved > settings.CUDA_BATCH_TOKENS
    monkeypatch.setattr(settings, "available_memory", lambda device: 10**9)  # memory taken
    for call in ({}, {"beam_size": 8}):
        cfg = settings.decode_settings(translator._config(call, None), torch.device("cuda"), model)
        assert cfg.batch_tokens == resolved
    assert translator._config({"batch_tokens": 3000}, None).batch_tokens == 3000  # per call when given


def test_decode_settings_are_resolved_once_per_translator_call_and_command(words, tmp_path, monkeypatch):
    """`load` resolves the settings once; a call without settings of its own reuses them,
    a call with some resolves them once for all its windows; mt-translate once for a file
    of many windows (settings.resolve_precision counted)."""
    from transformer.decoding.stream import windows

    calls = []
    real = settings.resolve_precision
    monkeypatch.setattr(settings, "resolve_precision",
                        lambda *args, **kwargs: calls.append(args) or real(*args, **kwargs))
    translator = Translator.load(words, **SHORT)
    assert len(calls) == 1
    translator.translate(ONE_SENTENCE)
    translator.translate(ONE_SENTENCE, return_scores=True)
    translator.score(ONE_SENTENCE[:2], ["Ciao", "Sì"])
    assert len(calls) == 1  # the Translator's own settings, as they were resolved
    assert len(list(windows(ONE_SENTENCE, translator.tokenizer, 5, max_len=32))) > 2
    found = list(translator.translate_iterable(ONE_SENTENCE, batch_tokens=5, return_scores=True))
    assert len(found) == len(ONE_SENTENCE) and len(calls) == 2
    mt_translate(monkeypatch, tmp_path, words, "decode=greedy", "decode.batch_tokens=5")
    assert len(calls) == 3


def test_the_old_max_tokens_keyword_is_batch_tokens(words, caplog):
    translator = Translator.load(words, **SHORT)
    with caplog.at_level(logging.WARNING):
        old = translator.translate(ONE_SENTENCE, max_tokens=5)
    assert old == translator.translate(ONE_SENTENCE, batch_tokens=5)
    assert translator._config({"max_tokens": 7}, None).batch_tokens == 7  # not the Translator's
    with pytest.raises(ConfigError, match=r"^max_tokens=0: must be >= 1$"):
        translator.translate("Ciao", max_tokens=0)


def test_threads_sharing_a_translator_get_what_sequential_calls_give(words, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    translator = Translator.load(words, threads=1, **SHORT)
    assert not translator.model.training  # eval once, at load

    def flip(*args, **kwargs):
        raise AssertionError("a call changed the shared model's mode")

    monkeypatch.setattr(translator.model, "train", flip)
    jobs = [
        lambda: translator.translate(ONE_SENTENCE, method="greedy"),
        lambda: translator.translate(ONE_SENTENCE, method="greedy", precision="bf16"),  # on a copy
        lambda: translator.translate(ONE_SENTENCE, beam_size=3, nbest=2, return_scores=True),
        lambda: translator.translate(ONE_SENTENCE, return_attention=True, method="greedy", lenpen=1.0),
        lambda: translator.translate(ONE_SENTENCE, no_repeat_ngram_size=1, max_batch_size=3),
        lambda: translator.translate(ONE_SENTENCE[:3], target_prefix=["I", None, "Yes"]),
        lambda: list(translator.translate_iterable(ONE_SENTENCE, batch_tokens=7, return_scores=True)),
        lambda: translator.score(ONE_SENTENCE, ["It is late."] * len(ONE_SENTENCE), return_tokens=True),
    ]

    def as_values(found):  # Translations compare by text and score: add their tokens
        if isinstance(found, Translation):
            return (found.text, found.score, found.tokens, found.token_scores, found.attention)
        return [as_values(f) for f in found] if isinstance(found, (list, tuple)) else found

    sequential = [as_values(job()) for job in jobs]
    before = torch.get_num_threads()
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(lambda job: as_values(job()), jobs * 3))
    assert together == sequential * 3
    assert torch.get_num_threads() == before


def test_load_holds_the_weights_in_the_dtype_it_decodes_in(checkpoint):
    """dtype=auto: the precision the translator decodes in (fp32 in the suite, which pins
    'no native bf16'); an explicit dtype is kept, and a call in another precision decodes
    on other weights without touching the held ones."""
    auto = Translator.load(checkpoint, device="cpu")
    assert {p.dtype for p in auto.model.parameters()} == {torch.float32}
    held = Translator.load(checkpoint, device="cpu", dtype="bf16", precision="fp32")
    assert {p.dtype for p in held.model.parameters()} == {torch.bfloat16}
    weights = {name: p.detach().clone() for name, p in held.model.named_parameters()}
    assert isinstance(held.translate("Il gatto dorme."), str)  # on the checkpoint's fp32 weights
    assert all(torch.equal(p, weights[name]) for name, p in held.model.named_parameters())
    assert {p.dtype for p in held.model.parameters()} == {torch.bfloat16}
    with pytest.raises(ConfigError, match="dtype='int8'"):
        Translator.load(checkpoint, device="cpu", dtype="int8")
    with pytest.raises(ConfigError, match="dtype"):
        Translator.load(checkpoint, device="cpu", dtype="fp16")  # needs CUDA


def test_a_translator_copies_its_model_once_per_dtype_while_its_weights_stay(checkpoint, monkeypatch):
    """A model held in fp32 and decoded in bf16 (what `auto` gives on a GPU) is copied at
    the first call that needs it, not at every call; an update of the weights (a model
    still training) makes the next call copy afresh."""
    from transformer.model import weights

    copies = []
    real = weights.copied_in
    monkeypatch.setattr(weights, "copied_in",
                        lambda model, dtype: copies.append(dtype) or real(model, dtype))
    model, tokenizer = load_model(checkpoint)
    translator = Translator(model, tokenizer, decode=DecodeConfig(method="greedy", max_len_b=6,
                                                                 precision="bf16"))
    first = translator.translate(LINES)
    assert translator.translate(LINES) == first and translator.translate(LINES[:1]) == first[:1]
    assert copies == [torch.bfloat16]
    assert translator.translate(LINES, precision="fp32") is not None  # the model itself: no copy
    assert copies == [torch.bfloat16]
    with torch.no_grad():
        model.out_proj.weight.mul_(2.0)  # what an optimizer step does to a parameter
    translator.translate(LINES)
    assert copies == [torch.bfloat16, torch.bfloat16]
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the model untouched


def test_a_call_wider_than_the_held_weights_decodes_on_the_checkpoints_own(words, tmp_path,
                                                                         monkeypatch):
    """A Translator holding bf16 weights (what `auto` gives on a GPU and a bf16 CPU; named
    here) asked for fp32 translates and scores, to the last bit, as an fp32 Translator and
    `mt-translate decode.precision=fp32` do: on the checkpoint's fp32 weights, read once
    and kept. The bf16 weights cast up (a Translator of that model in memory) score
    otherwise."""
    from transformer.decoding import translator as translator_module

    reads = []
    real = translator_module.load_model
    monkeypatch.setattr(translator_module, "load_model",
                        lambda path, device: reads.append(path) or real(path, device))
    held = Translator.load(words, device="cpu", dtype="bf16", precision="bf16", **SHORT)
    exact = Translator.load(words, device="cpu", dtype="fp32", precision="fp32", **SHORT)
    reads.clear()
    lines = [*ONE_SENTENCE, *LINES]
    expected = exact.translate(lines, return_scores=True)
    wide = held.translate(lines, precision="fp32", return_scores=True)
    assert [(t.text, t.score) for t in wide] == [(t.text, t.score) for t in expected]
    assert held.score(lines, wide, precision="fp32") == exact.score(lines, expected)
    assert reads == [words]  # once: the second call used what the first read
    assert {p.dtype for p in held.model.parameters()} == {torch.bfloat16}  # the held ones untouched
    overrides = ["decode.precision=fp32", "decode.max_len_a=0", "decode.max_len_b=10"]
    assert held.translate(LINES, precision="fp32") == mt_translate(monkeypatch, tmp_path, words, *overrides)
    cast_up = Translator(held.model, held.tokenizer, decode=DecodeConfig(precision="bf16", **SHORT))
    found = cast_up.translate(lines, precision="fp32", return_scores=True)
    assert [t.score for t in found] != [t.score for t in expected] and reads == [words]


def test_a_checkpoint_changed_since_load_is_refused_in_one_line(tmp_path):
    """The checkpoint's fp32 weights are read again only while they are what the held
    bf16 ones were rounded from; a model changed in memory decodes on its own weights."""
    path = tiny_checkpoint(tmp_path / "best", max_positions=32, seed=3)
    held = Translator.load(path, device="cpu", dtype="bf16", precision="bf16", method="greedy")
    changed = Translator.load(path, device="cpu", dtype="bf16", precision="bf16", method="greedy")
    tiny_checkpoint(path, max_positions=32, seed=4)  # a run's `best`, replaced as training goes on
    with pytest.raises(CheckpointError) as info:
        held.translate("Ciao", precision="fp32")
    assert re.fullmatch(rf"precision='fp32': {re.escape(str(path))} no longer holds the weights "
                        r"this Translator holds in bf16 \(it changed since it was loaded\): load it again",
                        str(info.value))
    with torch.no_grad():
        changed.model.out_proj.weight.mul_(2.0)  # new weights: the model is its own now
    assert isinstance(changed.translate("Ciao", precision="fp32"), str)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"^precision='fp32' decodes on the checkpoint's own "
                                              r"weights, which this Translator holds in bf16: "):
        held.translate("Ciao", precision="fp32")
    assert held.translate("Ciao") == held.translate("Ciao")  # its own precision reads nothing


def test_load_for_inference_casts_the_weights_once(checkpoint):
    model, _, _ = text_module.load_for_inference(str(checkpoint), "cpu", dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model, _, _ = text_module.load_for_inference(str(checkpoint), "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.parametrize("threads", ["2", 1.5, True])
def test_threads_of_the_wrong_type_are_named_at_load(checkpoint, threads):
    """"2" failed in a comparison inside, 1.5 at the first call (`set_num_threads`)."""
    with pytest.raises(TypeError, match=rf"^threads={threads!r} is a {type(threads).__name__}, not an int"):
        Translator.load(checkpoint, threads=threads)


def test_an_unavailable_mps_is_one_line_at_load(checkpoint, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^device='mps': Apple's MPS is not available on this machine"):
        Translator.load(checkpoint, device="mps")


def test_a_window_holds_a_bounded_number_of_lines_whatever_batch_tokens(words):
    """An endless input with the largest batch_tokens: 118,160 lines were read in 25 s and
    nothing came; the first result comes after at most WINDOW_LINES lines."""
    from transformer.decoding.stream import WINDOW_LINES

    translator = Translator.load(words, method="greedy", **SHORT)
    pulled = []

    def endless():
        for line in itertools.cycle(["Ciao", "Sì"]):
            pulled.append(line)
            yield line

    first = next(translator.translate_iterable(endless(), batch_tokens=MAX_BATCH_TOKENS))
    assert first == translator.translate(["Ciao"])[0]
    assert len(pulled) <= WINDOW_LINES
