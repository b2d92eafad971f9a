"""A resume with other batching settings continues the epoch with exactly the pairs it has
not seen (transformer/data/epoch_resume.py): for each setting that shapes the batches
(data.max_tokens, data.bucket_chunk, data.pad_to_multiple, trainer.seed, the number of
ranks), for chains of changes within one epoch, and for a mix of corpora (whose epoch
draws some pairs twice), every pair of the epoch is seen as often as the epoch draws it;
a new seed takes effect at the next epoch; other training data starts the epoch again."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from transformer.data.batching import TokenBatchSampler
from transformer.data.epoch_resume import changes, continue_epoch, resumed_position
from transformer.data.mixture import CorpusMixture

N = 3000
BASE = {"seed": 1, "max_tokens": 600, "bucket_chunk": 20, "pad_to_multiple": 1, "world_size": 1, "pairs": N}


@pytest.fixture(scope="module")
def lengths() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    src = rng.integers(1, 60, N)
    return src, np.clip(src + rng.integers(-5, 6, N), 1, None)


def sampler(lengths, settings: dict, mixture: CorpusMixture | None = None) -> TokenBatchSampler:
    return TokenBatchSampler(*lengths, settings["max_tokens"], seed=settings["seed"],
                             world_size=settings["world_size"], bucket_chunk=settings["bucket_chunk"],
                             pad_to_multiple=settings["pad_to_multiple"],
                             mixture=mixture.reseeded(settings["seed"]) if mixture else None)


def train_epoch(lengths, runs: list[tuple[dict, float]], epoch: int = 0,
                mixture: CorpusMixture | None = None) -> Counter:
    """The pairs of `epoch` a run sees when it trains a share of it under each batching of
    `runs` (settings, share of the batches left), resuming between them as a checkpoint
    resumes: each rank's batch index and the earlier batchings, nothing else."""
    seen: Counter = Counter()
    index, parts, saved = 0, [], None
    for settings, share in runs:
        s = sampler(lengths, settings, mixture)
        if saved is not None:
            index, parts = resumed_position(index, parts, saved, s.settings)
        continue_epoch(s, epoch, parts)
        plan, ws = s.global_batches(epoch), settings["world_size"]
        stop = len(plan) // ws if share >= 1 else index + int((len(plan) // ws - index) * share)
        for i in range(index * ws, stop * ws):  # every rank's batches of this stretch
            seen.update(plan.rows_of(i).tolist())
        index, saved = stop, s.settings
    return seen


def drawn(lengths, settings: dict, epoch: int = 0, mixture: CorpusMixture | None = None) -> Counter:
    return Counter(sampler(lengths, settings, mixture).global_batches(epoch).rows.tolist())


CHANGES = {"data.max_tokens": {"max_tokens": 300}, "data.max_tokens up": {"max_tokens": 1200},
           "data.bucket_chunk": {"bucket_chunk": 1}, "data.pad_to_multiple": {"pad_to_multiple": 8},
           "trainer.seed": {"seed": 7}, "ranks": {"world_size": 3}, "all at once": {
               "seed": 2, "max_tokens": 400, "bucket_chunk": 3, "pad_to_multiple": 4, "world_size": 2}}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_resume_with_another_batching_sees_every_pair_of_the_epoch_once(lengths, change):
    other = {**BASE, **CHANGES[change]}
    seen = train_epoch(lengths, [(BASE, 0.4), (other, 1.0)])
    assert seen == drawn(lengths, BASE)
    assert set(seen.values()) == {1} and len(seen) == N


def test_the_same_batching_resumes_exactly_where_it_stopped(lengths):
    """No change: the resumed run takes the very batches the run would have taken."""
    s = sampler(lengths, BASE)
    index, parts = resumed_position(7, [], s.settings, s.settings)
    assert (index, parts) == (7, [])
    continue_epoch(s, 0, parts)
    assert s.batches(0) == sampler(lengths, BASE).batches(0)


def test_several_changes_in_one_epoch_and_resumes_between_them(lengths):
    """Each change adds a part; a resume with unchanged settings inside a part rebuilds the
    same plan of the rest; still every pair once."""
    a, b, c = BASE, {**BASE, "max_tokens": 300, "world_size": 2}, {**BASE, "bucket_chunk": 2, "seed": 9}
    seen = train_epoch(lengths, [(a, 0.3), (b, 0.25), (b, 0.3), (c, 0.5), (a, 0.2), (a, 1.0)])
    assert seen == drawn(lengths, BASE) and set(seen.values()) == {1}


def test_a_change_at_an_epoch_boundary_batches_the_whole_epoch_anew(lengths):
    other = {**BASE, "max_tokens": 300, "seed": 7}
    s = sampler(lengths, other)
    index, parts = resumed_position(0, [], BASE, s.settings)
    assert (index, parts) == (0, [])  # nothing taken yet: the new settings, the new seed's order
    continue_epoch(s, 3, parts)
    assert s.batches(3) == sampler(lengths, other).batches(3)


def test_a_new_seed_mid_epoch_takes_effect_at_the_next_epoch(lengths):
    other = {**BASE, "seed": 7}
    s = sampler(lengths, other)
    index, parts = resumed_position(5, [], BASE, s.settings)
    assert index == 0 and parts == [{**BASE, "batches": 5}]
    continue_epoch(s, 0, parts)
    first = sampler(lengths, BASE).global_batches(0)
    rest = Counter(s.global_batches(0).rows.tolist())
    assert rest + Counter(first.rows[: first.bounds[5]].tolist()) == drawn(lengths, BASE)
    assert s.batches(1) == sampler(lengths, other).batches(1)  # epoch 1: seed 7's order


def test_a_mixed_epoch_that_draws_pairs_twice_resumes_with_what_it_has_not_drawn_yet(lengths):
    mixture = CorpusMixture([2500, 500], [1, 1], seed=1)  # corpus 2 upsampled: pairs twice in an epoch
    assert max(drawn(lengths, BASE, 2, mixture).values()) > 1
    other = {**BASE, "max_tokens": 300, "seed": 4}
    seen = train_epoch(lengths, [(BASE, 0.5), (other, 0.5), (other, 1.0)], epoch=2, mixture=mixture)
    assert seen == drawn(lengths, BASE, 2, mixture)


def test_a_resume_after_the_last_batch_of_an_epoch_goes_on_with_the_next(lengths):
    s = sampler(lengths, BASE)
    done = len(s.batches(0))
    other = sampler(lengths, {**BASE, "max_tokens": 300})
    index, parts = resumed_position(done, [], BASE, other.settings)
    continue_epoch(other, 0, parts)
    assert len(other.batches(0)) == 0 and list(other.iter_from(0, index)) == []
    assert other.batches(1) == sampler(lengths, {**BASE, "max_tokens": 300}).batches(1)


def test_other_training_data_has_no_plan_to_rebuild_and_starts_the_epoch_again(lengths):
    """The same tokenizer over other pairs (data.max_len changed): the saved plan cannot
    be rebuilt over them, so the epoch starts again rather than fail or guess."""
    fewer = tuple(side[:2000] for side in lengths)
    s = sampler(fewer, BASE)
    assert s.settings["pairs"] == 2000
    assert resumed_position(7, [{**BASE, "batches": 3}], BASE, s.settings) == (0, [])
    assert changes(BASE, s.settings) == [f"the training pairs {N} -> 2000"]
