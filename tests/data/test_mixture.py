"""Training on a weighted mix of corpora: proportions, determinism, resume, vocabulary, validation."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from transformer.config import DataConfig, PhaseConfig
from transformer.data.batching import TokenBatchSampler, token_lengths
from transformer.data.corpus import Pairs, read_lines
from transformer.data.mixture import CorpusMixture, epoch_counts, mix_sample
from transformer.data.pipeline import load_test_set, prepare_data
from transformer.paths import PROJECT_ROOT

from helpers import run, scalars

SAMPLE = PROJECT_ROOT / "data" / "sample"


def test_epoch_counts_follow_the_weights_and_sum_to_the_total():
    assert epoch_counts([300, 100], [1, 1]) == [200, 200]
    assert epoch_counts([300, 100], [3, 1]) == [300, 100]
    assert sum(epoch_counts([7, 5, 3], [0.2, 0.3, 0.5])) == 15
    assert epoch_counts([10, 10], [1, 2], total=7) == [2, 5]  # 2.33, 4.67: largest remainder


@pytest.mark.parametrize("weights", [(1.0, 1.0), (2.0, 1.0), (1.0, 4.0)])
def test_sampled_proportions_match_the_weights(weights):
    sizes = [6000, 1500]
    mix = CorpusMixture(sizes, list(weights), seed=3)
    for epoch in range(3):
        rows = mix.epoch_indices(epoch)
        share = np.bincount(mix.corpus_of(rows), minlength=2) / len(rows)
        expected = np.asarray(weights) / sum(weights)
        assert np.abs(share - expected).max() < 0.002  # exact up to rounding
        assert len(rows) == sum(sizes)


def test_a_corpus_is_used_whole_before_any_pair_repeats():
    mix = CorpusMixture([1000, 100], [1.0, 1.0], seed=0)  # the small one upsampled 5.5x
    small = np.concatenate([r[mix.corpus_of(r) == 1] - 1000 for r in (mix.epoch_indices(e) for e in range(2))])
    counts = np.bincount(small, minlength=100)
    assert counts.min() >= 10 and counts.max() <= 12  # 1,100 draws of 100 pairs: 11 each, +-1 at pass edges
    epochs = [r[mix.corpus_of(r) == 0] for r in (mix.epoch_indices(e) for e in range(2))]
    assert len(np.unique(epochs[0])) == len(epochs[0]) == 550  # downsampled: 0.55 of it per epoch
    counts = np.bincount(np.concatenate(epochs), minlength=1000)
    assert counts.min() == 1 and counts.max() == 2  # two epochs: every pair once, then 100 again


def test_the_mix_is_deterministic_per_seed_and_epoch():
    a, b = CorpusMixture([500, 200], [1, 1], seed=7), CorpusMixture([500, 200], [1, 1], seed=7)
    assert (a.epoch_indices(3) == b.epoch_indices(3)).all()
    assert not (a.epoch_indices(3) == a.epoch_indices(4)).all()
    assert not (a.epoch_indices(3) == CorpusMixture([500, 200], [1, 1], seed=8).epoch_indices(3)).all()


def test_batches_of_a_mix_resume_mid_epoch_identically():
    rng = np.random.default_rng(0)
    src = np.concatenate([rng.integers(3, 9, 3000), rng.integers(15, 40, 1000)])
    tgt = src + rng.integers(-2, 3, len(src))
    make = lambda: TokenBatchSampler(src, tgt, 1024, seed=5, mixture=CorpusMixture([3000, 1000], [1, 1], 5))  # noqa: E731
    full = list(make().iter_from(epoch=1))
    resumed = make()  # a fresh process after a restart
    resumed.set_epoch(1, start=9)
    assert list(resumed) == full[9:]
    flat = np.concatenate(full)
    assert len(flat) == 4000 and (flat >= 3000).mean() == pytest.approx(0.5, abs=0.001)


# A schedule: Tatoeba-like corpus 1 alone for two epochs, a phase turned off (0 epochs),
# one epoch at 1:1, then the mix's own 3:1, in virtual epochs of 400 pairs.
PHASES = [(2, [0.0, 1.0]), (0, [1.0, 0.0]), (1, [1.0, 1.0])]


def phased(seed: int = 4) -> CorpusMixture:
    return CorpusMixture([3000, 500], [3.0, 1.0], seed, PHASES, epoch_pairs=400)


def test_without_phases_each_corpus_continues_its_stream_epoch_after_epoch():
    mix = CorpusMixture([500, 200], [1, 1], seed=7)
    assert mix.counts(5) == [350, 350] and len(mix) == 700
    assert mix.stream_start(3) == [3 * 350, 3 * 350]  # what every run before phases drew


def test_each_epoch_draws_with_its_phases_weights():
    mix = phased()
    shares = []
    for epoch in range(6):
        rows = mix.epoch_indices(epoch)
        assert len(rows) == len(mix) == 400  # a virtual epoch, whatever the phase
        shares.append(np.bincount(mix.corpus_of(rows), minlength=2).tolist())
    assert shares == [[0, 400], [0, 400], [200, 200], [300, 100], [300, 100], [300, 100]]
    assert [mix.counts(e) for e in (1, 2, 3, 99)] == [[0, 400], [200, 200], [300, 100], [300, 100]]


def test_phases_consume_each_corpus_stream_without_gaps_or_repeats():
    """A corpus that draws nothing in a phase keeps its place: over epochs 0-5 corpus 0
    gives 0, 0, 200, 300, 300, 300 pairs, all different (3,000 pairs: no pass ends), and
    corpus 1 (500 pairs) repeats none before all were used once."""
    mix = phased()
    draws = [mix.epoch_indices(e) for e in range(6)]
    first = np.concatenate([d[mix.corpus_of(d) == 0] for d in draws])
    assert len(first) == 1100 and len(np.unique(first)) == 1100
    assert mix.stream_start(4) == [500, 1100] and mix.stream_start(1) == [0, 400]
    second = np.concatenate([d[mix.corpus_of(d) == 1] for d in draws[:2]]) - 3000  # 800 draws
    counts = np.bincount(second, minlength=500)
    assert counts.min() == 1 and counts.max() == 2


def test_a_phased_mix_is_the_same_from_any_process_and_resumes_mid_epoch_exactly():
    """Every DDP rank and a resumed run build their own mixture: the same epochs, and the
    same batches from any position, across the phase boundaries."""
    rng = np.random.default_rng(1)
    src = np.concatenate([rng.integers(15, 40, 3000), rng.integers(3, 9, 500)])
    tgt = src + rng.integers(-2, 3, len(src))
    make = lambda rank=0, world=1: TokenBatchSampler(  # noqa: E731
        src, tgt, 512, seed=4, rank=rank, world_size=world, mixture=phased())
    full = [list(make().iter_from(epoch)) for epoch in range(4)]
    for epoch in range(4):
        assert (phased().epoch_indices(epoch) == phased().epoch_indices(epoch)).all()
        resumed = make()  # a fresh process after a restart, mid-epoch
        resumed.set_epoch(epoch, start=3)
        assert list(resumed) == full[epoch][3:]
        ranks = [make(rank, 2) for rank in (0, 1)]
        plans = [r.global_batches(epoch) for r in ranks]
        assert (plans[0].rows == plans[1].rows).all() and (plans[0].bounds == plans[1].bounds).all()
    assert not (phased(seed=5).epoch_indices(2) == phased().epoch_indices(2)).all()


@pytest.mark.parametrize(("phases", "epoch_pairs", "message"), [
    ([(1, [0.0, 0.0])], None, "not all 0"),
    ([(-1, [1.0, 0.0])], None, "0 or more epochs"),
    ([(1, [1.0])], None, "one weight >= 0 per corpus"),
    ([], 0, "at least one pair"),
])
def test_a_bad_schedule_is_refused(phases, epoch_pairs, message):
    with pytest.raises(ValueError, match=message):
        CorpusMixture([10, 10], [1.0, 1.0], 0, phases, epoch_pairs)


def test_the_vocabulary_sample_is_balanced_by_the_weights():
    a = Pairs([f"a{i}" for i in range(1000)], [f"A{i}" for i in range(1000)], "a")
    b = Pairs([f"b{i}" for i in range(10)], [f"B{i}" for i in range(10)], "b")
    sample = mix_sample([a, b], [3.0, 1.0], n_sentences=400)
    assert len(sample) == 400
    from_b = sum(s[0] in "bB" for s in sample)
    assert from_b == 100  # a quarter, the 10 pairs of b repeated
    assert mix_sample([a, b], [3.0, 1.0], 400) == sample  # seeded


def write_pair(folder: Path, split: str, src: list[str], tgt: list[str], gz: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for lang, lines in (("it", src), ("en", tgt)):
        data = "".join(f"{line}\n" for line in lines).encode()
        if gz:
            (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / f"{split}.{lang}").write_bytes(data)


@pytest.fixture(scope="module")
def shared_root(tmp_path_factory) -> Path:
    """A small stand-in for ../shared/data: 'tatoeba' from the sample's first 300 pairs,
    'europarl' (gzipped, as the real one) from the sample's other 100, longer by design."""
    root = tmp_path_factory.mktemp("shared")
    src, tgt = read_lines(SAMPLE / "train.it"), read_lines(SAMPLE / "train.en")
    dev_src, dev_tgt = read_lines(SAMPLE / "dev.it"), read_lines(SAMPLE / "dev.en")
    write_pair(root / "tatoeba", "train", src[:300], tgt[:300])
    write_pair(root / "tatoeba", "dev", dev_src[:25], dev_tgt[:25])
    long_src = [f"{a} {b}" for a, b in zip(src[300:], src[301:] + src[:1])]
    long_tgt = [f"{a} {b}" for a, b in zip(tgt[300:], tgt[301:] + tgt[:1])]
    write_pair(root / "europarl", "train", long_src, long_tgt, gz=True)
    write_pair(root / "europarl", "dev", dev_src[25:], dev_tgt[25:])
    return root


def mix_cfg(root: Path, cache: Path, **overrides) -> DataConfig:
    settings = dict(name="mix", corpora={"tatoeba": 1.0, "europarl": 1.0}, root=str(root),
                    cache_dir=str(cache), spm_vocab_size=200, num_proc=1, max_tokens=512)
    return DataConfig(**{**settings, **overrides})


def test_a_mix_prepares_one_vocabulary_and_a_dev_set_per_corpus(shared_root, tmp_path):
    prepared = prepare_data(mix_cfg(shared_root, tmp_path))
    assert prepared.sizes == {"tatoeba": 300, "europarl": 100}
    assert len(prepared.train) == 400
    assert prepared.train["src"][300] == read_lines(SAMPLE / "train.it")[300] + " " + read_lines(SAMPLE / "train.it")[301]
    assert {k: len(v) for k, v in prepared.devs.items()} == {"tatoeba": 25, "europarl": 25}
    assert set(prepared.stats["splits"]) == {"train/tatoeba", "dev/tatoeba", "train/europarl", "dev/europarl"}
    assert prepared.weights == {"tatoeba": 1.0, "europarl": 1.0}
    mixture = prepared.mixture(seed=1)
    rows = mixture.epoch_indices(0)
    assert (mixture.corpus_of(rows) == 1).mean() == 0.5  # europarl upsampled to half the pairs
    assert 0 < prepared.stats["batching"]["padding_efficiency"] <= 1
    again = prepare_data(mix_cfg(shared_root, tmp_path))
    assert again.from_cache and again.sizes == prepared.sizes and list(again.devs) == ["tatoeba", "europarl"]
    reweighted = prepare_data(mix_cfg(shared_root, tmp_path, corpora={"tatoeba": 1.0, "europarl": 3.0}))
    assert not reweighted.from_cache  # the weights shape the vocabulary sample
    assert TokenBatchSampler(*token_lengths(prepared.train), 512, mixture=mixture).batches(0)
    first = [PhaseConfig(epochs=1, corpora={"tatoeba": 1.0})]
    phased = prepare_data(mix_cfg(shared_root, tmp_path, phases=first, epoch_pairs=50)).mixture(seed=1)
    assert [(phased.corpus_of(phased.epoch_indices(e)) == 1).sum() for e in (0, 1)] == [0, 25]
    with pytest.raises(Exception, match="ambiguous for a mix"):
        load_test_set("dev", mix_cfg(shared_root, tmp_path))


def mix_overrides(root: Path) -> list[str]:
    return ["data=europarl_tatoeba", f"data.root={root}", "data.spm_vocab_size=200", "data.max_tokens=512",
            "data.num_proc=1", "data.spm_input_sentence_size=1000", "trainer.val_bleu_sentences=10"]


def test_validation_reports_each_dev_set_and_selects_by_their_mean(shared_root, tmp_path):
    trainer = run(tmp_path / "run", *mix_overrides(shared_root), "trainer.max_steps=4", "trainer.val_every=2")
    run_dir = tmp_path / "run"
    for name in ("tatoeba", "europarl"):
        for metric in ("loss", "ppl", "bleu", "chrf"):
            assert [s for s, _ in scalars(run_dir, f"dev/{name}/{metric}")] == [2, 4]
    means = [(a + b) / 2 for (_, a), (_, b) in zip(scalars(run_dir, "dev/tatoeba/bleu"),
                                                   scalars(run_dir, "dev/europarl/bleu"), strict=True)]
    assert [v for _, v in scalars(run_dir, "dev/bleu")] == pytest.approx(means, abs=1e-4)
    assert trainer.state.best_bleu == pytest.approx(max(means), abs=1e-4)
    logged = (run_dir / "train.log").read_text()
    assert "step 4 dev tatoeba: loss" in logged and "step 4 dev europarl: loss" in logged
    assert "mean dev BLEU" in logged


@pytest.mark.parametrize("schedule", [[], ["data.epoch_pairs=120", "data.phases=[{epochs: 1, corpora: {tatoeba: 1}}]"]],
                         ids=["weights", "tatoeba-first-phase"])
def test_a_mixed_run_resumes_mid_epoch_with_the_same_losses(shared_root, tmp_path, schedule):
    """With a phase, 120-pair epochs of about 3 batches: the 6 updates cross from the
    Tatoeba-only epoch 0 into the mix, and the run is split inside epoch 1."""
    common = [*mix_overrides(shared_root), "trainer.log_every=1", "trainer.val_every=100",
              "trainer.resume=auto", *schedule]
    run(tmp_path / "straight", *common, "trainer.max_steps=6")
    run(tmp_path / "split", *common, "trainer.max_steps=3")
    run(tmp_path / "split", *common, "trainer.max_steps=6")
    assert scalars(tmp_path / "split", "train/loss") == scalars(tmp_path / "straight", "train/loss")
    if schedule:
        assert {v for _, v in scalars(tmp_path / "straight", "train/epoch")} == {0, 1}
