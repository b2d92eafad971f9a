"""Preparation streams: it holds a chunk of the corpus, never the corpus, and streaming
changes nothing in what it makes (digests, held-out tails, counts)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from transformer.config import DataConfig
from transformer.data import clean_split as cleaned
from transformer.data import corpus
from transformer.data.corpus import DataError, Digest, Pairs
from transformer.data.pipeline import prepare_data
from transformer.data.workers import Workers


def synthetic(n: int) -> tuple[list[str], list[str]]:
    """n distinct pairs of everyday length, with a few blank sides to drop."""
    src = [f"Questa è la frase numero {i}, detta {i % 7} volte." if i % 997 else " " for i in range(n)]
    tgt = [f"This is sentence number {i}, said {i % 7} times." for i in range(n)]
    return src, tgt


def write_pair(folder: Path, split: str, src: list[str], tgt: list[str]) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / f"{split}.it", folder / f"{split}.en"
    for path, lines in zip(paths, (src, tgt), strict=True):
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return paths


def test_the_content_digest_does_not_depend_on_the_chunks() -> None:
    src, tgt = synthetic(1000)
    whole = corpus.digest(Pairs(src, tgt, "x"))
    for size in (1, 7, 333, 1000):
        d = Digest()
        for i in range(0, len(src), size):
            d.update(src[i : i + size], tgt[i : i + size])
        assert d.hexdigest() == whole
    assert corpus.digest(Pairs(src[:-1], tgt[:-1], "x")) != whole
    swapped = corpus.digest(Pairs([*src[:-2], src[-1], src[-2]], tgt, "x"))
    assert swapped != whole  # order counts


@pytest.mark.parametrize("n, max_train_pairs", [(49, None), (150, None), (9_000, None), (9_000, 5_000),
                                                 (9_000, 8_950)])
def test_a_held_out_tail_streams_like_the_split_in_memory(tmp_path, monkeypatch, n, max_train_pairs) -> None:
    """`files` without a dev set: the last max(1, min(2000, n / 50)) pairs are dev (read
    through a window of at most 4,000 pairs), the first `max_train_pairs` of the rest train."""
    monkeypatch.setattr(cleaned, "CHUNK_PAIRS", 1_000)
    src, tgt = synthetic(n)
    a, b = write_pair(tmp_path / "c", "train", src, tgt)
    cfg = DataConfig(name="files", train_src=str(a), train_tgt=str(b), max_train_pairs=max_train_pairs)
    streamed = cleaned.clean_corpus(cfg, tmp_path, "", Workers(1))
    n_dev = max(1, min(2000, n // 50))
    expected = {"train": (src[: n - n_dev][:max_train_pairs], tgt[: n - n_dev][:max_train_pairs]),
                "dev": (src[n - n_dev :], tgt[n - n_dev :])}
    for split, (raw_src, raw_tgt) in expected.items():
        kept = corpus.clean(raw_src, raw_tgt)
        table = streamed[split].table()
        assert (table.column("src").to_pylist(), table.column("tgt").to_pylist()) == kept
        assert (streamed[split].raw, streamed[split].empty) == (len(raw_src), len(raw_src) - len(kept[0]))
        assert streamed[split].digest == corpus.digest(Pairs(*kept, "x"))
    assert corpus.load_split(cfg, "dev").src == expected["dev"][0]  # what test_set=dev evaluates


def test_bad_input_past_max_train_pairs_is_still_an_error(tmp_path) -> None:
    """A misaligned pair of files is refused even when only its first pairs are kept:
    one missing line early shifts every pair after it."""
    a, b = write_pair(tmp_path / "c", "train", ["uno", "due", "tre", "quattro"], ["one", "two", "three"])
    d = write_pair(tmp_path / "c", "dev", ["uno"], ["one"])
    cfg = DataConfig(name="files", train_src=str(a), train_tgt=str(b), dev_src=str(d[0]), dev_tgt=str(d[1]),
                     max_train_pairs=2, cache_dir=str(tmp_path / "cache"), spm_vocab_size=30)
    with pytest.raises(DataError, match=r"misaligned corpus: .* has 4 lines but .* has 3"):
        prepare_data(cfg)


def _python_peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_preparation_holds_a_chunk_of_the_corpus_not_the_corpus(tmp_path, monkeypatch) -> None:
    """What Python holds at its peak grows by under 100 bytes a pair: numpy arrays of
    lengths for the batching statistics (about 64 bytes a pair), never the text (a pair
    as two Python strings is over 200 bytes; the old in-memory pipeline held it 3 times)."""
    monkeypatch.setattr(cleaned, "CHUNK_PAIRS", 2_000)
    peaks = {}
    for n in (20_000, 80_000):
        src, tgt = synthetic(n)
        a, b = write_pair(tmp_path / str(n), "train", src, tgt)
        d = write_pair(tmp_path / str(n), "dev", src[:50], tgt[:50])
        del src, tgt
        cfg = DataConfig(name="files", train_src=str(a), train_tgt=str(b), dev_src=str(d[0]), dev_tgt=str(d[1]),
                         cache_dir=str(tmp_path / f"cache{n}"), spm_vocab_size=200, spm_input_sentence_size=4_000,
                         num_proc=1)
        peaks[n] = _python_peak(lambda cfg=cfg: prepare_data(cfg))
    assert (peaks[80_000] - peaks[20_000]) / 60_000 < 100, peaks


def test_two_worker_processes_make_the_same_cache_as_one(tmp_path, monkeypatch) -> None:
    """`data.num_proc=2` cleans and encodes the chunks in two processes: the same pairs,
    ids, counts and cache key as in this process alone."""
    monkeypatch.setattr(cleaned, "CHUNK_PAIRS", 2_500)
    src, tgt = synthetic(10_000)
    src[4321] = "parola " * 200  # dropped by the length filter
    a, b = write_pair(tmp_path / "c", "train", src, tgt)
    made = {}
    for n in (1, 2):
        cfg = DataConfig(name="files", train_src=str(a), train_tgt=str(b), cache_dir=str(tmp_path / f"cache{n}"),
                         spm_vocab_size=200, num_proc=n)
        made[n] = prepare_data(cfg)
    one, two = made[1], made[2]
    assert one.path.name == two.path.name  # the same content key
    assert one.stats["dropped"] == two.stats["dropped"] and one.stats["dropped"]["train"]["too_long"] == 1
    assert one.stats["dropped"]["train"]["empty"] == 10
    for split in ("train", "dev"):
        x, y = getattr(one, split), getattr(two, split)
        assert x.to_dict() == y.to_dict()
