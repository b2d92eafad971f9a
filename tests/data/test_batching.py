"""Token-based batches (transformer/data/batching.py): no batch over max_tokens and each pair
once, deterministic per seed and epoch, resumable mid-epoch, a compact plan, the greedy cut,
DDP shards without overlap, padding efficiency, collate's shift and padding, batches
gathered from Arrow buffers equal to collate's, and the length batches of decoding.

Moved verbatim from tests/data/test_pipeline.py and tests/commands/test_translate.py (#52)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer.data.batching import (
    BatchPlan,
    TokenBatchSampler,
    TokenIds,
    collate,
    cut_sorted,
    length_batches,
    padding_efficiency,
)
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def realistic_lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Tatoeba-like lengths: mostly short, a long tail, correlated sides."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.gamma(shape=3.0, scale=2.7, size=n).astype(int) + 1, 1, 128)
    tgt = np.clip(
        (src * rng.uniform(0.7, 1.4, size=n)).astype(int) + rng.integers(-1, 2, n), 1, 128
    )
    return src, tgt


def padded_cost(batch: list[int], src: np.ndarray, tgt: np.ndarray) -> int:
    """Padded tokens per side, as collate builds them (tgt gets BOS or EOS)."""
    return len(batch) * int(max(src[batch].max(), tgt[batch].max() + 1))


@pytest.fixture(scope="module")
def lengths() -> tuple[np.ndarray, np.ndarray]:
    return realistic_lengths(30_000)


def test_no_batch_exceeds_max_tokens_and_each_pair_once(lengths) -> None:
    src, tgt = lengths
    for max_tokens in (130, 1000, 4096):
        sampler = TokenBatchSampler(src, tgt, max_tokens, seed=3)
        for epoch in (0, 1):
            batches = sampler.batches(epoch)
            assert max(padded_cost(b, src, tgt) for b in batches) <= max_tokens
            flat = np.concatenate(batches)
            assert len(flat) == len(src) and (np.sort(flat) == np.arange(len(src))).all()


def test_batches_are_deterministic_per_seed_and_epoch(lengths) -> None:
    src, tgt = lengths
    a = TokenBatchSampler(src, tgt, 2048, seed=5)
    b = TokenBatchSampler(src, tgt, 2048, seed=5)
    assert a.batches(0) == b.batches(0) and a.batches(7) == b.batches(7)
    assert a.batches(0) != a.batches(1)
    assert a.batches(0) != TokenBatchSampler(src, tgt, 2048, seed=6).batches(0)


def test_resume_from_epoch_and_index_continues_identically(lengths) -> None:
    src, tgt = lengths
    full = list(TokenBatchSampler(src, tgt, 2048, seed=1).iter_from(epoch=2))
    resumed = TokenBatchSampler(src, tgt, 2048, seed=1)  # a fresh process after a restart
    resumed.set_epoch(2, start=17)
    assert len(resumed) == len(full) - 17
    assert list(resumed) == full[17:]
    assert list(resumed.iter_from(2, 17)) == full[17:]


def test_an_epochs_batch_plan_is_two_arrays_not_a_python_object_per_pair() -> None:
    """Memory that grows with the corpus: 8 bytes a pair for the plan of an epoch (with a
    list of lists it was about 70, 700 MB an epoch at 10M pairs), and the same batches
    as the greedy cut made one pair at a time."""
    src, tgt = realistic_lengths(100_000)
    sampler = TokenBatchSampler(src, tgt, 4096, seed=2, world_size=2, rank=1)
    plan = sampler.global_batches(0)
    assert isinstance(plan, BatchPlan) and plan.rows.dtype == np.int64
    assert plan.rows.nbytes + plan.bounds.nbytes < 100_000 * 8 * 1.05
    assert sampler.sizes.nbytes + sampler.src.nbytes + sampler.tgt.nbytes == 100_000 * 12
    for b in sampler.batches(0)[:50]:  # greedy: each batch is as full as the next pair allows
        assert isinstance(b, list) and padded_cost(b, src, tgt) <= 4096
    order = np.concatenate([sampler.global_batches(0)[i] for i in range(len(plan))])
    assert np.array_equal(order, plan.rows)
    lists = plan.tolist()
    assert BatchPlan.from_lists(lists) == plan and plan[3] == lists[3] and plan[-1] == lists[-1]
    assert plan[1::2].tolist() == lists[1::2] == sampler.batches(0).tolist()


def test_the_cut_is_greedy_on_sizes_sorted_by_length() -> None:
    sizes = np.array([2, 2, 3, 3, 3, 5, 9, 9, 10])
    # [2, 2, 3]: 3 * 3 = 9 <= 10, a fourth would cost 12; [3, 3]: 6; [5]: 10; [9]; [9]; [10]
    assert cut_sorted(sizes, 10).tolist() == [0, 3, 5, 6, 7, 8, 9]
    assert cut_sorted(np.array([7]), 7).tolist() == [0, 1]


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_shards_cover_the_epoch_without_overlap_in_equal_counts(lengths, world_size) -> None:
    src, tgt = lengths
    for max_tokens in (700, 4096):  # several batch counts, so the remainder varies
        shards = [
            TokenBatchSampler(src, tgt, max_tokens, seed=2, rank=r, world_size=world_size).batches(
                4
            )
            for r in range(world_size)
        ]
        assert len({len(s) for s in shards}) == 1
        flat = np.concatenate([np.concatenate(s) for s in shards])
        assert len(flat) == len(src) and len(np.unique(flat)) == len(src)
        assert max(padded_cost(b, src, tgt) for s in shards for b in s) <= max_tokens


def test_padding_efficiency_on_a_realistic_distribution(lengths) -> None:
    src, tgt = lengths
    bucketed = TokenBatchSampler(src, tgt, 4096, seed=0).batches(0)
    assert padding_efficiency(bucketed, src, tgt) >= 0.9
    # sorting inside about one batch's worth of examples is little better than no sorting
    barely = TokenBatchSampler(src, tgt, 4096, seed=0, bucket_chunk=1).batches(0)
    assert padding_efficiency(barely, src, tgt) < padding_efficiency(bucketed, src, tgt) - 0.1
    # a single batch of equal lengths has no padding but the one token collate adds
    assert padding_efficiency([[0, 1]], [4, 4], [3, 3]) == 1.0


def test_an_example_longer_than_max_tokens_is_an_error() -> None:
    with pytest.raises(ValueError, match="example 1 has 51 tokens"):
        TokenBatchSampler([3, 40, 5], [3, 50, 5], max_tokens=50)


def test_collate_shifts_pads_and_counts() -> None:
    examples = [{"src_ids": [5, 6, 7], "tgt_ids": [8]}, {"src_ids": [9], "tgt_ids": [10, 11, 12]}]
    batch = collate(examples, PAD_ID, BOS_ID, EOS_ID)
    assert batch.src_ids.tolist() == [[5, 6, 7], [9, 0, 0]]
    assert batch.tgt_in_ids.tolist() == [[2, 8, 0, 0], [2, 10, 11, 12]]
    assert batch.tgt_out_ids.tolist() == [[8, 3, 0, 0], [10, 11, 12, 3]]
    assert batch.src_ids.dtype == torch.long
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (4, 6)
    as_columns = {
        "src_ids": [e["src_ids"] for e in examples],
        "tgt_ids": [e["tgt_ids"] for e in examples],
    }
    same = collate(as_columns, PAD_ID, BOS_ID, EOS_ID).to("cpu")
    assert torch.equal(same.tgt_in_ids, batch.tgt_in_ids) and len(same) == 2


def random_pairs(n: int, seed: int = 0) -> dict[str, list[list[int]]]:
    rng = np.random.default_rng(seed)
    src, tgt = realistic_lengths(n, seed)
    return {"src_ids": [rng.integers(4, 300, k).tolist() for k in src],
            "tgt_ids": [rng.integers(4, 300, k).tolist() for k in tgt]}


@pytest.mark.parametrize("pad_to_multiple", [1, 8])
def test_batches_from_arrow_buffers_equal_collates(tmp_path, pad_to_multiple) -> None:
    """TokenIds over a saved (memory-mapped, many-chunk) dataset, and over a selection of
    it: any rows, in any order, collate as `collate` of the same rows' lists."""
    import datasets

    pairs = random_pairs(2_500)
    datasets.Dataset.from_dict(pairs).save_to_disk(str(tmp_path / "ds"), max_shard_size="40KB")
    dataset = datasets.load_from_disk(str(tmp_path / "ds"))
    assert dataset.data.column("src_ids").num_chunks > 1
    order = np.random.default_rng(1).permutation(len(dataset))[:1_000]
    for ds in (dataset, dataset.select(order)):
        ids = TokenIds(ds, vocab_size=300)
        assert len(ids) == len(ds)
        for lens, column in zip(ids.lengths(), ("src_ids", "tgt_ids")):
            assert lens.tolist() == [len(x) for x in ds[column]]
        rows = np.random.default_rng(2).choice(len(ds), 64, replace=False)
        got = ids.collate_rows(rows, PAD_ID, BOS_ID, EOS_ID, pad_to_multiple, vocab_size=300)
        want = collate(ds[rows.tolist()], PAD_ID, BOS_ID, EOS_ID, pad_to_multiple, vocab_size=300)
        for name in ("src_ids", "tgt_in_ids", "tgt_out_ids", "predict_index"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
            assert getattr(got, name).dtype == torch.long


def test_batches_from_arrow_buffers_refuse_ids_outside_the_vocabulary() -> None:
    import datasets

    ids = TokenIds(datasets.Dataset.from_dict({"src_ids": [[5, 400]], "tgt_ids": [[6]]}), vocab_size=1000)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ids.collate_rows(np.array([0]), PAD_ID, BOS_ID, EOS_ID, vocab_size=300)
    # ids past the narrow storage type (int16 for this vocabulary) are not wrapped into it
    wide = TokenIds(datasets.Dataset.from_dict({"src_ids": [[5]], "tgt_ids": [[65_536 + 6]]}),
                    vocab_size=300)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        wide.collate_rows(np.array([0]), PAD_ID, BOS_ID, EOS_ID, vocab_size=300)


def test_length_batches_respect_max_tokens_and_cover_every_line():
    lengths = [5, 1, 9, 3, 3, 7, 2, 20]
    batches = length_batches(lengths, max_tokens=10)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert len(b) * longest <= 10 or len(b) == 1
