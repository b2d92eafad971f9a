"""The data pipeline's entry points: `prepare_data` for training, `load_test_set` for evaluation.

prepare_data: load -> clean (NFC, whitespace, empty pairs) -> joint SentencePiece
vocabulary -> encode with `datasets.map` in `num_proc` processes -> length filters
(train only) -> save. The result is cached under `{cache_dir}/prepared-<key>/`, keyed by
the corpus files' path, size and mtime (or, for the remote hub, the text's digest) and by
every setting that changes it, so a second run only memory-maps it back.
Batching lives in `batching.py`, loading and cleaning in `corpus.py`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import datasets

from transformer import corpus
from transformer.batching import batching_statistics, token_lengths
from transformer.config import DataConfig
from transformer.corpus import DataError, Pairs, resolve
from transformer.tokenizer import TOKENIZER_RECIPE, Tokenizer, iter_sides, load_or_train_tokenizer

log = logging.getLogger(__name__)

_PIPELINE_VERSION = "1"  # bump when cleaning or encoding changes, to invalidate caches
_FEATURES = datasets.Features(
    {
        "src": datasets.Value("string"),
        "tgt": datasets.Value("string"),
        "src_ids": datasets.Sequence(datasets.Value("int32")),
        "tgt_ids": datasets.Sequence(datasets.Value("int32")),
    }
)


@dataclass
class PreparedData:
    """What training needs: the tokenizer and the encoded splits.

    `train` and `dev` have columns `src`, `tgt` (normalised text: dev keeps it for BLEU)
    and `src_ids`, `tgt_ids` (list[int], no BOS/EOS).
    """

    tokenizer: Tokenizer
    train: datasets.Dataset
    dev: datasets.Dataset
    stats: dict = field(default_factory=dict)  # see `prepare.format_statistics`
    path: Path | None = None  # the cache folder it was saved to / loaded from
    from_cache: bool = False


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[phase] = round(time.perf_counter() - start, 3)


def prepare_data(cfg: DataConfig) -> PreparedData:
    """Load, clean, tokenize and encode the corpus of `cfg`, or reuse the cached result.

    Under DDP, call it on rank 0 first and on the other ranks after a barrier, so that
    they load the cache instead of all preparing the same data at once.
    """
    timer = _Timer()
    key = _source_key(cfg)
    with timer("load cached"):
        prepared = _load_prepared(cfg, key) if key else None
    if prepared is None:
        del timer.seconds["load cached"]
        with timer("load"):
            raw = corpus.load_corpus(cfg)
        with timer("clean"):
            splits, dropped = _clean(raw)
        if key is None:  # a remote hub corpus: key on its text, now that it is loaded
            key = _content_key(cfg, splits)
            prepared = _load_prepared(cfg, key)
        if prepared is None:
            stats = {"raw_pairs": {k: len(v) for k, v in raw.items()}, "dropped": dropped}
            prepared = _build(cfg, key, splits, stats, timer)
    if prepared.from_cache:
        log.info("reusing prepared data %s", prepared.path)
    with timer("batching"):  # batching settings are not part of the cache key
        lengths = token_lengths(prepared.train)
        prepared.stats["batching"] = batching_statistics(*lengths, cfg.max_tokens, cfg.bucket_chunk)
    prepared.stats["seconds"] = timer.seconds
    return prepared


def _build(
    cfg: DataConfig, key: str, splits: dict[str, Pairs], stats: dict, timer: _Timer
) -> PreparedData:
    """Vocabulary, encoding, length filters; saved under the cache key and reopened."""
    train = splits["train"]
    with timer("vocabulary"):
        tokenizer, spm_path = load_or_train_tokenizer(
            iter_sides(train.src, train.tgt),
            corpus.digest(train),
            resolve(cfg.cache_dir),
            cfg.vocab_size,
            cfg.spm_model_type,
            cfg.spm_character_coverage,
            cfg.spm_input_sentence_size,
        )
    with timer("encode"):
        encoded = {name: encode(pairs, tokenizer, cfg.num_proc) for name, pairs in splits.items()}
    with timer("filter"):
        encoded["train"] = _length_filter(encoded["train"], cfg, stats["dropped"], train.origin)
    with timer("save"):
        stats.update(corpus_statistics(encoded, tokenizer))
        _save_prepared(cfg, key, encoded, spm_path, stats)
        # reopen the saved copy: memory-mapped, and identical to what a cached run returns
        prepared = _load_prepared(cfg, key)
    assert prepared is not None
    prepared.from_cache = False
    return prepared


def _clean(raw: dict[str, Pairs]) -> tuple[dict[str, Pairs], dict[str, dict[str, int]]]:
    splits, dropped = {}, {}
    for name, pairs in raw.items():
        kept, n_empty = corpus.drop_empty(corpus.normalize_pairs(pairs))
        log.info("%s: dropped %d of %d pairs with an empty side", name, n_empty, len(pairs))
        if not kept:
            raise DataError(
                f"{name} split is empty after cleaning ({len(pairs)} pairs read from {pairs.origin})"
            )
        splits[name], dropped[name] = kept, {"empty": n_empty}
    return splits, dropped


class _Encode:
    """The datasets.map function (a class, so it pickles into the worker processes)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        return {
            "src_ids": self.tokenizer.encode(batch["src"]),
            "tgt_ids": self.tokenizer.encode(batch["tgt"]),
        }


def encode(pairs: Pairs, tokenizer: Tokenizer, num_proc: int = 1) -> datasets.Dataset:
    """A Dataset with `src`, `tgt`, `src_ids`, `tgt_ids`, encoded in `num_proc` processes."""
    ds = datasets.Dataset.from_dict({"src": pairs.src, "tgt": pairs.tgt})
    # worker start-up costs more than it saves on small corpora
    procs = num_proc if num_proc > 1 and len(pairs) >= 50_000 else None
    return ds.map(
        _Encode(tokenizer),
        batched=True,
        batch_size=10_000,
        num_proc=procs,
        features=_FEATURES,
        new_fingerprint=f"encode-{tokenizer.digest}-{corpus.digest(pairs)}",
        desc="encoding",
    )


def _length_filter(
    ds: datasets.Dataset, cfg: DataConfig, dropped: dict, origin: str
) -> datasets.Dataset:
    table = ds.with_format("arrow")[:]
    src_lens, tgt_lens = token_lengths(ds)
    keep, counts = corpus.length_filter(src_lens, tgt_lens, cfg.max_len, cfg.max_len_ratio)
    for rule, n in counts.items():
        log.info("train: dropped %d of %d pairs by rule %s", n, len(ds), rule)
    dropped["train"].update(counts)
    if not len(keep):
        raise DataError(
            f"train split is empty after the length filters (max_len={cfg.max_len}, "
            f"max_len_ratio={cfg.max_len_ratio}; {origin})"
        )
    # one Arrow take, not Dataset.select: its index mapping makes every later read slow
    return datasets.Dataset(table.take(keep)) if len(keep) < len(ds) else ds


# --- statistics ----------------------------------------------------------------------


def corpus_statistics(splits: dict[str, datasets.Dataset], tokenizer: Tokenizer) -> dict:
    """Pairs, tokens, mean/max lengths per split, and the vocabulary size (see prepare.py)."""
    stats: dict = {"vocab_size": tokenizer.vocab_size, "splits": {}}
    for name, ds in splits.items():
        src, tgt = token_lengths(ds)
        stats["splits"][name] = {
            "pairs": len(ds),
            "src_tokens": int(src.sum()),
            "tgt_tokens": int(tgt.sum()),
            "src_mean_len": round(float(src.mean()), 2),
            "tgt_mean_len": round(float(tgt.mean()), 2),
            "src_max_len": int(src.max()),
            "tgt_max_len": int(tgt.max()),
        }
    return stats


# --- cache ---------------------------------------------------------------------------

# Settings that change the prepared data (not batching or parallelism).
_KEY_FIELDS = (
    "name", "root", "src_lang", "tgt_lang", "train_src", "train_tgt", "dev_src", "dev_tgt",
    "hub_id", "hub_config", "hub_revision", "hub_local_dir", "max_len", "max_len_ratio",
    "max_train_pairs", "vocab_size", "spm_model_type", "spm_character_coverage",
    "spm_input_sentence_size",
)  # fmt: skip


def _settings(cfg: DataConfig) -> str:
    settings = {k: v for k, v in asdict(cfg).items() if k in _KEY_FIELDS}
    return json.dumps([_PIPELINE_VERSION, TOKENIZER_RECIPE, settings], sort_keys=True)


def _source_key(cfg: DataConfig) -> str | None:
    """Cache key from the settings and each corpus file's path, size and mtime."""
    files = corpus.corpus_files(cfg)
    if files is None:
        return None
    stamps = []
    for paths in files.values():
        for p in paths:
            if not p.is_file():
                raise DataError(f"corpus file not found: {p}")
            st = p.stat()
            stamps.append((str(p.resolve()), st.st_size, st.st_mtime_ns))
    return hashlib.sha256(json.dumps([_settings(cfg), stamps]).encode()).hexdigest()[:16]


def _content_key(cfg: DataConfig, splits: dict[str, Pairs]) -> str:
    digests = {name: corpus.digest(p) for name, p in splits.items()}
    return hashlib.sha256(json.dumps([_settings(cfg), digests]).encode()).hexdigest()[:16]


def _save_prepared(
    cfg: DataConfig, key: str, splits: dict[str, datasets.Dataset], spm_path: Path, stats: dict
) -> Path:
    """Save to a temporary folder, then rename, so a half-written cache is never read."""
    final = resolve(cfg.cache_dir) / f"prepared-{key}"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    for name, ds in splits.items():
        ds.save_to_disk(str(tmp / name))
    (tmp / "stats.json").write_text(json.dumps(stats, indent=1))
    (tmp / "meta.json").write_text(
        json.dumps({"tokenizer": spm_path.name, "settings": _settings(cfg)})
    )
    if final.exists() and not (final / "meta.json").exists():
        shutil.rmtree(final, ignore_errors=True)  # left half-made by an older version
    try:
        tmp.rename(final)
    except OSError:  # another process (a DDP rank) saved the same data first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _load_prepared(cfg: DataConfig, key: str) -> PreparedData | None:
    path = resolve(cfg.cache_dir) / f"prepared-{key}"
    try:
        meta = json.loads((path / "meta.json").read_text())
        tokenizer = Tokenizer.load(path.parent / meta["tokenizer"])
        train = datasets.load_from_disk(str(path / "train"))
        dev = datasets.load_from_disk(str(path / "dev"))
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return None
    stats_file = path / "stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    return PreparedData(tokenizer, train, dev, stats, path, from_cache=True)


# --- evaluation sets -----------------------------------------------------------------


def load_test_set(name_or_paths: str, cfg: DataConfig) -> tuple[list[str], list[str]]:
    """Source and reference lines of a test set, normalised like the training data.

    `name_or_paths` is `tatoeba-test` or `flores200-devtest` (from `{root}/eval`), `dev`
    (the configured corpus's dev split), `test` (the hub test split of iwslt2017/opus100)
    or two files `src_path,ref_path`.
    """
    if name_or_paths in corpus.EVAL_SETS:
        folder = resolve(cfg.root) / "eval"
        pairs = corpus.read_parallel(
            folder / f"{name_or_paths}.{cfg.src_lang}", folder / f"{name_or_paths}.{cfg.tgt_lang}"
        )
    elif name_or_paths in ("dev", "test"):
        pairs = corpus.load_split(cfg, name_or_paths)
    elif "," in name_or_paths:
        src, ref = (p.strip() for p in name_or_paths.split(",", 1))
        pairs = corpus.read_parallel(resolve(src), resolve(ref))
    else:
        raise DataError(
            f"unknown test set {name_or_paths!r}: {', '.join(corpus.EVAL_SETS)}, dev, test "
            "or src_path,ref_path"
        )
    kept, n_empty = corpus.drop_empty(corpus.normalize_pairs(pairs))
    if n_empty:
        log.warning("%s: dropped %d pairs with an empty side", pairs.origin, n_empty)
    return kept.src, kept.tgt
