"""Sentence splitting (transformer/data/sentences.py) and documents through the decoding path:
a paragraph translates as its sentences do, abbreviations do not split, long sentences
are cut, never silently truncated, and every input line gives one output line."""

from __future__ import annotations

import logging
import random
import sys
import zipfile
from pathlib import Path

import pytest

from transformer.commands import translate
from transformer.config import DecodeConfig, ModelConfig
from transformer.data.corpus import normalize
from transformer.data.sentences import fit, join_texts, segment, split_sentences
from transformer.decoding import text as decoding

from helpers import FAST, sample_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "studies"))
from paragraphs import join_groups, paragraph_groups  # scripts/ is not a package

THREE = ["Il gatto dorme sul divano.", "Domani piove?", "Ci vediamo martedì alle due!"]


@pytest.mark.parametrize("text", [
    "Il Sig. Rossi è arrivato con il Dott. Bianchi.",
    "Compro mele, pere ecc. al mercato.",
    "Porta della frutta, p. es. mele o pere.",
    "Il tasso è salito al 3.5 per cento, cioè a 1.000 euro.",
    "Secondo l'art. 3 del Trattato, il 12 dic. 2000 l'on. Prodi ha parlato.",
    "La Sig.ra Bianchi legge a pag. 12 del vol. 2.",
    "Non so... forse domani.",
])
def test_abbreviations_and_numbers_do_not_split(text):
    assert split_sentences(text) == [text]


def test_sentence_ends_split_and_quotes_stay_with_their_sentence():
    assert split_sentences(" ".join(THREE)) == THREE
    assert split_sentences('Disse: "Vengo domani." Poi uscì.') == ['Disse: "Vengo domani."', "Poi uscì."]
    assert split_sentences("Aspetta... Non andare via!") == ["Aspetta...", "Non andare via!"]
    assert split_sentences("  Il Sig. Rossi è qui.   Entri pure.  ") == ["Il Sig. Rossi è qui.", "Entri pure."]
    assert split_sentences("") == [] and split_sentences("   ") == []


def test_joined_paragraphs_split_back_into_their_lines():
    lines = ["Il Sig. Rossi è arrivato.", "Ha portato mele, pere ecc.", "Il Dott. Bianchi no.",
             "Che ore sono?", "Sono le 10.30!", "Vengo anch'io.", "Grazie."]
    groups = paragraph_groups(len(lines), 2, 3, seed=1)
    assert [i for g in groups for i in g] == list(range(len(lines)))
    assert all(2 <= len(g) <= 3 for g in groups[:-1])
    for group, paragraph in zip(groups, join_groups(lines, groups), strict=True):
        assert split_sentences(paragraph) == [lines[i] for i in group]


def test_a_line_of_three_sentences_translates_as_the_three_one_by_one(loaded):
    model, tokenizer = loaded
    cfg = DecodeConfig(**FAST)
    alone = decoding.translate_lines(model, tokenizer, THREE, cfg)
    assert all(alone)
    assert decoding.translate_lines(model, tokenizer, [" ".join(THREE)], cfg) == [join_texts(alone)]


def test_mt_translate_splits_by_default_and_says_how_many_sentences(checkpoint, loaded, monkeypatch,
                                                                     capsys):
    model, tokenizer = loaded
    text = f"{' '.join(THREE)}\n\nIl Sig. Rossi è qui."
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={checkpoint}", f"input.text='{text}'",
                                      "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=6"])
    translate.main()
    want = decoding.translate_lines(model, tokenizer, [*THREE, "Il Sig. Rossi è qui."], DecodeConfig(**FAST))
    out, err = capsys.readouterr()
    assert out.splitlines() == [join_texts(want[:3]), "", want[3]]
    assert "mt-translate: INFO: translated 3 line(s), 4 sentence(s) in" in err


def test_one_output_line_per_input_line_always(loaded):
    model, tokenizer = loaded
    rng = random.Random(0)
    pieces = ["", "   ", "Ciao.", "Il Sig. Rossi?", "Sì!", "p. es. 3.5", "...", "Ecco: uno, due, tre.",
              " ".join(["Ci vediamo martedì, alle due"] * 8)]  # one sentence past max_positions
    lines = [" ".join(rng.choice(pieces) for _ in range(rng.randint(0, 4))) for _ in range(40)]
    for split in (True, False):
        cfg = DecodeConfig(**FAST, split_sentences=split, max_tokens=40)
        out = decoding.translate_lines(model, tokenizer, lines, cfg)
        assert len(out) == len(lines)
        assert all((o == "") == (normalize(line) == "") for o, line in zip(out, lines, strict=True))
        assert all("\n" not in o for o in out)
    nbest = decoding.translate_nbest(model, tokenizer, lines[:12], DecodeConfig(
        method="beam", beam_size=3, nbest=2, max_len_a=0, max_len_b=4))
    assert len(nbest) == 12 and all(1 <= len(h) <= 2 for h in nbest)


def test_a_sentence_too_long_for_the_model_is_cut_at_clauses_never_truncated(loaded, caplog):
    model, tokenizer = loaded
    clauses = ["Ci vediamo martedì", "alle due", "davanti alla stazione", "se non piove"] * 4
    sentence = ", ".join(clauses) + "."
    limit = model.cfg.max_positions
    assert len(tokenizer.encode([sentence])[0]) > limit
    pieces, truncated = fit(sentence, tokenizer, limit)
    assert not truncated and len(pieces) > 1
    assert all(len(p) <= limit for p in pieces)
    assert join_texts(tokenizer.decode(pieces)) == sentence  # nothing lost, nothing reordered
    assert all(text.endswith((",", ".")) for text in tokenizer.decode(pieces))  # cut after a clause
    with caplog.at_level(logging.WARNING):
        out = decoding.translate_lines(model, tokenizer, [sentence], DecodeConfig(**FAST))
    assert "1 input line(s) hold a sentence longer than the model's limit of 32 tokens" in caplog.text
    assert out == [join_texts(decoding.translate_lines(model, tokenizer, tokenizer.decode(pieces),
                                                       DecodeConfig(**FAST, split_sentences=False)))]


def test_without_clauses_a_long_sentence_is_cut_at_words_and_only_a_giant_word_truncated():
    tokenizer = sample_tokenizer()
    words = " ".join(["gatto"] * 50)
    pieces, truncated = fit(words, tokenizer, 16)
    assert not truncated and all(len(p) <= 16 for p in pieces)
    assert join_texts(tokenizer.decode(pieces)) == words
    giant = "x" * 80  # one word of 80 single-letter pieces
    pieces, truncated = fit(giant, tokenizer, 16)
    assert truncated and [len(p) for p in pieces] == [16]
    segs = segment([words, "", giant], tokenizer, 16)
    assert segs.cut == [0, 2] and segs.truncated == [2] and segs.sentences == 2
    assert segs.rejoin(["a"] * len(segs.ids), " ".join, "-") == [" ".join(["a"] * (len(segs.ids) - 1)), "-", "a"]


PARAGRAPH = ("Il Sig. Rossi è arrivato con il Dott. Bianchi. Porta frutta, p. es. mele, pere ecc. "
             "al mercato! Il tasso è salito al 3.5 per cento? Secondo l'art. 3 sì.")


def test_the_argos_package_splits_and_translates_a_paragraph_as_mt_translate_does(
        tmp_path, monkeypatch, capsys):
    """The server's path without a server: the package's spaCy pipeline loaded as Argos
    loads it, then its CTranslate2 model with Argos's settings (greedy: ARGOS_BEAM_SIZE=1),
    against mt-translate on the plain export of the same checkpoint, greedy."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    spacy = pytest.importorskip("spacy")
    spm = pytest.importorskip("sentencepiece")
    from transformer.checkpoint import save_checkpoint
    from transformer.commands.export import export
    from transformer.deploy import argos
    from transformer.deploy.ct2_export import ExportConfig
    from transformer.model.transformer import build_model

    from helpers import end_sentences

    tokenizer = sample_tokenizer()
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)  # a seed whose sentences end before the length limit
    model = build_model(ModelConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, d_ff=64,
                                    n_encoder_layers=2, n_decoder_layers=2, max_positions=300,
                                    dropout=0.0, attn_dropout=0.0, ffn_dropout=0.0)).eval()
    with torch.no_grad():  # weights away from their initial values, as in test_export.py
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    end_sentences(model, 0.1)  # a model that ends its sentences, as a trained one does
    ckpt = save_checkpoint(tmp_path / "ckpt", model, tokenizer, "", {})
    package = export(ExportConfig(checkpoint=str(ckpt), output=str(tmp_path / "m.argosmodel"),
                                  format="argos"))
    with zipfile.ZipFile(package) as z:
        z.extractall(tmp_path / "unpacked")
    root = tmp_path / "unpacked" / "m"
    nlp = spacy.load(root / "spacy", exclude=["parser"])
    nlp.add_pipe("sentencizer")
    sentences = [s.text for s in nlp(PARAGRAPH).sents]
    assert sentences == split_sentences(PARAGRAPH) and len(sentences) == 4
    translator = ctranslate2.Translator(str(root / "model"), compute_type="default")
    sp = spm.SentencePieceProcessor(model_file=str(root / "sentencepiece.model"))
    theirs = argos.argos_translate(translator, sp, sentences, beam_size=1)

    ct2 = export(ExportConfig(checkpoint=str(ckpt), output=str(tmp_path / "ct2")))
    (tmp_path / "in.it").write_text(PARAGRAPH + "\n", encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={ct2}", f"input.file={tmp_path / 'in.it'}",
                                      "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=256",
                                      "progress=false"])
    translate.main()
    ours = capsys.readouterr().out.splitlines()
    assert len(theirs.split()) > 4 and ours == [theirs]
