"""A folder of the prepared-data cache: what it holds, its checksums, and opening it.

`{cache_dir}/prepared-<key>/` holds `train/data.arrow` (every corpus's pairs, in the order
of meta.json's `corpora`), with subword sampling `train/samples.arrow` (their sampled
segmentations, meta.json's `segmentations` of each: `subword_sampling.py`),
`dev/<corpus>/data.arrow`, `stats.json` (what `mt-prepare` prints) and `meta.json`, which names the tokenizer (`{cache_dir}/spm-*.model`, shared by
the folders prepared with it) and records the SHA-256 of every other file: each shard and
stats.json (`sha256`), and the tokenizer (`tokenizer_sha256`). `open_prepared` checks them
all before anything reads the data, so a changed byte anywhere (a piece of the tokenizer
renamed, a number in a shard) is one line naming the file and how to rebuild it, never a
model trained on it silently; so is a meta.json or stats.json that does not hold what it
should (not JSON, a field of another type, a name that is not a plain file name). A folder
whose meta.json records no checksums is opened unchecked.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np

from transformer.data.batching import TokenIds, token_lengths
from transformer.data.corpus import DataError
from transformer.data.encode_split import ARROW
from transformer.data.mixture import CorpusMixture
from transformer.data.subword_sampling import SAMPLES, SIDES, expanded_lengths
from transformer.data.tokenizer import Tokenizer

META, STATS = "meta.json", "stats.json"
_HEX = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")  # a corpus: a folder name, never a path
_TOKENIZER = re.compile(r"spm-[A-Za-z0-9_.-]+\.model")
# each split's figures in stats.json, and their types
_SPLIT_FIGURES = {"pairs": int, "src_tokens": int, "tgt_tokens": int, "src_mean_len": (int, float),
                  "tgt_mean_len": (int, float), "src_max_len": int, "tgt_max_len": int}


@dataclass
class PreparedData:
    """What training needs: the tokenizer and the encoded splits.

    `train` and every dev set have columns `src`, `tgt` (normalised text: dev keeps it for
    BLEU) and `src_ids`, `tgt_ids` (list[int], no BOS/EOS). With several corpora
    (`data.name=mix`), `train` holds their pairs one corpus after the other, in the order
    of `sizes`, and `devs` has one dev set per corpus. With subword sampling, `samples`
    holds `segmentations` sampled segmentations of each training pair (columns
    `src_samples`, and `tgt_samples` if the targets are sampled), row-aligned with `train`.
    """

    tokenizer: Tokenizer
    train: datasets.Dataset
    devs: dict[str, datasets.Dataset]
    sizes: dict[str, int]  # training pairs per corpus, in the order `train` holds them
    weights: dict[str, float] | None = None  # a mix's weights (share of an epoch's pairs)
    stats: dict = field(default_factory=dict)  # see `prepare.format_statistics`
    path: Path | None = None  # the cache folder it was saved to / loaded from
    from_cache: bool = False
    # a mix's schedule (data.phases: epochs and weights of the first epochs; data.epoch_pairs),
    # set from the settings, not the cache: it shapes the draws, not the data
    phases: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    epoch_pairs: int | None = None
    samples: datasets.Dataset | None = None
    segmentations: int = 1  # rows training batches per pair: its sampled segmentations, or 1

    def token_ids(self, vocab_size: int) -> TokenIds:
        """The training rows' ids as training batches them: the pairs, or with subword
        sampling every segmentation of every pair (`TokenIds`)."""
        return TokenIds(self.train, vocab_size, self.samples, self.segmentations)

    def train_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Source and target length of each training row, as `token_ids` holds the rows."""
        src, tgt = token_lengths(self.train)
        if self.samples is None:
            return src, tgt
        table = self.samples.with_format("arrow")[:]
        lengths = [expanded_lengths(table, f"{side}_samples") if f"{side}_samples" in table.column_names
                   else np.repeat(best, self.segmentations) for side, best in zip(SIDES, (src, tgt), strict=True)]
        return lengths[0], lengths[1]

    @property
    def dev(self) -> datasets.Dataset:
        """The first dev set (the only one of a single corpus)."""
        return next(iter(self.devs.values()))

    def mixture(self, seed: int) -> CorpusMixture | None:
        """How epochs draw from the corpora of a mix (None for a single corpus)."""
        if self.weights is None:
            return None
        phases = [(epochs, [weights.get(c, 0.0) for c in self.sizes]) for epochs, weights in self.phases]
        return CorpusMixture(list(self.sizes.values()), [self.weights[c] for c in self.sizes], seed,
                             phases, self.epoch_pairs)


def shards(names: list[str], sampled: bool = False) -> list[str]:
    """The folder's Arrow files, relative to it (`sampled`: with the sampled segmentations)."""
    return [f"train/{ARROW}", *([f"train/{SAMPLES}"] if sampled else []), *(f"dev/{name}/{ARROW}" for name in names)]


def sha256(path: Path) -> str:
    """A file's SHA-256 (a shard's cost on the Europarl recipe's cache: docs/results/memory.md)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_meta(folder: Path, tokenizer_file: Path, settings: str, sizes: dict[str, int],
               weights: list[float] | None, stats: dict, segmentations: int = 1) -> None:
    """stats.json and meta.json, with the checksums of every file the folder's data needs
    (`segmentations` > 1: the training pairs' sampled segmentations are one of them)."""
    (folder / STATS).write_text(json.dumps(stats, indent=1))
    files = [*shards(list(sizes), segmentations > 1), STATS]
    meta = {"tokenizer": tokenizer_file.name, "settings": settings, "corpora": list(sizes),
            "sizes": list(sizes.values()), "weights": weights,
            "sha256": {f: sha256(folder / f) for f in files}, "tokenizer_sha256": sha256(tokenizer_file)}
    if segmentations > 1:  # absent without sampling: such a folder's meta.json is as it was
        meta["segmentations"] = segmentations
    (folder / META).write_text(json.dumps(meta))


def open_prepared(path: Path) -> PreparedData | None:
    """The prepared data in cache folder `path`, memory-mapped; None if there is none (no
    meta.json). Every file is checked first: a damaged one raises a DataError that names
    it and how to rebuild it."""
    meta_file = path / META
    if not meta_file.is_file():
        return None
    rebuild = f"delete {path} (and the tokenizer it names) to rebuild it"
    meta = _read_meta(meta_file, rebuild)
    names, sizes, weights = meta["corpora"], meta["sizes"], meta["weights"]
    segmentations = meta.get("segmentations", 1)
    tokenizer = _tokenizer(path, meta)
    digests = meta.get("sha256") or {}  # none recorded: opened unchecked
    for shard in shards(names, segmentations > 1):
        if shard in digests and _digest(path / shard) != digests[shard]:
            raise DataError(f"corrupt prepared-data cache {path}: {shard} is not what was written "
                            f"(its SHA-256 differs from {META}'s): {rebuild}")
    try:
        train = datasets.Dataset.from_file(str(path / "train" / ARROW))
        devs = {n: datasets.Dataset.from_file(str(path / "dev" / n / ARROW)) for n in names}
        samples = datasets.Dataset.from_file(str(path / "train" / SAMPLES)) if segmentations > 1 else None
    except Exception as e:
        raise DataError(f"corrupt prepared-data cache {path} ({' '.join(str(e).split())}): "
                        f"{rebuild}") from None
    if len(train) != sum(sizes) or (samples is not None and len(samples) != sum(sizes)):
        found = f"{len(train)} training pairs" + (f", {len(samples)} sampled" if samples is not None else "")
        raise DataError(f"corrupt prepared-data cache {path} ({found}, {META} says {sum(sizes)}): {rebuild}")
    stats = _read_stats(path / STATS, digests.get(STATS), rebuild)
    return PreparedData(tokenizer, train, devs, dict(zip(names, sizes, strict=True)),
                        dict(zip(names, weights, strict=True)) if weights else None,
                        stats, path, from_cache=True, samples=samples, segmentations=segmentations)


def _digest(path: Path) -> str | None:
    try:
        return sha256(path)
    except OSError:
        return None  # missing or unreadable: not what was written


def _read_json(path: Path, fault, rebuild: str) -> dict:
    """A cache's JSON file, its content checked by `fault` (what is wrong, or None);
    DataError naming the file and what is wrong."""
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"corrupt prepared-data cache {path} ({' '.join(str(e).split())}): "
                        f"{rebuild}") from None
    why = fault(content)
    if why:
        raise DataError(f"corrupt prepared-data cache {path} ({why}): {rebuild}")
    return content


def _read_meta(meta_file: Path, rebuild: str) -> dict:
    """meta.json, its fields checked; DataError naming it and what is wrong."""
    return _read_json(meta_file, _meta_fault, rebuild)


def _meta_fault(meta: object) -> str | None:
    """What is wrong with a meta.json's content; None if nothing."""
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    for key in ("tokenizer", "corpora", "sizes", "weights"):
        if key not in meta:
            return f"no {key!r}"
    names, sizes, weights = meta["corpora"], meta["sizes"], meta["weights"]
    if not isinstance(meta["tokenizer"], str) or not _TOKENIZER.fullmatch(meta["tokenizer"]):
        return f"'tokenizer' is {meta['tokenizer']!r}, not the file name of a cached tokenizer"
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and _NAME.fullmatch(n) for n in names):
        return f"'corpora' is {names!r}, not a list of corpus names"
    if not _numbers(sizes, int, len(names)) or min(sizes) < 0:
        return f"'sizes' is {sizes!r}, not a count of pairs per corpus"
    if weights is not None and (not _numbers(weights, (int, float), len(names)) or min(weights) <= 0):
        return f"'weights' is {weights!r}, not null or a positive weight per corpus"
    segmentations = meta.get("segmentations", 1)
    if not isinstance(segmentations, int) or isinstance(segmentations, bool) or segmentations < 1:
        return f"'segmentations' is {_short(segmentations)}, not a count of segmentations per pair"
    digests = meta.get("sha256")
    files = {*shards(names, segmentations > 1), STATS}
    if digests is not None and (not isinstance(digests, dict)
                                or not set(shards(names, segmentations > 1)) <= set(digests)
                                or not set(digests) <= files
                                or not all(isinstance(d, str) and _HEX.fullmatch(d) for d in digests.values())):
        return f"'sha256' is {_short(digests)}, not a SHA-256 per shard"
    found = meta.get("tokenizer_sha256")
    if found is not None and not (isinstance(found, str) and _HEX.fullmatch(found)):
        return f"'tokenizer_sha256' is {_short(found)}, not a SHA-256"
    return None


def _numbers(value: object, kind: type | tuple[type, ...], n: int) -> bool:
    return isinstance(value, list) and len(value) == n and all(
        isinstance(v, kind) and not isinstance(v, bool) for v in value)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _tokenizer(path: Path, meta: dict) -> Tokenizer:
    """The tokenizer meta.json names, checked against the SHA-256 it records."""
    spm_file = path.parent / meta["tokenizer"]
    again = f"delete it and {path} to rebuild them"
    try:
        proto = spm_file.read_bytes()
    except OSError as e:
        raise DataError(f"the cached tokenizer {spm_file} that {path / META} names cannot be read "
                        f"({e.strerror or e}): delete {path} to rebuild it") from None
    recorded = meta.get("tokenizer_sha256")
    if recorded is not None and hashlib.sha256(proto).hexdigest() != recorded:
        raise DataError(f"corrupt cached tokenizer {spm_file}: it is not what was written (its "
                        f"SHA-256 differs from the one {path / META} records): {again}")
    try:
        return Tokenizer.from_proto(proto)
    except Exception as e:
        raise DataError(f"corrupt cached tokenizer {spm_file} ({' '.join(str(e).split())}): "
                        f"{again}") from None


def _read_stats(stats_file: Path, recorded: str | None, rebuild: str) -> dict:
    """stats.json, checked against its recorded SHA-256 and for the figures it holds."""
    if recorded is not None and _digest(stats_file) != recorded:
        raise DataError(f"corrupt prepared-data cache {stats_file.parent}: {STATS} is not what was "
                        f"written (its SHA-256 differs from {META}'s): {rebuild}")
    return _read_json(stats_file, _stats_fault, rebuild)


def _stats_fault(stats: object) -> str | None:
    """What is wrong with a stats.json's content; None if nothing."""
    if not isinstance(stats, dict):
        return f"a JSON {type(stats).__name__}, not an object"
    if not isinstance(stats.get("vocab_size"), int):
        return "no vocabulary size"
    splits = stats.get("splits")
    if not isinstance(splits, dict) or not all(
            isinstance(s, dict) and all(isinstance(s.get(k), t) for k, t in _SPLIT_FIGURES.items())
            for s in splits.values()):
        return "'splits' does not hold each split's figures"
    raw, dropped = stats.get("raw_pairs", {}), stats.get("dropped", {})
    if not isinstance(raw, dict) or not all(isinstance(v, int) for v in raw.values()):
        return "'raw_pairs' is not a count per split"
    if not isinstance(dropped, dict) or not all(
            isinstance(d, dict) and all(isinstance(v, int) for v in d.values()) for d in dropped.values()):
        return "'dropped' is not a count per split and rule"
    return None
