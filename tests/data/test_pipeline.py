"""The data pipeline: every corpus kind, cleaning rules, errors, caching, prepared data
through a DataLoader, the configs and mt-prepare. (Batching itself:
tests/data/test_batching.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from huggingface_hub.utils import parse_hf_uri
from omegaconf import OmegaConf

from transformer.commands.prepare import format_statistics
from transformer.config import DataConfig, to_dataclass
from transformer.data import corpus
from transformer.data import pipeline as data_module
from transformer.data import tokenizer as tokenizer_module
from transformer.data.batching import (
    TokenBatchSampler,
    collate,
    token_lengths,
)
from transformer.data.corpus import (
    DataError,
    clean,
    hub_data_files,
    length_filter,
    normalize,
    read_lines,
    repair,
)
from transformer.data.pipeline import load_test_set, prepare_data
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.paths import PROJECT_ROOT

from helpers import compose_cfg, renamed_piece, tiny_checkpoint

SAMPLE = PROJECT_ROOT / "data" / "sample"


def sample_pairs(split: str = "train") -> tuple[list[str], list[str]]:
    return read_lines(SAMPLE / f"{split}.it"), read_lines(SAMPLE / f"{split}.en")


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def make_cfg(tmp_path: Path, **overrides) -> DataConfig:
    settings = {"cache_dir": str(tmp_path / "cache"), "spm_vocab_size": 120, "num_proc": 1}
    return DataConfig(**{**settings, **overrides})


def write_plain_pair(folder: Path, split: str, src: list[str], tgt: list[str]) -> tuple[Path, Path]:
    return write_lines(folder / f"{split}.it", src), write_lines(folder / f"{split}.en", tgt)


def check_encoded(prepared) -> None:
    """Columns and contents every prepared split must have."""
    for ds in (prepared.train, prepared.dev):
        assert set(ds.column_names) == {"src", "tgt", "src_ids", "tgt_ids"}
        row = ds[0]
        assert prepared.tokenizer.encode([row["src"]])[0] == row["src_ids"]
        assert prepared.tokenizer.encode([row["tgt"]])[0] == row["tgt_ids"]
        assert BOS_ID not in row["src_ids"] and EOS_ID not in row["tgt_ids"]


# --- corpus kinds --------------------------------------------------------------------


@pytest.fixture
def tatoeba_root(tmp_path: Path) -> Path:
    root = tmp_path / "shared"
    src, tgt = sample_pairs("train")
    write_plain_pair(root / "tatoeba", "train", src, tgt)
    write_plain_pair(root / "tatoeba", "dev", *sample_pairs("dev"))
    write_plain_pair(root / "eval", "tatoeba-test", src[:30], tgt[:30])
    write_plain_pair(root / "eval", "flores200-devtest", src[30:40], tgt[30:40])
    return root


def test_tatoeba_layout_and_named_test_sets(tmp_path, tatoeba_root) -> None:
    cfg = make_cfg(tmp_path, name="tatoeba", root=str(tatoeba_root))
    prepared = prepare_data(cfg)
    assert (len(prepared.train), len(prepared.dev)) == (400, 50)  # nothing to drop here
    check_encoded(prepared)
    src, ref = load_test_set("tatoeba-test", cfg)
    assert (src, ref) == tuple(x[:30] for x in sample_pairs("train"))
    assert len(load_test_set("flores200-devtest", cfg)[0]) == 10
    assert load_test_set("dev", cfg) == sample_pairs("dev")
    explicit = f"{tatoeba_root}/eval/tatoeba-test.it,{tatoeba_root}/eval/tatoeba-test.en"
    assert load_test_set(explicit, cfg) == (src, ref)
    with pytest.raises(DataError, match="nope"):
        load_test_set("nope", cfg)


def test_relative_root_resolves_against_the_project_not_the_cwd(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = make_cfg(
        tmp_path, name="sample", root="data"
    )  # eval sets would be in <project>/data/eval
    prepared = prepare_data(cfg)
    assert len(prepared.train) == 400
    with pytest.raises(DataError, match=str(PROJECT_ROOT / "data" / "eval")):
        load_test_set("tatoeba-test", cfg)


def test_sample_corpus_ships_with_the_repo(tmp_path) -> None:
    prepared = prepare_data(make_cfg(tmp_path, name="sample"))
    assert (len(prepared.train), len(prepared.dev)) == (400, 50)
    train_src = set(prepared.train["src"])
    assert not train_src & set(prepared.dev["src"])  # dev is held out
    check_encoded(prepared)


def test_files_plain_text_pair(tmp_path) -> None:
    src, tgt = sample_pairs("train")
    train = write_plain_pair(tmp_path / "corpus", "train", src, tgt)
    dev = write_plain_pair(tmp_path / "corpus", "dev", src[:7], tgt[:7])
    cfg = make_cfg(
        tmp_path, name="files", train_src=str(train[0]), train_tgt=str(train[1]),
        dev_src=str(dev[0]), dev_tgt=str(dev[1]),
    )  # fmt: skip
    prepared = prepare_data(cfg)
    assert prepared.train["src"] == src and prepared.train["tgt"] == tgt
    assert prepared.dev["src"] == src[:7]


def test_files_tsv_without_dev_holds_out_the_tail(tmp_path) -> None:
    src, tgt = sample_pairs("train")
    tsv = write_lines(tmp_path / "train.tsv", [f"{s}\t{t}" for s, t in zip(src, tgt)])
    prepared = prepare_data(make_cfg(tmp_path, name="files", train_src=str(tsv)))
    assert len(prepared.train) + len(prepared.dev) == len(src)
    assert prepared.dev["src"] == src[-len(prepared.dev) :]
    assert prepared.train["tgt"] == tgt[: len(prepared.train)]


def test_files_jsonl_both_record_shapes(tmp_path) -> None:
    src, tgt = sample_pairs("train")
    records = [
        {"it": s, "en": t} if i % 2 else {"translation": {"en": t, "it": s}}
        for i, (s, t) in enumerate(zip(src, tgt))
    ]
    jsonl = write_lines(
        tmp_path / "train.jsonl", [json.dumps(r, ensure_ascii=False) for r in records]
    )
    dev = write_lines(tmp_path / "dev.jsonl", [json.dumps(r) for r in records[:5]])
    cfg = make_cfg(tmp_path, name="files", train_src=str(jsonl), dev_src=str(dev))
    prepared = prepare_data(cfg)
    assert prepared.train["src"] == src and prepared.train["tgt"] == tgt
    assert prepared.dev["tgt"] == tgt[:5]


def write_hub_split(path: Path, src: list[str], tgt: list[str]) -> None:
    """A parquet shard in the hub's schema: translation = struct{en, it}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"en": t, "it": s} for s, t in zip(src, tgt)]
    pq.write_table(pa.table({"translation": rows}), path)


@pytest.mark.parametrize("name", ["iwslt2017", "opus100"])
def test_hub_corpora_from_a_local_parquet_mirror(tmp_path, name) -> None:
    src, tgt = sample_pairs("train")
    mirror = tmp_path / "mirror"
    splits = {"train": (src[:300], tgt[:300]), "validation": (src[300:340], tgt[300:340])}
    splits["test"] = (src[340:], tgt[340:])
    for split, (s, t) in splits.items():
        if name == "iwslt2017":  # the parquet conversion: <config>/<split>/<shard>.parquet
            write_hub_split(mirror / "iwslt2017-it-en" / split / "0000.parquet", s[::2], t[::2])
            write_hub_split(mirror / "iwslt2017-it-en" / split / "0001.parquet", s[1::2], t[1::2])
        else:  # OPUS-100's main branch: <config>/<split>-00000-of-00001.parquet
            write_hub_split(mirror / "en-it" / f"{split}-00000-of-00001.parquet", s, t)
    cfg = make_cfg(tmp_path, name=name, hub_local_dir=str(mirror))
    prepared = prepare_data(cfg)
    assert sorted(prepared.train["src"]) == sorted(src[:300])
    assert sorted(prepared.dev["tgt"]) == sorted(tgt[300:340])
    check_encoded(prepared)
    test_src, test_ref = load_test_set("test", cfg)
    assert sorted(zip(test_src, test_ref)) == sorted(zip(src[340:], tgt[340:]))
    assert prepare_data(cfg).from_cache


def test_remote_hub_corpora_are_cached_by_content(tmp_path, monkeypatch) -> None:
    """Files on the hub cannot be stat'ed: the cache key is the loaded text's digest."""
    mirror = tmp_path / "mirror"
    src, tgt = sample_pairs("train")
    write_hub_split(mirror / "en-it" / "train-00000-of-00001.parquet", src, tgt)
    write_hub_split(mirror / "en-it" / "validation-00000-of-00001.parquet", src[:9], tgt[:9])
    monkeypatch.setattr(corpus, "corpus_files", lambda cfg: None)  # as for hf:// paths
    cfg = make_cfg(tmp_path, name="opus100", hub_local_dir=str(mirror))
    assert not prepare_data(cfg).from_cache
    assert prepare_data(cfg).from_cache
    write_hub_split(mirror / "en-it" / "train-00000-of-00001.parquet", src[1:], tgt[1:])
    assert len(prepare_data(cfg).train) == len(src) - 1


def test_hub_paths_point_at_the_parquet_revision() -> None:
    iwslt = hub_data_files(DataConfig(name="iwslt2017"), "dev")
    assert (
        "hf://datasets/IWSLT/iwslt2017@refs%2Fconvert%2Fparquet/iwslt2017-it-en/validation/*.parquet"
        in iwslt
    )
    opus = hub_data_files(DataConfig(name="opus100"), "train")
    assert "hf://datasets/Helsinki-NLP/opus-100@main/en-it/train-*.parquet" in opus
    # and huggingface_hub reads the encoded revision back (no network involved)
    parsed = parse_hf_uri(iwslt[0])
    assert (parsed.id, parsed.revision) == ("IWSLT/iwslt2017", "refs/convert/parquet")
    assert parsed.path_in_repo == "iwslt2017-it-en/validation/*.parquet"


# --- compressed corpora --------------------------------------------------------------


def compress(path: Path, suffix: str) -> Path:
    opener = corpus.COMPRESSED[suffix]
    out = path.with_name(path.name + suffix)
    with opener(out, "wb") as f:
        f.write(path.read_bytes())
    path.unlink()
    return out


@pytest.mark.parametrize("suffix", [".gz", ".xz", ".bz2"])
def test_compressed_files_read_like_plain_ones(tmp_path, suffix) -> None:
    src, tgt = sample_pairs("train")
    train = [compress(p, suffix) for p in write_plain_pair(tmp_path / "c", "train", src, tgt)]
    cfg = make_cfg(tmp_path, name="files", train_src=str(train[0]), train_tgt=str(train[1]))
    prepared = prepare_data(cfg)
    assert len(prepared.train) + len(prepared.dev) == len(src)
    assert read_lines(train[0]) == src


def test_a_compressed_tsv_keeps_its_format(tmp_path) -> None:
    src, tgt = sample_pairs("train")
    tsv = compress(write_lines(tmp_path / "train.tsv", [f"{s}\t{t}" for s, t in zip(src, tgt)]), ".gz")
    assert corpus.text_format(tsv) == ".tsv"
    prepared = prepare_data(make_cfg(tmp_path, name="files", train_src=str(tsv)))
    assert prepared.train["tgt"] == tgt[: len(prepared.train)]


def test_a_truncated_or_corrupt_archive_is_one_error_naming_the_file(tmp_path) -> None:
    src, _ = sample_pairs("train")
    whole = compress(write_lines(tmp_path / "train.it", src * 20), ".gz")
    cut = tmp_path / "cut.it.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(DataError, match=rf"^{cut}: corrupt or truncated gz archive \(it breaks after line \d+"):
        read_lines(cut)
    garbage = tmp_path / "garbage.it.xz"
    garbage.write_bytes(b"this is not xz data at all")
    with pytest.raises(DataError, match=rf"^{garbage}: corrupt or truncated xz archive"):
        read_lines(garbage)
    bad_utf8 = tmp_path / "latin1.it"
    bad_utf8.write_bytes("uno\nperch\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.it.gz:2: not valid UTF-8"):
        read_lines(compress(bad_utf8, ".gz"))


def test_europarl_is_a_named_corpus_with_its_test_set(tmp_path) -> None:
    """data=europarl reads {root}/europarl/train.{it,en}.gz and dev.{it,en}."""
    root = tmp_path / "shared"
    src, tgt = sample_pairs("train")
    for p in write_plain_pair(root / "europarl", "train", src, tgt):
        compress(p, ".gz")
    write_plain_pair(root / "europarl", "dev", *sample_pairs("dev"))
    write_plain_pair(root / "eval", "europarl-test", src[:12], tgt[:12])
    cfg = make_cfg(tmp_path, name="europarl", root=str(root))
    prepared = prepare_data(cfg)
    assert len(prepared.train) == 400 and list(prepared.devs) == ["europarl"]
    assert load_test_set("europarl-test", cfg) == (src[:12], tgt[:12])
    assert load_test_set("dev", cfg) == sample_pairs("dev")
    assert prepare_data(cfg).from_cache


# --- cleaning ------------------------------------------------------------------------


def test_normalize_nfc_and_whitespace() -> None:
    decomposed = "Perche\u0301 e\u0300 cosi\u0300?"
    assert normalize(decomposed) == "Perché è così?"
    assert normalize("  Sì,\t è\u00a0 così. \r") == "Sì, è così."
    assert normalize(" \t ") == ""


def test_cleaning_joins_a_spaced_out_apostrophe_reference_and_nothing_else() -> None:
    """Europarl's Italian side writes some apostrophes as "& # x02BC;" between spaces."""
    src = ["Dell & # x02BC; intervento di quest & # x02BC; anno, l & # x02BC; 80%.",
           "L&#x2019;Europa", "AT&T e Procter & Gamble", "Un & # x010D; e x02BC;"]
    tgt = ["of this year's", "Europe", "AT&T and Procter & Gamble", "x"]
    cleaned, same = clean(src, tgt)
    assert cleaned == ["Dell'intervento di quest'anno, l'80%.", "L'Europa", *src[2:]]
    assert same == tgt
    assert repair("nothing to do") == "nothing to do"


def test_cleaning_drops_empty_and_long_pairs_and_counts_them(tmp_path) -> None:
    src, tgt = sample_pairs("train")
    src, tgt = list(src[:100]), list(tgt[:100])
    src[3], tgt[7] = "   ", "\t"  # empty after normalisation
    src[10] = " ".join(["Parola lunghissima"] * 60)  # too long on the source side
    src[20], tgt[20] = "Sì.", "Yes " * 20  # length ratio > 3, within max_len
    src[30] = "E\u0300   cosi\u0300."
    train = write_plain_pair(tmp_path / "c", "train", src, tgt)
    dev = write_plain_pair(tmp_path / "c", "dev", ["  Ciao   a tutti ", ""], ["Hi  all", "Hello"])
    cfg = make_cfg(
        tmp_path, name="files", train_src=str(train[0]), train_tgt=str(train[1]),
        dev_src=str(dev[0]), dev_tgt=str(dev[1]), max_len=48, max_len_ratio=3.0,
    )  # fmt: skip
    prepared = prepare_data(cfg)
    dropped = prepared.stats["dropped"]
    assert dropped["train"] == {"empty": 2, "too_long": 1, "length_ratio": 1}
    assert dropped["dev"] == {"empty": 1}
    assert len(prepared.train) == 96
    assert "È così." in prepared.train["src"]
    assert prepared.dev["src"] == ["Ciao a tutti"] and prepared.dev["tgt"] == ["Hi all"]
    lengths = np.stack(token_lengths(prepared.train))
    assert lengths.max() <= 48
    assert (lengths.max(0) <= 3 * np.maximum(1, lengths.min(0))).all()
    assert "too_long 1" in format_statistics(prepared.stats)


def test_length_filter_rules() -> None:
    src = [5, 200, 4, 1, 10, 100, 3]
    tgt = [6, 5, 13, 3, 31, 100, 9]
    keep, dropped = length_filter(src, tgt, max_len=100, max_len_ratio=3.0)
    # 1: too long (and a bad ratio: counted once, under the first rule); 2: 13 > 3 * 4;
    # 4: 31 > 3 * 10; 3, 5 and 6 sit exactly on the limits
    assert keep.tolist() == [0, 3, 5, 6]
    assert dropped == {"too_long": 1, "length_ratio": 2}


# --- errors --------------------------------------------------------------------------


def test_misaligned_files_name_both_files_and_counts(tmp_path) -> None:
    a = write_lines(tmp_path / "train.it", ["uno", "due", "tre"])
    b = write_lines(tmp_path / "train.en", ["one", "two"])
    cfg = make_cfg(tmp_path, name="files", train_src=str(a), train_tgt=str(b))
    with pytest.raises(DataError) as err:
        prepare_data(cfg)
    message = str(err.value)
    assert str(a) in message and str(b) in message and "3" in message and "2" in message


def test_undecodable_bytes_name_file_and_line(tmp_path) -> None:
    a = tmp_path / "train.it"
    a.write_bytes(b"uno\ndue\n" + b"tr\xe8\n")  # latin-1 è on line 3
    b = write_lines(tmp_path / "train.en", ["one", "two", "three"])
    cfg = make_cfg(tmp_path, name="files", train_src=str(a), train_tgt=str(b))
    with pytest.raises(DataError, match=rf"{a}:3\b"):
        prepare_data(cfg)


def test_corpus_empty_after_cleaning(tmp_path) -> None:
    a = write_lines(tmp_path / "train.it", ["", "  ", "ciao"])
    b = write_lines(tmp_path / "train.en", ["one", "", "\t"])
    cfg = make_cfg(
        tmp_path, name="files", train_src=str(a), train_tgt=str(b), dev_src=str(a), dev_tgt=str(b)
    )
    with pytest.raises(DataError, match=r"train split is empty.*train\.it"):
        prepare_data(cfg)


def test_corpus_empty_after_length_filter(tmp_path) -> None:
    cfg = make_cfg(tmp_path, name="sample", max_len=1)
    with pytest.raises(DataError, match=r"empty after the length filters.*train\.it"):
        prepare_data(cfg)


def test_bad_tsv_and_jsonl_lines_are_located(tmp_path) -> None:
    tsv = write_lines(tmp_path / "x.tsv", ["a\tb", "only one field"])
    with pytest.raises(DataError, match=rf"{tsv}:2: expected 2 tab-separated fields, found 1"):
        prepare_data(make_cfg(tmp_path, name="files", train_src=str(tsv)))
    jsonl = write_lines(tmp_path / "x.jsonl", ['{"it": "a", "en": "b"}', '{"it": "c"}'])
    with pytest.raises(DataError, match=rf"{jsonl}:2"):
        prepare_data(make_cfg(tmp_path, name="files", train_src=str(jsonl)))


def test_missing_file_and_unknown_corpus(tmp_path) -> None:
    with pytest.raises(DataError, match="nowhere"):
        prepare_data(make_cfg(tmp_path, name="tatoeba", root=str(tmp_path / "nowhere")))
    with pytest.raises(DataError, match="unknown corpus 'wmt'"):
        prepare_data(make_cfg(tmp_path, name="wmt"))


def test_a_training_corpus_that_is_a_stream_is_refused_saying_why(tmp_path) -> None:
    """A FIFO exists (it was "not found"); preparation reads a corpus more than once, which
    a stream does not allow: refused in one line that says so."""
    fifo = tmp_path / "train.it"
    os.mkfifo(fifo)
    tgt = write_lines(tmp_path / "train.en", ["Hi"])
    with pytest.raises(DataError, match=rf"^{fifo}: not a regular file \(a FIFO, .*\): preparation reads a "
                                        r"corpus more than once; give a file$"):
        prepare_data(make_cfg(tmp_path, name="files", train_src=str(fifo), train_tgt=str(tgt)))


# --- caching -------------------------------------------------------------------------


def test_a_new_cleaning_rule_rereads_the_files_and_keeps_the_data_it_does_not_change(tmp_path, monkeypatch) -> None:
    """The note from a file's path and mtime to its prepared data was made by a cleaning
    rule: after `corpus.CLEANING` changes, the files are read and cleaned again, and text
    the new rule leaves as it was finds its prepared data under the same key."""
    train = write_plain_pair(tmp_path / "c", "train", *sample_pairs("train"))
    dev = write_plain_pair(tmp_path / "c", "dev", *sample_pairs("dev"))
    cfg = make_cfg(tmp_path, name="files", train_src=str(train[0]), train_tgt=str(train[1]),
                   dev_src=str(dev[0]), dev_tgt=str(dev[1]))
    first = prepare_data(cfg)
    reads = []
    real_clean = corpus.clean
    monkeypatch.setattr(corpus, "clean", lambda *a: reads.append(1) or real_clean(*a))
    assert prepare_data(cfg).from_cache and not reads  # the note: the files are not read
    monkeypatch.setattr(corpus, "CLEANING", corpus.CLEANING + "-next")
    again = prepare_data(cfg)
    assert reads and again.from_cache and again.path == first.path


def test_second_run_reuses_everything_until_the_corpus_changes(tmp_path, monkeypatch) -> None:
    calls = []
    real_train = tokenizer_module.train_tokenizer
    monkeypatch.setattr(
        tokenizer_module, "train_tokenizer", lambda *a, **k: calls.append(1) or real_train(*a, **k)
    )
    src, tgt = sample_pairs("train")
    train = write_plain_pair(tmp_path / "c", "train", src, tgt)
    dev = write_plain_pair(tmp_path / "c", "dev", *sample_pairs("dev"))
    cfg = make_cfg(
        tmp_path, name="files", train_src=str(train[0]), train_tgt=str(train[1]),
        dev_src=str(dev[0]), dev_tgt=str(dev[1]),
    )  # fmt: skip
    first = prepare_data(cfg)
    second = prepare_data(cfg)
    assert not first.from_cache and second.from_cache and len(calls) == 1
    assert second.path == first.path and second.tokenizer.proto == first.tokenizer.proto
    assert second.train["src_ids"] == first.train["src_ids"]
    assert second.stats["splits"] == first.stats["splits"]

    # batching settings do not invalidate the cache
    rebatched = prepare_data(make_cfg(tmp_path, **{**cfg.__dict__, "max_tokens": 999}))
    assert rebatched.from_cache and rebatched.stats["batching"]["max_tokens"] == 999

    write_plain_pair(
        tmp_path / "c", "train", [*src[:-1], "Una frase nuova."], [*tgt[:-1], "A new sentence."]
    )
    third = prepare_data(cfg)
    assert not third.from_cache and len(calls) == 2 and third.path != first.path
    assert third.train["src"][-1] == "Una frase nuova."


def test_a_copied_or_touched_corpus_finds_its_cache_by_its_text(tmp_path, monkeypatch) -> None:
    """A new mtime or path (`touch`, a copy, data synced afresh) costs one read of the files,
    never a new vocabulary or encoding: the cache is keyed by the cleaned text, and unchanged
    files are matched to it by path, size and mtime without being read at all."""
    corpus_dir = tmp_path / "c"
    train = write_plain_pair(corpus_dir, "train", *sample_pairs("train"))
    dev = write_plain_pair(corpus_dir, "dev", *sample_pairs("dev"))

    def files_cfg(folder: Path) -> DataConfig:
        return make_cfg(
            tmp_path, name="files", train_src=str(folder / "train.it"),
            train_tgt=str(folder / "train.en"), dev_src=str(folder / "dev.it"),
            dev_tgt=str(folder / "dev.en"),
        )  # fmt: skip

    first = prepare_data(files_cfg(corpus_dir))
    assert not first.from_cache
    reads = []
    real_clean = data_module.clean_corpus
    monkeypatch.setattr(data_module, "clean_corpus", lambda cfg, *a: reads.append(cfg.name) or real_clean(cfg, *a))
    monkeypatch.setattr(data_module, "_build", lambda *a, **k: pytest.fail("prepared again"))

    assert prepare_data(files_cfg(corpus_dir)).from_cache and reads == []  # not even read

    st = train[0].stat()
    os.utime(train[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched
    touched = prepare_data(files_cfg(corpus_dir))
    assert touched.from_cache and touched.path == first.path and len(reads) == 1
    assert prepare_data(files_cfg(corpus_dir)).from_cache and len(reads) == 1  # noted

    copy = tmp_path / "copy"
    copy.mkdir()
    for path in (*train, *dev):
        copy.joinpath(path.name).write_bytes(path.read_bytes())
    copied = prepare_data(files_cfg(copy))
    assert copied.from_cache and copied.path == first.path and len(reads) == 2
    assert copied.train["src_ids"] == first.train["src_ids"]

    blank = tmp_path / "blank"  # one more pair, empty: the same text once cleaned
    write_plain_pair(blank, "train", [*sample_pairs("train")[0], ""], [*sample_pairs("train")[1], ""])
    write_plain_pair(blank, "dev", *sample_pairs("dev"))
    found = prepare_data(files_cfg(blank))
    assert found.from_cache and found.path == first.path and len(reads) == 3
    assert found.stats["raw_pairs"]["train"] == first.stats["raw_pairs"]["train"] + 1  # its own counts
    assert found.stats["dropped"]["train"]["empty"] == first.stats["dropped"]["train"]["empty"] + 1

    notes = list((tmp_path / "cache").glob("source-*"))
    assert len(notes) == 4  # the files as first written, touched, copied, with a blank line
    for note in notes:
        note.write_text("not a key\n")  # a damaged note: the files are read again
    assert prepare_data(files_cfg(copy)).from_cache and len(reads) == 4


def test_a_note_that_cannot_be_written_only_costs_a_read_next_time(tmp_path, monkeypatch, caplog) -> None:
    def full_disk(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(data_module, "atomic_write", full_disk)
    train = write_plain_pair(tmp_path / "c", "train", *sample_pairs("train"))
    cfg = make_cfg(tmp_path, name="files", train_src=str(train[0]), train_tgt=str(train[1]))
    first = prepare_data(cfg)
    assert not first.from_cache and "could not write" in caplog.text and "No space left" in caplog.text
    assert prepare_data(cfg).from_cache  # found by its text


# --- prepared data through a DataLoader ----------------------------------------------


def test_prepared_data_through_a_dataloader(tmp_path) -> None:
    prepared = prepare_data(make_cfg(tmp_path, name="sample"))
    tok = prepared.tokenizer
    sampler = TokenBatchSampler(*token_lengths(prepared.train), max_tokens=300, seed=1)
    loader = torch.utils.data.DataLoader(
        prepared.train,
        batch_sampler=sampler,
        collate_fn=lambda ex: collate(ex, tok.pad_id, tok.bos_id, tok.eos_id),
    )
    batches = list(loader)
    assert len(batches) == len(sampler)
    assert sum(len(b) for b in batches) == len(prepared.train)
    for b in batches:
        assert b.src_ids.numel() <= 300 and b.tgt_in_ids.numel() <= 300
        assert b.n_tgt_tokens == (b.tgt_in_ids != PAD_ID).sum()  # one BOS in, one EOS out
    b = batches[0]
    text = tok.decode(b.tgt_out_ids.tolist())
    assert set(text) <= set(prepared.train["tgt"])


# --- configs and the command ---------------------------------------------------------


@pytest.mark.parametrize("name", ["tatoeba", "europarl", "europarl_tatoeba", "iwslt2017", "opus100",
                                  "files", "sample"])
def test_data_configs_compose_and_validate(name) -> None:
    cfg = compose_cfg(f"data={name}", "++data.train_src=x.tsv", config="prepare")
    data = to_dataclass(DataConfig, cfg.data)
    assert data.name == (name if name != "europarl_tatoeba" else "mix")


def test_prepare_command_prints_statistics(tmp_path) -> None:
    cmd = [sys.executable, str(PROJECT_ROOT / "scripts" / "data" / "prepare_data.py"), "data=sample"]
    cmd.append(f"data.cache_dir={tmp_path / 'cache'}")
    env = {"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "train: 400 pairs" in out.stdout and "padding efficiency" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # Hydra left nothing behind


@pytest.mark.slow
def test_full_tatoeba_prepare(tmp_path) -> None:
    cfg = make_cfg(tmp_path, name="tatoeba", spm_vocab_size=8000, num_proc=2, max_tokens=4096)
    start = time.perf_counter()
    prepared = prepare_data(cfg)
    first = time.perf_counter() - start
    assert len(prepared.train) > 300_000
    assert prepared.stats["batching"]["padding_efficiency"] >= 0.9
    assert first < 300
    start = time.perf_counter()
    assert prepare_data(cfg).from_cache
    assert time.perf_counter() - start < 10


def test_relative_corpus_paths_resolve_against_the_working_directory(tmp_path):
    """From any directory, as every command-line tool; mt-train's saved config.yaml names
    the files absolutely, so it means the same from anywhere."""
    src, tgt = read_lines(SAMPLE / "train.it")[:60], read_lines(SAMPLE / "train.en")[:60]
    write_lines(tmp_path / "plain.it", src)
    write_lines(tmp_path / "tr.en", tgt)
    common = ["data=files", "data.train_src=plain.it", "data.train_tgt=tr.en", "data.spm_vocab_size=100",
              f"data.cache_dir={tmp_path / 'cache'}"]
    prep = subprocess.run([sys.executable, "-m", "transformer.commands.prepare", *common], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    train = subprocess.run(
        [sys.executable, "-m", "transformer.commands.train", *common, "debug=default", "trainer.max_steps=1",
         "trainer.progress=false", "trainer.run_dir=run"], cwd=tmp_path, capture_output=True, text=True,
        timeout=300)
    assert train.returncode == 0, train.stderr[-2000:]
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert saved.data.train_src == str(tmp_path / "plain.it")
    assert saved.data.train_tgt == str(tmp_path / "tr.en")
    missing = subprocess.run([sys.executable, "-m", "transformer.commands.prepare", "data=files",
                              "data.train_src=nowhere.it", "data.train_tgt=tr.en"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert missing.stderr.strip().splitlines()[-1] == (
        f"mt-prepare: error: corpus file not found: {tmp_path / 'nowhere.it'}")


@pytest.mark.parametrize("shard", ["train/data.arrow", "dev/sample/data.arrow"])
def test_a_changed_byte_in_a_cached_shard_is_found_when_the_cache_is_opened(tmp_path, shard) -> None:
    """A zeroed region trained silently; a bad dev id died in validation, its updates lost:
    each shard's SHA-256 in meta.json is checked when the cache is opened."""
    cfg = make_cfg(tmp_path, name="sample")
    path = prepare_data(cfg).path
    assert set(json.loads((path / "meta.json").read_text())["sha256"]) == {"train/data.arrow", "dev/sample/data.arrow",
                                                                         "stats.json"}
    data = bytearray((path / shard).read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)  # same size, same Arrow framing: only a checksum tells
    (path / shard).write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"^corrupt prepared-data cache {path}: {shard} is not what was "
                                        rf"written \(its SHA-256 differs from meta.json's\): delete {path}"):
        prepare_data(cfg)


def test_a_renamed_piece_in_the_cached_tokenizer_is_found_when_the_cache_is_opened(tmp_path) -> None:
    """A piece renamed in the cached spm-*.model still parses and would ship in every
    checkpoint, decoding an id as the new piece: its SHA-256 in meta.json is checked too."""
    cfg = make_cfg(tmp_path, name="sample")
    path = prepare_data(cfg).path
    meta = json.loads((path / "meta.json").read_text())
    spm = path.parent / meta["tokenizer"]
    assert meta["tokenizer_sha256"] == hashlib.sha256(spm.read_bytes()).hexdigest()
    spm.write_bytes(renamed_piece(spm.read_bytes())[0])
    with pytest.raises(DataError, match=rf"^corrupt cached tokenizer {spm}: it is not what was written \(its "
                                        rf"SHA-256 differs from the one {path}/meta.json records\): delete it and "
                                        rf"{path} to rebuild them$"):
        prepare_data(cfg)


def _damage(path: Path, file: str, change) -> None:
    """Change a JSON file of a cache folder by `change` (a function of its value), or write
    `change` (bytes) into it; a stats.json changed by value gets its checksum recorded, as
    a cache written without checksums would have it."""
    target = path / file
    if isinstance(change, bytes):
        target.write_bytes(change)
        return
    target.write_text(json.dumps(change(json.loads(target.read_text()))))
    if file == "stats.json":
        meta = json.loads((path / "meta.json").read_text())
        meta["sha256"]["stats.json"] = hashlib.sha256(target.read_bytes()).hexdigest()
        (path / "meta.json").write_text(json.dumps(meta))


DAMAGES = {
    "stats.json not JSON": ("stats.json", b"{not json", r"stats.json is not what was written"),
    "stats.json a list": ("stats.json", lambda s: [s], r"stats.json \(a JSON list, not an object\)"),
    "stats.json without splits": ("stats.json", lambda s: {**s, "splits": 3}, r"'splits' does not hold"),
    "stats.json missing": ("stats.json", None, r"stats.json is not what was written"),
    "meta.json not JSON": ("meta.json", b"\x00\x01", r"meta.json \("),
    "meta.json a list": ("meta.json", lambda m: [m], r"meta.json \(a JSON list, not an object\)"),
    "sha256 a list": ("meta.json", lambda m: {**m, "sha256": list(m["sha256"].values())},
                      r"meta.json \('sha256' is \['"),
    "sha256 without a shard": ("meta.json", lambda m: {**m, "sha256": {"stats.json": m["sha256"]["stats.json"]}},
                               r"not a SHA-256 per shard"),
    "sizes a string": ("meta.json", lambda m: {**m, "sizes": "400"}, r"'sizes' is '400'"),
    "a corpus named as a path": ("meta.json", lambda m: {**m, "corpora": ["../../x"]}, r"'corpora' is \['\.\./"),
    "the tokenizer named as a path": ("meta.json", lambda m: {**m, "tokenizer": "/etc/passwd"},
                                      r"'tokenizer' is '/etc/passwd', not the file name"),
    "tokenizer_sha256 a number": ("meta.json", lambda m: {**m, "tokenizer_sha256": 7}, r"'tokenizer_sha256' is 7"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_any_damaged_cache_file_is_one_line_naming_it_and_how_to_rebuild(tmp_path, damage) -> None:
    """What a cache folder holds beyond its shards (stats.json, meta.json's fields) is
    checked as it is opened: one DataError naming the file and how to rebuild, never a
    traceback in mt-prepare's statistics or in training."""
    cfg = make_cfg(tmp_path, name="sample")
    path = prepare_data(cfg).path
    file, change, why = DAMAGES[damage]
    if change is None:
        (path / file).unlink()
    else:
        _damage(path, file, change)
    with pytest.raises(DataError) as e:
        prepare_data(cfg)
    line = str(e.value)
    assert "\n" not in line and re.search(why, line), line
    assert line.startswith(f"corrupt prepared-data cache {path}") and line.endswith(f"delete {path} (and the "
                                                                                   "tokenizer it names) to rebuild it")


def test_a_damaged_cache_is_one_line_from_mt_prepare_and_mt_train(tmp_path, monkeypatch) -> None:
    from transformer.commands import prepare, train

    cache = tmp_path / "cache"
    monkeypatch.setattr(sys, "argv", ["mt-prepare", "data=sample", "data.spm_vocab_size=300",
                                      f"data.cache_dir={cache}"])
    prepare.main()
    (path,) = cache.glob("prepared-*")
    _damage(path, "meta.json", DAMAGES["sha256 a list"][1])
    for main, prog, extra in ((prepare.main, "mt-prepare", ["data.spm_vocab_size=300"]),
                              (train.main, "mt-train", ["debug=default", f"trainer.run_dir={tmp_path / 'run'}"])):
        monkeypatch.setattr(sys, "argv", [prog, "data=sample", f"data.cache_dir={cache}", *extra])
        with pytest.raises(SystemExit) as e:
            main()
        assert isinstance(e.value.code, str) and "\n" not in e.value.code
        assert e.value.code.startswith(f"{prog}: error: corrupt prepared-data cache {path}/meta.json ('sha256' is")
    assert not (tmp_path / "run").exists()  # refused before training: the run folder goes


def test_a_given_checkpoints_tokenizer_is_checked_and_its_cached_copy_kept_whole(tmp_path) -> None:
    """data.tokenizer=CHECKPOINT: its tokenizer.model is checked against the checkpoint's
    recorded SHA-256; the cache's copy of it (spm-given-*.model), if changed, is written
    again by the next preparation that uses it, as the folders prepared with it record."""
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    cfg = make_cfg(tmp_path, name="sample", tokenizer=str(ckpt))
    prepared = prepare_data(cfg)
    proto = (ckpt / "tokenizer.model").read_bytes()
    assert prepared.tokenizer.proto == proto
    (copy,) = (tmp_path / "cache").glob("spm-given-*.model")
    copy.write_bytes(renamed_piece(proto)[0])
    prepare_data(make_cfg(tmp_path, name="sample", tokenizer=str(ckpt), max_len=30))  # another folder: rewrites it
    assert copy.read_bytes() == proto and prepare_data(cfg).tokenizer.proto == proto
    (ckpt / "tokenizer.model").write_bytes(renamed_piece(proto)[0])
    with pytest.raises(DataError, match=rf"^data.tokenizer={ckpt}: {ckpt}/tokenizer.model is not the tokenizer this "
                                        r"checkpoint was written with \(its SHA-256 differs"):
        prepare_data(make_cfg(tmp_path, name="sample", tokenizer=str(ckpt), max_len=40))
