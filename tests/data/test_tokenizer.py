"""The joint SentencePiece tokenizer: special ids, round trips, serialization, caching."""

from __future__ import annotations

import hashlib
import pickle
import subprocess
import sys

import pytest

from transformer.data import perturb
from transformer.data import tokenizer as tokenizer_module
from transformer.data.corpus import normalize, read_lines
from transformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    load_or_train_tokenizer,
    train_tokenizer,
)
from transformer.paths import PROJECT_ROOT

SAMPLE = PROJECT_ROOT / "data" / "sample"
ACCENTED = ["Sì, è così.", "Perché no?", "È già mezzanotte.", "Però   la città è  lì.", "perché"]


def sample_sentences() -> list[str]:
    lines = read_lines(SAMPLE / "train.it") + read_lines(SAMPLE / "train.en")
    return [normalize(x) for x in lines] + ACCENTED


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(sample_sentences(), vocab_size=200)


def test_special_ids_are_fixed(tok: Tokenizer) -> None:
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tok.vocab_size == 200
    assert [tok.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]


def test_round_trip_on_accented_sentences(tok: Tokenizer) -> None:
    texts = [normalize(x) for x in ACCENTED + read_lines(SAMPLE / "dev.it")[:20]]
    ids = tok.encode(texts)
    assert all(BOS_ID not in x and EOS_ID not in x for x in ids)  # encode adds neither
    assert tok.decode(ids) == texts


def test_encode_line_is_encode_of_one_line(tok: Tokenizer) -> None:
    lines = sample_sentences()
    assert [tok.encode_line(x) for x in lines] == tok.encode(lines)
    assert [tok.encode_line(x.upper()) for x in ACCENTED] == tok.encode([x.upper() for x in ACCENTED])


def test_decode_stops_at_eos_and_skips_pad_and_bos(tok: Tokenizer) -> None:
    (x,) = tok.encode(["Sì, è così."])
    noisy = [BOS_ID, *x, EOS_ID, *tok.encode(["Ciao"])[0], PAD_ID, PAD_ID]
    assert tok.decode([noisy, [BOS_ID, *x, PAD_ID]]) == ["Sì, è così.", "Sì, è così."]


def test_pieces_match_ids(tok: Tokenizer) -> None:
    text = "Perché sei arrivato così tardi?"
    (ids,) = tok.encode([text])
    assert tok.pieces(text) == [tok.id_to_piece(i) for i in ids]


def test_piece_ids_invert_id_to_piece_and_name_a_foreign_piece(tok: Tokenizer) -> None:
    ids = tok.encode(["Ci vediamo martedì alle due."])[0]
    assert tok.piece_ids([tok.id_to_piece(i) for i in ids]) == ids
    assert tok.piece_ids([tok.id_to_piece(1)]) == [1]  # <unk> itself
    with pytest.raises(ValueError, match="'no such piece' is not a piece of this model's vocabulary"):
        tok.piece_ids(["no such piece"])
    for control in (tok.pad_id, tok.bos_id, tok.eos_id):  # no text holds them, no search writes them
        with pytest.raises(ValueError, match=f"^{tok.id_to_piece(control)!r} is a control symbol"):
            tok.piece_ids([tok.id_to_piece(ids[0]), tok.id_to_piece(control)])


def test_proto_save_load_and_pickle_reproduce_the_model(tok: Tokenizer, tmp_path) -> None:
    texts = [normalize(x) for x in read_lines(SAMPLE / "dev.en")]
    path = tmp_path / "spm.model"
    tok.save(path)
    for copy in (
        Tokenizer.from_proto(tok.proto),
        Tokenizer.load(path),
        pickle.loads(pickle.dumps(tok)),
    ):
        assert copy.encode(texts) == tok.encode(texts)
        assert copy.proto == tok.proto


def test_cache_reuses_until_the_corpus_changes(tmp_path, monkeypatch) -> None:
    calls = []
    real_train = tokenizer_module.train_tokenizer

    def counting_train(*args, **kwargs):
        calls.append(1)
        return real_train(*args, **kwargs)

    monkeypatch.setattr(tokenizer_module, "train_tokenizer", counting_train)
    sentences = sample_sentences()
    first, path1 = load_or_train_tokenizer(sentences, "digest-a", tmp_path, vocab_size=150)
    second, path2 = load_or_train_tokenizer(sentences, "digest-a", tmp_path, vocab_size=150)
    assert len(calls) == 1 and path1 == path2 and path1.exists()
    assert second.proto == first.proto

    _, path3 = load_or_train_tokenizer(sentences[:-50], "digest-b", tmp_path, vocab_size=150)
    _, path4 = load_or_train_tokenizer(sentences, "digest-a", tmp_path, vocab_size=120)
    assert len(calls) == 3  # a changed corpus and a changed setting both retrain
    assert len({path1, path3, path4}) == 3


def test_training_on_a_sample_is_reproducible_across_processes(tmp_path) -> None:
    """SentencePiece's own input sampling is not; the tokenizer samples the input itself."""
    script = (
        "import hashlib, sys\n"
        "from transformer.data.tokenizer import train_tokenizer\n"
        "lines = open(sys.argv[1], encoding='utf-8').read().splitlines()\n"
        "tok = train_tokenizer(lines, vocab_size=150, input_sentence_size=300)\n"
        "print(hashlib.sha256(tok.proto).hexdigest())\n"
    )
    env = {"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sample_sentences()) + "\n", encoding="utf-8")
    runs = [
        subprocess.run(
            [sys.executable, "-c", script, str(corpus)], env=env, capture_output=True, text=True
        )
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    here = train_tokenizer(sample_sentences(), vocab_size=150, input_sentence_size=300)
    assert runs[0].stdout.strip() == hashlib.sha256(here.proto).hexdigest()


# --- cased copies in the vocabulary's training text (data.spm_case_copies) -------------


def test_case_copies_follow_their_sentence_at_the_rate_asked() -> None:
    sentences = [f"frase numero {i}." for i in range(4000)]
    out = list(tokenizer_module.with_case_copies(sentences, 0.1, seed=3))
    assert out == list(tokenizer_module.with_case_copies(sentences, 0.1, seed=3))  # seeded
    assert [s for s in out if s.islower()] == sentences  # every original, in order
    uppers = sum(s == perturb.upper(s) and s not in sentences for s in out)
    titles = len(out) - len(sentences) - uppers
    for n in (uppers, titles):  # Binomial(4000, 0.1): mean 400, sd 19
        assert 300 < n < 500
    assert list(tokenizer_module.with_case_copies(sentences, 0.0)) == sentences
    assert list(tokenizer_module.with_case_copies(["ABC.", "123"], 0.99)) == ["ABC.", "123"]  # no equal copies


def test_case_copies_are_each_right_after_their_sentence() -> None:
    sentences = ["uno due.", "tre quattro.", "cinque sei."] * 200
    out = list(tokenizer_module.with_case_copies(sentences, 0.5, seed=0))
    current = None
    for s in out:
        if s in sentences:
            current = s
        else:
            assert s in (perturb.upper(current), perturb.title(current))


def test_case_copies_give_capitals_pieces_of_their_own(tmp_path) -> None:
    """Trained with cased copies, the vocabulary cuts upper-cased text into fewer pieces
    (without them, mostly single letters), and clean text hardly into more."""
    sentences = sample_sentences()
    plain, plain_path = load_or_train_tokenizer(sentences, "d", tmp_path, vocab_size=400)
    cased, cased_path = load_or_train_tokenizer(sentences, "d", tmp_path, vocab_size=400, case_copies=0.3)
    assert plain_path != cased_path  # its own cache key
    held_out = [normalize(x) for x in read_lines(SAMPLE / "dev.it")[:100]]

    def pieces(tok: Tokenizer, texts: list[str]) -> int:
        return sum(len(ids) for ids in tok.encode(texts))

    upper = [perturb.upper(x) for x in held_out]
    assert pieces(cased, upper) < 0.8 * pieces(plain, upper)
    assert pieces(cased, held_out) < 1.15 * pieces(plain, held_out)


def test_case_copies_leave_the_keys_of_vocabularies_without_them() -> None:
    settings = ("digest", 8000, "unigram", 1.0, 1_000_000)
    key = tokenizer_module.tokenizer_key(*settings)
    assert tokenizer_module.tokenizer_key(*settings, 0.0) == key
    assert tokenizer_module.tokenizer_key(*settings, 0.1) != key != tokenizer_module.tokenizer_key(*settings, 0.2)


def test_the_prepared_datas_key_holds_case_copies_only_when_on() -> None:
    from transformer.config import DataConfig
    from transformer.data.pipeline import _settings

    off = _settings(DataConfig())
    assert _settings(DataConfig(spm_case_copies=0.0)) == off and "spm_case_copies" not in off
    assert _settings(DataConfig(spm_case_copies=0.1)) not in (off, _settings(DataConfig(spm_case_copies=0.2)))
