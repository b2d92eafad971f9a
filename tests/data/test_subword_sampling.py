"""Subword sampling (transformer/data/subword_sampling.py): each epoch takes another of the
segmentations preparation sampled for each training sentence; every one decodes to its
sentence; dev sets are never sampled; the draw is a function of the seed; batches hold at most data.max_tokens of the rows they take; a resume
continues exactly; off, nothing changes."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pytest

from transformer.commands.prepare import format_statistics
from transformer.config import ConfigError, DataConfig, SubwordSamplingConfig, to_dataclass
from transformer.data.batching import TokenBatchSampler, TokenIds
from transformer.data.epoch_resume import continue_epoch, resumed_position
from transformer.data.pipeline import _settings, prepare_data
from transformer.data.prepared_cache import META
from transformer.data.subword_sampling import SAMPLES

from helpers import run, scalars, shared_cache

K = 4
ON = SubwordSamplingConfig(alpha=0.1, nbest=64, segmentations=K)


def data_cfg(sampling: SubwordSamplingConfig, **overrides) -> DataConfig:
    settings = {"name": "sample", "cache_dir": str(shared_cache()), "spm_vocab_size": 300, "num_proc": 1}
    return DataConfig(**{**settings, "subword_sampling": sampling, **overrides})


@pytest.fixture(scope="module")
def off():
    return prepare_data(data_cfg(SubwordSamplingConfig()))


@pytest.fixture(scope="module")
def on():
    return prepare_data(data_cfg(ON))


def sampler(prepared, seed: int = 1, max_tokens: int = 200, **kw) -> TokenBatchSampler:
    ids = prepared.token_ids(prepared.tokenizer.vocab_size)
    return TokenBatchSampler(*ids.lengths(), max_tokens=max_tokens, seed=seed, segmentations=prepared.segmentations,
                             **kw)


def rows_by_pair(s: TokenBatchSampler, epoch: int) -> np.ndarray:
    """The row each pair takes at `epoch` (indexed by pair)."""
    rows = s.global_batches(epoch).rows
    out = np.empty(len(rows), dtype=np.int64)
    out[rows // K] = rows
    return out


def test_every_segmentation_decodes_to_its_sentence_and_the_target_stays_the_best(on):
    ids = on.token_ids(on.tokenizer.vocab_size)
    rows = np.arange(len(ids))
    assert len(ids) == K * len(on.train)
    flat, lens = ids.take(rows, 0)
    sources = on.tokenizer.decode(np.split(flat, np.cumsum(lens)[:-1]))
    assert sources == [src for src in on.train["src"] for _ in range(K)]
    flat, lens = ids.take(rows, 1)
    assert [s.tolist() for s in np.split(flat, np.cumsum(lens)[:-1])] == [
        t for t in on.train["tgt_ids"] for _ in range(K)]


def test_a_sentence_goes_through_all_its_segmentations_one_an_epoch(on):
    s = sampler(on)
    taken = np.stack([rows_by_pair(s, epoch) for epoch in range(K)])  # (epochs, pairs)
    assert (taken // K == np.arange(len(on.train))).all()  # each pair, once an epoch
    assert all(set(column) == set(range(K)) for column in (taken % K).T)
    ids = on.token_ids(on.tokenizer.vocab_size)
    first, second = (ids.take(taken[e], 0) for e in (0, 1))
    firsts = np.split(first[0], np.cumsum(first[1])[:-1])
    seconds = np.split(second[0], np.cumsum(second[1])[:-1])
    long = [i for i, ids in enumerate(on.train["src_ids"]) if len(ids) >= 5]
    differ = [i for i in long if not np.array_equal(firsts[i], seconds[i])]
    assert len(differ) > len(long) / 2  # a longer sentence is cut anew from one epoch to the next
    assert s.batches(K) == sampler(on).batches(K)  # and round again, as the seed draws it


def test_dev_sets_and_the_best_segmentation_are_never_sampled(on, off):
    for name, dev in on.devs.items():
        assert dev["src_ids"] == off.devs[name]["src_ids"] == on.tokenizer.encode(dev["src"])
        assert dev["tgt_ids"] == off.devs[name]["tgt_ids"]
    assert on.train["src_ids"] == off.train["src_ids"]
    assert on.samples.column_names == ["src_samples"]
    assert sorted(p.name for p in (on.path / "train").iterdir()) == ["data.arrow", SAMPLES]
    assert not (off.path / "train" / SAMPLES).exists()


def test_the_segmentations_an_epoch_takes_are_a_function_of_the_seed(on):
    again, other = sampler(on), sampler(on, seed=2)
    for epoch in range(3):
        assert sampler(on).batches(epoch) == again.batches(epoch)
    assert (rows_by_pair(sampler(on), 0) % K != rows_by_pair(other, 0) % K).any()


def test_every_batch_holds_at_most_max_tokens_of_the_segmentations_it_takes(on):
    s = sampler(on, max_tokens=96, pad_to_multiple=8)
    ids, tok = on.token_ids(on.tokenizer.vocab_size), on.tokenizer
    for epoch in range(3):
        plan = s.batches(epoch)
        for i in range(len(plan)):
            batch = ids.collate_rows(plan.rows_of(i), tok.pad_id, tok.bos_id, tok.eos_id, pad_to_multiple=8)
            assert batch.src_ids.numel() <= 96 and batch.tgt_in_ids.numel() <= 96


def test_sampled_targets_and_segmentations_within_max_len(off):
    max_len = int(np.percentile([len(ids) for ids in off.train["src_ids"]], 90))
    sampling = SubwordSamplingConfig(alpha=0.5, nbest=-1, segmentations=3, target=True)
    prepared = prepare_data(data_cfg(sampling, max_len=max_len, max_len_ratio=10.0))
    ids = prepared.token_ids(prepared.tokenizer.vocab_size)
    src, tgt = ids.lengths()
    assert len(src) == 3 * len(prepared.train) and max(src.max(), tgt.max()) <= max_len
    flat, lens = ids.take(np.arange(len(ids)), 1)
    targets = [t.tolist() for t in np.split(flat, np.cumsum(lens)[:-1])]
    assert prepared.tokenizer.decode(targets) == [t for t in prepared.train["tgt"] for _ in range(3)]
    best = [t for t in prepared.train["tgt_ids"] for _ in range(3)]
    assert any(a != b for a, b in zip(targets, best, strict=True))  # the targets are sampled too


def test_the_cache_key_holds_the_setting_and_off_leaves_it_as_it_was(on, off):
    assert on.path != off.path
    keys = {_settings(data_cfg(sampling), location=False) for sampling in (
        ON, SubwordSamplingConfig(alpha=0.2, nbest=64, segmentations=K), SubwordSamplingConfig(alpha=0.1, nbest=-1),
        SubwordSamplingConfig(alpha=0.1, segmentations=K + 1), SubwordSamplingConfig(alpha=0.1, target=True))}
    assert len(keys) == 5
    off_keys = {_settings(data_cfg(sampling)) for sampling in (
        SubwordSamplingConfig(), SubwordSamplingConfig(nbest=-1, segmentations=3, target=True))}
    assert len(off_keys) == 1 and "subword_sampling" not in off_keys.pop()
    assert "segmentations" not in json.loads((off.path / META).read_text())
    assert off.samples is None and off.segmentations == 1


def test_off_the_batches_are_the_pairs_own(off):
    """The sampler of K segmentations per pair draws the pairs as the plain sampler does:
    with every segmentation as long as the pair, its batches are the plain batches' pairs."""
    lengths = TokenIds(off.train, off.tokenizer.vocab_size).lengths()
    plain = TokenBatchSampler(*lengths, max_tokens=200, seed=1)
    assert sampler(off).batches(0) == plain.batches(0)
    repeated = TokenBatchSampler(*(np.repeat(x, K) for x in lengths), max_tokens=200, seed=1, segmentations=K)
    for epoch in range(2):
        a, b = repeated.batches(epoch), plain.batches(epoch)
        assert np.array_equal(a.bounds, b.bounds) and np.array_equal(a.rows // K, b.rows)


def test_a_resume_with_other_batching_sees_each_pair_once_in_its_epochs_segmentation(on):
    full = sampler(on).global_batches(0).rows
    first = sampler(on, max_tokens=200)
    half = len(first.batches(0)) // 2
    seen = Counter(first.batches(0)[:half].rows.tolist())
    second = sampler(on, max_tokens=120)
    index, parts = resumed_position(half, [], first.settings, second.settings)
    continue_epoch(second, 0, parts)
    seen.update(second.batches(0)[index:].rows.tolist())
    assert seen == Counter(full.tolist())


def test_a_sampled_run_resumes_with_the_same_losses(tmp_path):
    common = ["trainer.log_every=1", "trainer.val_every=100", "trainer.resume=auto", "data.max_tokens=1024",
              "data.subword_sampling.alpha=0.1", f"data.subword_sampling.segmentations={K}"]
    straight = run(tmp_path / "straight", *common, "trainer.max_steps=10")
    assert straight.state.epoch >= 1  # the runs cross an epoch: the segmentations change under them
    run(tmp_path / "split", *common, "trainer.max_steps=5")
    run(tmp_path / "split", *common, "trainer.max_steps=10")
    assert scalars(tmp_path / "split", "train/loss") == scalars(tmp_path / "straight", "train/loss")


@pytest.mark.parametrize(("key", "value", "rule"), [
    ("alpha", 1.5, "must be in [0, 1]"), ("nbest", 1, "must be >= 2, or -1"), ("nbest", 5000, "must be <= 1024"),
    ("segmentations", 1, "must be >= 2"), ("segmentations", 65, "must be <= 64")])
def test_a_bad_setting_is_refused_naming_its_key(key, value, rule):
    with pytest.raises(ConfigError, match=rf"^data\.subword_sampling\.{key}={value}.*{re.escape(rule)}"):
        to_dataclass(DataConfig, {"subword_sampling": {key: value}})


def test_mt_prepare_reports_the_lengths_training_sees(on, off):
    src, tgt = on.train_lengths()
    assert f"subword sampling: {K} segmentations of each training pair, mean len {src.mean():.2f}" in \
        format_statistics(on.stats)
    assert "subword sampling" not in format_statistics(off.stats)
    assert src.mean() > np.mean([len(ids) for ids in on.train["src_ids"]])  # sampled pieces are shorter
    assert np.array_equal(tgt, np.repeat([len(ids) for ids in on.train["tgt_ids"]], K))
