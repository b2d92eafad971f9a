"""The data pipeline's entry points: `prepare_data` for training, `load_test_set` for evaluation.

prepare_data streams: read -> clean (NFC, whitespace, empty pairs) and filter (training
pairs, `data.filters`: `filters.py`) into Arrow files on disk (`clean_split.py`) -> joint SentencePiece vocabulary -> encode and length-filter (train
only) chunk by chunk into the cache (`encode_split.py`), with `data.num_proc` worker
processes (`workers.py`). A mix of corpora (`data.name=mix`) goes through the same steps
per corpus, with one vocabulary trained on a sample balanced by the corpora's weights.
The result is cached under `{cache_dir}/prepared-<key>/`, keyed by the cleaned text's
digest and every setting that changes it, so a second run only memory-maps it back
(`prepared_cache.py`: what such a folder holds, and the checksums of every file of it,
the tokenizer's included, checked when it is opened). For
local files a `source-<key>` note maps their path, size and mtime to that key, so a run
on unchanged files finds the cache without reading them; a copied or touched corpus is
read and cleaned again but finds the same cache by its text.
Batching lives in `batching.py`, reading corpora in `corpus.py`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import datasets
import numpy as np

from transformer import outputs
from transformer.atomic_files import atomic_write, file_sha256, put_in_place, read_json
from transformer.config import DataConfig
from transformer.data import corpus
from transformer.data.batching import batching_statistics, token_lengths
from transformer.data.clean_split import CleanSplit, clean_corpus
from transformer.data.corpus import DataError
from transformer.data.encode_split import ARROW, LengthFilter, SplitWriter
from transformer.data.filters import check_filters
from transformer.data.mixture import mix_sample
from transformer.data.prepared_cache import PreparedData, open_prepared, write_meta
from transformer.data.subword_sampling import Sampling
from transformer.data.tokenizer import TOKENIZER_RECIPE, Tokenizer, load_or_train_tokenizer
from transformer.data.workers import Workers
from transformer.errors import writing
from transformer.paths import project_path, user_path

log = logging.getLogger(__name__)

_PIPELINE_VERSION = "3"  # bump when cleaning, encoding or the layout changes, to invalidate caches

class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[phase] = round(time.perf_counter() - start, 3)


def corpus_configs(cfg: DataConfig) -> dict[str, DataConfig]:
    """One DataConfig per corpus: the corpora of a mix, or `cfg` itself."""
    if cfg.name != "mix":
        return {cfg.name: cfg}
    return {name: dataclasses.replace(cfg, name=name, corpora={}) for name in cfg.corpora}


def prepare_data(cfg: DataConfig) -> PreparedData:
    """Load, clean, tokenize and encode the corpora of `cfg`, or reuse the cached result.

    Streams: the corpora are read, cleaned and hashed in chunks into Arrow files under a
    temporary folder of the cache (`clean_split.py`), then encoded chunk by chunk into the
    cache itself; memory does not grow with the corpus.

    Under DDP, call it on rank 0 first and on the other ranks after a barrier, so that
    they load the cache instead of all preparing the same data at once.
    """
    timer = _Timer()
    check_cache_dir(cfg)
    check_filters(cfg)
    source = _source_key(cfg)  # None for the remote hub, whose files cannot be stat'ed
    with timer("load cached"):
        known = _read_source_note(cfg, source) if source else None
        prepared = _load_prepared(cfg, known) if known else None
    if prepared is None:
        del timer.seconds["load cached"]
        work = _work_folder(cfg)
        try:  # a full disk while writing the cache: one line naming it, and nothing left half-made
            with writing(cfg.cache_dir, "data.cache_dir", "write the prepared data in"), \
                    Workers(cfg.num_proc) as workers:
                with timer("read and clean"):
                    corpora = {name: clean_corpus(sub, work, _prefix(cfg, name), workers)
                               for name, sub in corpus_configs(cfg).items()}
                key = _content_key(cfg, corpora)
                prepared = _load_prepared(cfg, key)  # the same text, prepared before (copied, touched)
                if prepared is None:
                    prepared = _build(cfg, key, corpora, workers, timer)
                else:  # the raw files may differ (blank lines, CRLF): count what these ones held
                    _count_raw(cfg, corpora, prepared.stats)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if source:
            _write_source_note(cfg, source, key)
    if prepared.from_cache:
        log.info("reusing prepared data %s", prepared.path)
    prepared.phases = [(p.epochs, dict(p.corpora)) for p in cfg.phases]
    prepared.epoch_pairs = cfg.epoch_pairs
    with timer("batching"):  # batching settings are not part of the cache key
        lengths = prepared.train_lengths()
        prepared.stats["batching"] = batching_statistics(
            *lengths, cfg.max_tokens, cfg.bucket_chunk, prepared.mixture(seed=0), prepared.segmentations)
    if prepared.segmentations > 1:  # the lengths training sees: its segmentations', not the best ones'
        prepared.stats["subword_sampling"] = {"segmentations": prepared.segmentations,
                                              "src_mean_len": round(float(lengths[0].mean()), 2),
                                              "tgt_mean_len": round(float(lengths[1].mean()), 2)}
    prepared.stats["seconds"] = timer.seconds
    return prepared


# What the cache holds: prepared data, tokenizers, source notes, their temporary
# folders and files, the hub's downloads (`hf/`).
_CACHE_ENTRY = re.compile(r"\.?(prepared|source|spm)-.*|\.cleaning-.*|hf")


def check_cache_dir(cfg: DataConfig) -> None:
    """Refuse, before any work, a data.cache_dir that is a file, holds the user's files or
    the corpus itself (`outputs.check_folder`)."""
    inputs = [p for sub in corpus_configs(cfg).values()
              for paths in (corpus.corpus_files(sub) or {}).values() for p in paths]
    out = outputs.Output(project_path(cfg.cache_dir), "data.cache_dir", cfg.cache_dir, "mt-prepare")
    outputs.check_folder(out, inputs, lambda name: _CACHE_ENTRY.fullmatch(name) is not None)


def _work_folder(cfg: DataConfig) -> Path:
    """A temporary folder for the cleaned text: in the cache (same disk as the result),
    or the system's temporary folder if the cache cannot be written (a shared, read-only
    cache still serves runs whose data it holds)."""
    cache = project_path(cfg.cache_dir)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=cache, prefix=".cleaning-"))
    except OSError:
        return Path(tempfile.mkdtemp(prefix="mt-cleaning-"))


def _prefix(cfg: DataConfig, name: str) -> str:
    """Split names in statistics and messages: `train`, or `train/europarl` in a mix."""
    return f"/{name}" if cfg.name == "mix" else ""


def _build(cfg: DataConfig, key: str, corpora: dict[str, dict[str, CleanSplit]], workers: Workers,
           timer: _Timer) -> PreparedData:
    """Vocabulary, encoding and length filters, written into the cache under `key` (via a
    temporary folder renamed when complete) and reopened memory-mapped."""
    stats: dict = {}
    _count_raw(cfg, corpora, stats)
    with timer("vocabulary"):
        tokenizer, spm_path = _tokenizer(cfg, {name: splits["train"] for name, splits in corpora.items()})
    final = project_path(cfg.cache_dir) / f"prepared-{key}"
    # a folder another process completed first (a DDP rank) is kept; one left half-made is replaced
    with put_in_place(final, f".{final.name}.tmp-{os.getpid()}",
                      replace=lambda found: not (found / "meta.json").exists()) as tmp:
        with timer("encode"):
            sizes, sampling = {}, Sampling.of(cfg.subword_sampling, cfg.max_len)
            with SplitWriter(tmp / "train" / ARROW, sampling) as train:
                for name, splits in corpora.items():
                    label = f"train{_prefix(cfg, name)}"
                    sizes[name] = train.write(splits["train"], tokenizer, workers, cfg.num_proc,
                                              LengthFilter(cfg.max_len, cfg.max_len_ratio, label,
                                                           stats["dropped"][label]))
            for name, splits in corpora.items():
                with SplitWriter(tmp / "dev" / name / ARROW) as dev:
                    dev.write(splits["dev"], tokenizer, workers, cfg.num_proc, label=f"dev{_prefix(cfg, name)}")
        with timer("save"):
            stats.update(corpus_statistics(tmp, sizes, tokenizer, cfg))
            write_meta(tmp, spm_path, _settings(cfg), sizes,
                       [cfg.corpora[n] for n in sizes] if cfg.name == "mix" else None, stats,
                       sampling.segmentations if sampling is not None else 1)
    prepared = _load_prepared(cfg, key)  # memory-mapped, identical to what a cached run returns
    assert prepared is not None
    prepared.from_cache = False
    return prepared


def _count_raw(cfg: DataConfig, corpora: dict[str, dict[str, CleanSplit]], stats: dict) -> None:
    """Record in `stats` each split's pairs as read and those cleaning dropped (the length
    filters add theirs to the same `dropped` entries)."""
    for name, splits in corpora.items():
        for split, clean in splits.items():
            label = f"{split}{_prefix(cfg, name)}"
            stats.setdefault("raw_pairs", {})[label] = clean.raw
            stats.setdefault("dropped", {}).setdefault(label, {}).update(empty=clean.empty, **clean.filtered)


def given_tokenizer(path: str) -> Tokenizer:
    """The SentencePiece model `data.tokenizer` names: a .model file, or a checkpoint
    directory's tokenizer.model (checked against the SHA-256 the checkpoint's meta.json
    records). A missing, unreadable or changed one is a DataError naming it."""
    f = user_path(path)
    recorded = None
    if f.is_dir():
        recorded = read_json(f / "meta.json").get("tokenizer_sha256")
        f = f / "tokenizer.model"
    if not f.is_file():
        raise DataError(f"data.tokenizer={path}: no SentencePiece model at {f}")
    if isinstance(recorded, str) and file_sha256(f) != recorded:
        raise DataError(f"data.tokenizer={path}: {f} is not the tokenizer this checkpoint was written with "
                        f"(its SHA-256 differs from the one {f.parent / 'meta.json'} records)")
    try:
        return Tokenizer.load(f)
    except Exception as e:
        raise DataError(f"data.tokenizer={path}: {f} is not a SentencePiece model "
                        f"({' '.join(str(e).split())})") from None


def _tokenizer(cfg: DataConfig, trains: dict[str, CleanSplit]) -> tuple[Tokenizer, Path]:
    """The joint vocabulary: `data.tokenizer`'s, or trained on the corpus's sentences (a
    seeded sample of `spm_input_sentence_size`), or for a mix on a sample of them
    balanced by the weights (cached under a digest of exactly that text)."""
    if cfg.tokenizer:  # copied into the cache, which names its tokenizer by file name
        tokenizer = given_tokenizer(cfg.tokenizer)
        path = project_path(cfg.cache_dir) / f"spm-given-{tokenizer.digest}.model"
        if file_sha256(path) != hashlib.sha256(tokenizer.proto).hexdigest():  # none yet, or changed
            atomic_write(path, tokenizer.proto)
        log.info("encoding with the given tokenizer %s (%d pieces)", cfg.tokenizer, tokenizer.vocab_size)
        return tokenizer, path
    spm = (cfg.spm_vocab_size, cfg.spm_model_type, cfg.spm_character_coverage, cfg.spm_input_sentence_size)
    if cfg.name != "mix":
        (train,) = trains.values()
        return load_or_train_tokenizer(_Lazy(lambda: train.sentences(cfg.spm_input_sentence_size)), train.digest,
                                       project_path(cfg.cache_dir), *spm, setting="data.spm_vocab_size",
                                       case_copies=cfg.spm_case_copies)
    weights = [cfg.corpora[name] for name in trains]
    sample = mix_sample(list(trains.values()), weights, cfg.spm_input_sentence_size)
    text_digest = hashlib.sha256("\n".join(sample).encode()).hexdigest()[:16]
    return load_or_train_tokenizer(sample, text_digest, project_path(cfg.cache_dir), *spm,
                                   setting="data.spm_vocab_size", case_copies=cfg.spm_case_copies)


class _Lazy:
    """An iterable made only when iterated: a cached vocabulary never reads its sample."""

    def __init__(self, make: Callable[[], Iterable[str]]) -> None:
        self.make = make

    def __iter__(self) -> Iterator[str]:
        return iter(self.make())


# --- statistics ----------------------------------------------------------------------


def corpus_statistics(folder: Path, sizes: dict[str, int], tokenizer: Tokenizer, cfg: DataConfig) -> dict:
    """Pairs, tokens, mean/max lengths per split (a mix's train split per corpus), and the
    vocabulary size (see prepare.py)."""
    stats: dict = {"vocab_size": tokenizer.vocab_size, "splits": {}}
    src, tgt = token_lengths(datasets.Dataset.from_file(str(folder / "train" / ARROW)))
    bounds = np.cumsum([0, *sizes.values()])
    parts = {f"train{_prefix(cfg, n)}": (src[a:b], tgt[a:b])
             for n, a, b in zip(sizes, bounds[:-1], bounds[1:], strict=True)}
    for n in sizes:
        parts[f"dev{_prefix(cfg, n)}"] = token_lengths(datasets.Dataset.from_file(str(folder / "dev" / n / ARROW)))
    for name, (s, t) in parts.items():
        stats["splits"][name] = {
            "pairs": len(s),
            "src_tokens": int(s.sum()),
            "tgt_tokens": int(t.sum()),
            "src_mean_len": round(float(s.mean()), 2),
            "tgt_mean_len": round(float(t.mean()), 2),
            "src_max_len": int(s.max()),
            "tgt_max_len": int(t.max()),
        }
    return stats


# --- cache ---------------------------------------------------------------------------

# Settings that change the prepared data (not batching or parallelism).
_KEY_FIELDS = (
    "name", "corpora", "root", "src_lang", "tgt_lang", "train_src", "train_tgt", "dev_src", "dev_tgt",
    "hub_id", "hub_config", "hub_revision", "hub_local_dir", "max_len", "max_len_ratio",
    "max_train_pairs", "spm_vocab_size", "spm_model_type", "spm_character_coverage",
    "spm_input_sentence_size",
)  # fmt: skip


# Where the text comes from, not what it is: left out of the key of the text itself.
_LOCATION_FIELDS = (
    "root", "train_src", "train_tgt", "dev_src", "dev_tgt", "hub_id", "hub_config",
    "hub_revision", "hub_local_dir",
)  # fmt: skip


def _settings(cfg: DataConfig, location: bool = True) -> str:
    fields = _KEY_FIELDS if location else tuple(f for f in _KEY_FIELDS if f not in _LOCATION_FIELDS)
    settings = {k: v for k, v in asdict(cfg).items() if k in fields}
    if cfg.filters.active():  # off: the keys of the data prepared before filters existed
        settings["filters"] = asdict(cfg.filters)
    if cfg.tokenizer:  # a given vocabulary: its content counts, not the spm_* settings
        settings = {k: v for k, v in settings.items() if not k.startswith("spm_")}
        settings["tokenizer"] = given_tokenizer(cfg.tokenizer).digest
    if cfg.subword_sampling.on:  # off, the key holds no trace of the setting
        settings["subword_sampling"] = asdict(cfg.subword_sampling)
    if cfg.spm_case_copies and not cfg.tokenizer:  # likewise
        settings["spm_case_copies"] = cfg.spm_case_copies
    return json.dumps([_PIPELINE_VERSION, TOKENIZER_RECIPE, settings], sort_keys=True)


def _source_key(cfg: DataConfig) -> str | None:
    """The settings and each corpus file's path, size and mtime, hashed: which prepared
    data these files held when last read is noted under it (`source-<key>`)."""
    stamps = []
    for sub in corpus_configs(cfg).values():
        files = corpus.corpus_files(sub)
        if files is None:
            return None
        for p in (p for paths in files.values() for p in paths):
            if not p.is_file():
                raise DataError(f"corpus file not found: {p}" if not p.exists() else
                                f"{p}: not a regular file (a FIFO, a device, a process substitution <(...)): "
                                "preparation reads a corpus more than once; give a file")
            st = p.stat()
            stamps.append((str(p.resolve()), st.st_size, st.st_mtime_ns))
    # the cleaning rule's version too: a note says what the files held once cleaned
    return hashlib.sha256(json.dumps([_settings(cfg), corpus.CLEANING, stamps]).encode()).hexdigest()[:16]


def _read_source_note(cfg: DataConfig, source: str) -> str | None:
    note = project_path(cfg.cache_dir) / f"source-{source}"
    try:
        key = note.read_text().strip()
    except (OSError, UnicodeDecodeError):  # none yet, or unreadable: read the files
        return None
    return key if re.fullmatch(r"[0-9a-f]{16}", key) else None  # anything else: read the files


def _write_source_note(cfg: DataConfig, source: str, key: str) -> None:
    note = project_path(cfg.cache_dir) / f"source-{source}"
    try:
        atomic_write(note, f"{key}\n".encode())  # a reader sees the old note or the new one
    except OSError as e:  # only a shortcut: a read-only or full cache still serves this run
        log.warning("could not write %s (%s): the corpus files will be read again next time", note, e)


def _content_key(cfg: DataConfig, corpora: dict[str, dict[str, CleanSplit]]) -> str:
    """The cache key: the cleaned text of every split and the settings that change what is
    made of it (not where the files are)."""
    digests = {f"{name}/{split}": clean.digest for name, splits in corpora.items() for split, clean in splits.items()}
    return hashlib.sha256(json.dumps([_settings(cfg, location=False), digests]).encode()).hexdigest()[:16]


def _load_prepared(cfg: DataConfig, key: str) -> PreparedData | None:
    """The cached data of `key` (`prepared_cache.open_prepared`: every file checked), or None."""
    return open_prepared(project_path(cfg.cache_dir) / f"prepared-{key}")


# --- evaluation sets -----------------------------------------------------------------


def load_test_set(name_or_paths: str, cfg: DataConfig) -> tuple[list[str], list[str]]:
    """Source and reference lines of a test set, normalised like the training data.

    `name_or_paths` is `tatoeba-test`, `flores200-devtest` or `europarl-test` (from
    `{root}/eval`), `dev` (the configured corpus's dev split), `test` (the hub test split
    of iwslt2017/opus100) or two files `src_path,ref_path`.
    """
    if name_or_paths in corpus.EVAL_SETS:
        folder = project_path(cfg.root) / "eval"
        pairs = corpus.read_parallel(
            folder / f"{name_or_paths}.{cfg.src_lang}", folder / f"{name_or_paths}.{cfg.tgt_lang}"
        )
    elif name_or_paths in ("dev", "test"):
        if cfg.name == "mix":
            raise DataError(f"test_set={name_or_paths} is ambiguous for a mix of corpora: name one, "
                            f"e.g. data={next(iter(cfg.corpora))} test_set={name_or_paths}")
        pairs = corpus.load_split(cfg, name_or_paths)
    elif "," in name_or_paths:
        src, ref = (p.strip() for p in name_or_paths.split(",", 1))
        pairs = corpus.read_parallel(user_path(src), user_path(ref))
    else:
        raise DataError(
            f"unknown test set {name_or_paths!r}: {', '.join(corpus.EVAL_SETS)}, dev, test "
            "or src_path,ref_path"
        )
    src, tgt = corpus.clean(pairs.src, pairs.tgt)
    if len(src) < len(pairs):
        log.warning("%s: dropped %d pairs with an empty side", pairs.origin, len(pairs) - len(src))
    return src, tgt
