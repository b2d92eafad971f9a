"""Resuming an epoch under other batching settings: the pairs it has not seen yet, once each.

A checkpoint records where training stands in an epoch as the batches it took of the
epoch's plan (`TrainState.batch_index`) and the settings that made that plan (the
sampler's `settings`: seed, data.max_tokens, data.bucket_chunk, the resolved
data.pad_to_multiple, the ranks). A resume with the same settings continues at the next
batch. A resume with others, mid-epoch, cannot use that index (it would point into other
batches and skip or repeat pairs), so the epoch's earlier plan is rebuilt from what was
recorded, the pairs its first batches held are taken out of the epoch's order, and the
rest are batched with the new settings (`continue_epoch`). The earlier batchings of the
epoch are kept in the state (`parts`, one per change, each with the global batches it
took), so that a second change in the same epoch rebuilds the chain again.

A new `trainer.seed` draws another order: mid-epoch it takes effect at the next epoch,
and the current epoch goes on in the order its own seed drew (`parts[0]`'s). Training
data with another number of pairs (data.max_len changed, say, the tokenizer kept) has
no earlier plan to rebuild: the epoch starts again from its first batch.
"""

from __future__ import annotations

import numpy as np

from transformer.data.batching import SRC_EXTRA, TGT_EXTRA, TokenBatchSampler

SETTINGS = ("seed", "max_tokens", "bucket_chunk", "pad_to_multiple", "world_size", "pairs")
# the keys a user changes, for messages
KEYS = {"seed": "trainer.seed", "max_tokens": "data.max_tokens", "bucket_chunk": "data.bucket_chunk",
        "pad_to_multiple": "data.pad_to_multiple", "world_size": "the number of processes",
        "pairs": "the training pairs"}


def resumed_position(batch_index: int, parts: list[dict], saved: dict, now: dict) -> tuple[int, list[dict]]:
    """Where a resumed run continues its epoch: (batch_index, parts) for batching `now`.

    Args:
        batch_index: the batches each rank of the saved run took of the epoch's plan.
        parts: the earlier batchings of the saved epoch (each a `settings` dict with
            `batches`: the global batches it took).
        saved: the settings the saved run batched with (a checkpoint that recorded only
            some of them ran with the others as `now`).
        now: this run's settings.

    Returns:
        The same position when nothing changed or the saved batching took nothing yet;
        batch 0 and no parts when the training data changed (`data_changed`); else
        batch 0 of a plan of the unseen pairs, the saved batching one more part.
    """
    saved = {**now, **{k: v for k, v in saved.items() if k in SETTINGS}}
    if data_changed(saved, now):
        return 0, []
    if saved == now or batch_index == 0:
        return batch_index, parts
    return 0, [*parts, {**saved, "batches": batch_index * saved["world_size"]}]


def data_changed(saved: dict, now: dict) -> bool:
    """Whether the epoch's earlier plan cannot be rebuilt: the data has other pairs."""
    return saved.get("pairs", now["pairs"]) != now["pairs"]


def changes(saved: dict, now: dict) -> list[str]:
    """The settings that differ, as `key old -> new`."""
    return [f"{KEYS[k]} {saved[k]} -> {now[k]}" for k in SETTINGS if k in saved and saved[k] != now[k]]


def unseen_order(sampler: TokenBatchSampler, epoch: int, parts: list[dict]) -> tuple[np.ndarray, int]:
    """The rows of `epoch` that its earlier batchings `parts` did not take, in the epoch's
    order, and the seed that drew that order (the first part's)."""
    seed = parts[0]["seed"]
    order, rng = sampler.epoch_order(epoch, seed)
    src, tgt = sampler.src - SRC_EXTRA, sampler.tgt - TGT_EXTRA  # the lengths it was given
    for i, part in enumerate(parts):
        earlier = TokenBatchSampler(
            src, tgt, part["max_tokens"], seed=seed, shuffle=sampler.shuffle, world_size=part["world_size"],
            bucket_chunk=part["bucket_chunk"], pad_to_multiple=part["pad_to_multiple"])
        plan = earlier.plan_positions(order, rng if i == 0 else np.random.default_rng([seed, epoch, i]))
        taken = plan.rows[: plan.bounds[min(part["batches"], len(plan))]]
        keep = np.ones(len(order), dtype=bool)
        keep[taken] = False
        order = order[keep]
    return order, seed


def continue_epoch(sampler: TokenBatchSampler, epoch: int, parts: list[dict]) -> int:
    """Make `sampler`'s `epoch` the pairs `parts` left unseen (nothing to do without parts);
    returns how many they are."""
    if not parts:
        return len(sampler.batches(epoch).rows)
    order, seed = unseen_order(sampler, epoch, parts)
    sampler.continue_epoch(epoch, order, [seed, epoch, len(parts)])
    return len(order)
