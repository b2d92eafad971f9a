"""transformer/data/augment.py: a batch's pairs get the changes drawn for them, each side as
it should (both sides cased, typos in the source only, merged pairs joined), within the
bounds (data.max_len a side, data.max_tokens a piece, every pair trained on once); the
draws are a function of (seed, epoch, row) alone; all probabilities 0 change nothing."""

from __future__ import annotations

import itertools
from collections import Counter

import datasets
import numpy as np
import pytest

from transformer.config import AugmentConfig, DataConfig
from transformer.data import augment, perturb
from transformer.data.augment import Augmenter, draw
from transformer.data.batching import TokenBatchSampler, TokenIds
from transformer.data.corpus import read_lines
from transformer.errors import ConfigError

from helpers import SAMPLE, sample_tokenizer

VOCAB = 300


@pytest.fixture(scope="module")
def corpus():
    tok = sample_tokenizer(VOCAB)
    src, tgt = read_lines(SAMPLE / "train.it"), read_lines(SAMPLE / "train.en")
    train = datasets.Dataset.from_dict({"src": src, "tgt": tgt, "src_ids": tok.encode(src),
                                        "tgt_ids": tok.encode(tgt)})
    return tok, train, TokenIds(train, tok.vocab_size)


def pairs_of(pieces) -> Counter:
    """The (source ids, target ids) pairs of a batch's pieces, without padding, BOS or EOS."""
    found: Counter = Counter()
    for b in pieces:
        for s, t in zip(b.src_ids.tolist(), b.tgt_out_ids.tolist(), strict=True):
            found[tuple(i for i in s if i != b.pad_id), tuple(t[:t.index(3)])] += 1
    return found


def expected(tok, train, rows, change) -> Counter:
    pairs = [change(train[int(r)]["src"], train[int(r)]["tgt"], int(r)) for r in rows]
    return Counter((tuple(tok.encode([s])[0]), tuple(tok.encode([t])[0])) for s, t in pairs)


ROWS = np.arange(40, 80)


def augmenter(corpus, max_len=128, max_tokens=4096, **probabilities) -> Augmenter:
    tok, train, _ = corpus
    return Augmenter(AugmentConfig(**probabilities), 1, train, tok, max_len, max_tokens)


def test_all_probabilities_zero_give_the_plain_batch(corpus):
    tok, _, ids = corpus
    assert not AugmentConfig().active
    (batch,) = augmenter(corpus).pieces(ids, ROWS, epoch=0)
    plain = ids.collate_rows(ROWS, tok.pad_id, tok.bos_id, tok.eos_id)
    assert all(getattr(batch, k).equal(getattr(plain, k)) for k in ("src_ids", "tgt_in_ids", "tgt_out_ids"))


@pytest.mark.parametrize("case", ["upper", "title"])
def test_upper_and_title_case_both_sides(corpus, case):
    tok, train, ids = corpus
    pieces = augmenter(corpus, **{case: 1.0}).pieces(ids, ROWS, epoch=0)
    fn = getattr(perturb, case)
    assert pairs_of(pieces) == expected(tok, train, ROWS, lambda s, t, r: (fn(s), fn(t)))


def test_with_subword_sampling_a_rows_change_is_its_pairs(corpus):
    """With data.subword_sampling's K segmentations a batch's row is `pair * K + j`: the
    change is drawn for, and made to, that pair's text."""
    tok, train, _ = corpus
    k = 3
    samples = datasets.Dataset.from_dict({"src_samples": [[ids] * k for ids in train["src_ids"]]})
    ids = TokenIds(train, tok.vocab_size, samples, k)
    rows = ROWS * k + ROWS % k  # each pair once, in one of its segmentations
    sampled = Augmenter(AugmentConfig(upper=1.0), 1, train, tok, 128, 4096, segmentations=k)
    pieces = sampled.pieces(ids, rows, epoch=0)
    assert pairs_of(pieces) == expected(tok, train, ROWS, lambda s, t, r: (perturb.upper(s), perturb.upper(t)))


def test_nopunct_drops_the_final_punctuation_of_both_sides(corpus):
    tok, train, ids = corpus
    pieces = augmenter(corpus, nopunct=1.0).pieces(ids, ROWS, epoch=0)
    assert pairs_of(pieces) == expected(tok, train, ROWS, lambda s, t, r: (perturb.nopunct(s), perturb.nopunct(t)))


def test_typos_change_the_sources_only(corpus):
    tok, train, ids = corpus
    pieces = augmenter(corpus, typos=1.0).pieces(ids, ROWS, epoch=0)
    found = pairs_of(pieces)
    clean = expected(tok, train, ROWS, lambda s, t, r: (s, t))
    assert Counter(t for _, t in found.elements()) == Counter(t for _, t in clean.elements())
    assert len(set(found) & set(clean)) < len(ROWS) // 4  # the sources did change
    drawn = draw(AugmentConfig(typos=1.0), 1, 0, ROWS)
    assert found == expected(tok, train, ROWS, lambda s, t, r: (
        perturb.typos(s, int(drawn.typo_seeds[r - ROWS[0]])), t))


def test_merge_joins_each_pair_with_another_of_its_batch(corpus):
    tok, train, ids = corpus
    drawn = draw(AugmentConfig(merge=1.0), 1, 0, ROWS)
    assert (drawn.partners != np.arange(len(ROWS))).all() and drawn.partners.max() < len(ROWS)
    pieces = augmenter(corpus, merge=1.0).pieces(ids, ROWS, epoch=0)

    def merged(s, t, r):
        other = train[int(ROWS[drawn.partners[r - ROWS[0]]])]
        return perturb.merge((s, t), (other["src"], other["tgt"]))

    assert pairs_of(pieces) == expected(tok, train, ROWS, merged)


def test_draws_follow_the_probabilities_and_depend_on_seed_epoch_and_row_only():
    rows = np.arange(20_000)
    cfg = AugmentConfig(upper=0.1, title=0.2, nopunct=0.3, typos=0.5, merge=0.05)
    d = draw(cfg, 1, 3, rows)
    for name in ("upper", "nopunct", "typos", "merge"):
        assert abs(d.changes[name].mean() - getattr(cfg, name)) < 0.015, name
    assert abs(d.changes["title"].mean() - 0.2 * 0.9) < 0.015  # upper wins where both are drawn
    again, shuffled = draw(cfg, 1, 3, rows), np.random.default_rng(0).permutation(rows)
    moved = draw(cfg, 1, 3, shuffled)
    for name, mask in d.changes.items():
        assert (again.changes[name] == mask).all()
        if name != "merge":  # a row's draw is its own, wherever its batch puts it
            assert (moved.changes[name] == mask[shuffled]).all()
    assert (moved.typo_seeds == d.typo_seeds[shuffled]).all()
    for other in (draw(cfg, 2, 3, rows), draw(cfg, 1, 4, rows)):  # another seed, another epoch
        assert (other.changes["typos"] != d.changes["typos"]).mean() > 0.4


def test_a_changed_pair_past_max_len_is_trained_on_unchanged(corpus):
    tok, train, ids = corpus
    lens = np.diff(ids.sides[0][1])[ROWS]
    max_len = int(np.max(np.maximum(lens, np.diff(ids.sides[1][1])[ROWS])))
    pieces = augmenter(corpus, max_len=max_len, upper=1.0).pieces(ids, ROWS, epoch=0)

    def within(s, t, r):
        up = (perturb.upper(s), perturb.upper(t))
        return up if max(len(x) for x in tok.encode(list(up))) <= max_len else (s, t)

    found = pairs_of(pieces)
    assert found == expected(tok, train, ROWS, within)
    assert max(max(len(s), len(t)) for s, t in found) <= max_len
    assert 0 < len(set(found) & set(expected(tok, train, ROWS, lambda s, t, r: (s, t)))) < len(ROWS)


def test_a_batch_that_outgrows_max_tokens_is_cut_into_pieces_within_it(corpus):
    _, _, ids = corpus
    src_lens, tgt_lens = ids.lengths()
    max_tokens = 256
    plan = TokenBatchSampler(src_lens, tgt_lens, max_tokens, seed=1).batches(0)
    cut = 0
    for i in range(len(plan)):
        rows = plan.rows_of(i)
        pieces = augmenter(corpus, max_tokens=max_tokens, upper=0.5, merge=0.2).pieces(ids, rows, epoch=0)
        assert sum(len(b) for b in pieces) == len(rows)  # every pair, once
        for b in pieces:
            assert len(b) * max(b.src_ids.shape[1], b.tgt_in_ids.shape[1]) <= max_tokens
        cut += len(pieces) > 1
    assert cut > 0


def test_a_pair_drawn_again_in_another_epoch_may_change_otherwise(corpus):
    _, _, ids = corpus
    a = augmenter(corpus, upper=0.5)
    assert pairs_of(a.pieces(ids, ROWS, epoch=0)) == pairs_of(a.pieces(ids, ROWS, epoch=0))
    assert pairs_of(a.pieces(ids, ROWS, epoch=0)) != pairs_of(a.pieces(ids, ROWS, epoch=1))


@pytest.mark.parametrize("key", ["upper", "typos", "merge"])
def test_a_probability_outside_0_1_is_refused_naming_its_key(key):
    with pytest.raises(ConfigError, match=rf"data\.augment\.{key}=1\.5: a probability must be in \[0, 1\]"):
        DataConfig(augment=AugmentConfig(**{key: 1.5})).validate()


def test_the_hash_is_spread_over_its_range():
    h = augment._uniform(0, 0, np.arange(10_000), 0)
    assert 0 <= h.min() < 0.01 and 0.99 < h.max() < 1


def piece_costs(src, tgt, bounds, piece_cost):
    return sum((hi - lo) * (src[lo:hi].max() + tgt[lo:hi].max()) + piece_cost for lo, hi in itertools.pairwise(bounds))


def fits(bounds, sizes, max_tokens) -> bool:
    return all((hi - lo) * sizes[lo:hi].max() <= max_tokens for lo, hi in itertools.pairwise(bounds))


def test_least_padding_finds_the_cheapest_cut_within_the_budget():
    """Against every cut at the allowed points of small random batches (brute force):
    within the budget, and no cheaper one exists."""
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(1, 10))
        src, tgt = rng.integers(1, 12, n), rng.integers(2, 12, n)  # some equal sizes
        order = np.argsort(np.maximum(src, tgt), kind="stable")
        src, tgt = src[order], tgt[order]
        max_tokens, piece_cost = int(rng.integers(12, 60)), int(rng.integers(0, 20))
        bounds = augment.least_padding(src, tgt, max_tokens, piece_cost)
        sizes = np.maximum(src, tgt)
        assert bounds[0] == 0 and bounds[-1] == n and fits(bounds, sizes, max_tokens)
        inner = augment.cut_points(sizes, max_tokens)[1:-1].tolist()
        every = [(0, *cut, n) for k in range(len(inner) + 1) for cut in itertools.combinations(inner, k)]
        cheapest = min(piece_costs(src, tgt, b, piece_cost) for b in every if fits(b, sizes, max_tokens))
        assert piece_costs(src, tgt, bounds, piece_cost) == cheapest


def test_cuts_fall_where_the_size_changes_or_the_budget_forces_them():
    sizes = np.array([2, 2, 2, 2, 2, 3, 3, 5])
    assert augment.cut_points(sizes, 6).tolist() == [0, 3, 5, 7, 8]  # 3 pairs of 2 fit in 6
    assert augment.cut_points(sizes, 100).tolist() == [0, 5, 7, 8]
