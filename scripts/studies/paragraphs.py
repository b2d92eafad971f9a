"""Paragraphs built from a sentence-aligned test set, for measuring document translation.

Consecutive lines of a dev or test set (Europarl's come from running sessions, FLORES's
from articles) are joined, 2 to 5 at a time, into paragraphs, as a user would paste them,
and their references are joined the same way. scripts/studies/eval_paragraphs.py scores a model
on them with sentence splitting on and off, beside the same sentences translated one by
one; scripts/studies/compare_splitters.py asks how often a splitter finds the joins again. A
module those two scripts share, not a script: the package's commands never build
paragraphs, so it lives beside the scripts that measure with them.

    groups = paragraph_groups(len(src), 2, 5, seed=0)     # [[0, 1, 2], [3, 4], ...]
    para_src = join_groups(src, groups)
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def paragraph_groups(n: int, min_size: int = 2, max_size: int = 5, seed: int = 0) -> list[list[int]]:
    """Consecutive line indices 0..n-1 cut into groups of min_size..max_size (sizes drawn
    uniformly with `seed`); the last group takes what is left (it may be shorter)."""
    if not 1 <= min_size <= max_size:
        raise ValueError(f"paragraph sizes {min_size}..{max_size}: need 1 <= min <= max")
    rng = random.Random(seed)
    groups: list[list[int]] = []
    start = 0
    while start < n:
        size = rng.randint(min_size, max_size)
        groups.append(list(range(start, min(start + size, n))))
        start += size
    return groups


def join_groups(lines: Sequence[str], groups: list[list[int]]) -> list[str]:
    """One line per group: its lines stripped and joined by single spaces."""
    return [" ".join(lines[i].strip() for i in group if lines[i].strip()) for group in groups]
