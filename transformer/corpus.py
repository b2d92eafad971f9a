"""Loading parallel corpora and cleaning them.

A corpus is loaded as plain Python lists (`Pairs`), cleaned (`normalize`, `drop_empty`)
and only then turned into a `datasets.Dataset` by `data.py`. Plain-text files are read
here, line by line as bytes, so a bad byte or a misalignment is reported with the file
name and line number; a file ending in `.gz`, `.xz` or `.bz2` is decompressed as it is
read (a stream, never a second copy in memory), and a corrupt or truncated archive is
reported with its name. Hub corpora (IWSLT 2017, OPUS-100) go through `datasets`'
parquet loader, from the hub or from a local folder laid out the same way.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import logging
import lzma
import os
import unicodedata
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import datasets
import fsspec
import numpy as np

from transformer.config import PROJECT_ROOT, DataConfig

log = logging.getLogger(__name__)

HUB_DEFAULTS = {  # name -> (hub id, config, revision)
    # the main branch is a loading script, which datasets>=4 refuses to run
    "iwslt2017": ("IWSLT/iwslt2017", "iwslt2017-it-en", "refs/convert/parquet"),
    "opus100": ("Helsinki-NLP/opus-100", "en-it", "main"),
}
HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
EVAL_SETS = ("tatoeba-test", "flores200-devtest", "europarl-test")
OFFLINE = {"tatoeba": "tatoeba", "europarl": "europarl"}  # named corpus -> folder of {root}
# Compressed text: suffix -> opener of a binary stream. Readers see plain lines either way.
COMPRESSED = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}
# What a damaged archive raises while it is read: bad data, or a stream that ends too soon.
_ARCHIVE_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError, OSError)


class DataError(ValueError):
    """A corpus that cannot be used as it is; the message names the file(s) at fault."""


@dataclass
class Pairs:
    """Aligned source and target sentences, and where they came from (for messages)."""

    src: list[str]
    tgt: list[str]
    origin: str

    def __len__(self) -> int:
        return len(self.src)


def project_path(path: str | os.PathLike) -> Path:
    """A path to the project's own folders (`data.root`, `data.cache_dir`, the sample
    corpus): relative, it is under the project root, wherever the command runs."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else PROJECT_ROOT / path


# The DataConfig keys that name the user's own files (resolved with `user_path`).
USER_PATH_KEYS = ("train_src", "train_tgt", "dev_src", "dev_tgt", "hub_local_dir", "tokenizer")


def user_path(path: str | os.PathLike) -> Path:
    """A path the user names (a corpus file, a local hub mirror, a test set): relative, it
    is under the working directory, as for every command-line tool."""
    return Path(path).expanduser().absolute()


# --- reading files -------------------------------------------------------------------


def read_lines(path: str | os.PathLike) -> list[str]:
    """Lines of a UTF-8 file without their line ends; bad bytes raise DataError(file:line).

    `.gz`, `.xz` and `.bz2` files are decompressed while they are read.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"corpus file not found: {path}")
    opener = COMPRESSED.get(path.suffix)
    if opener is None:
        with path.open("rb") as f:
            return decode_lines(f, str(path))
    lines: list[str] = []
    try:
        with opener(path, "rb") as f:
            return decode_lines(f, str(path), lines)
    except _ARCHIVE_ERRORS as e:
        raise DataError(f"{path}: corrupt or truncated {path.suffix[1:]} archive (it breaks "
                        f"after line {len(lines)}: {' '.join(str(e).split()) or type(e).__name__})") from None


def text_format(path: str | os.PathLike) -> str:
    """A corpus file's format suffix, under any compression: `a.tsv.gz` -> `.tsv`."""
    path = Path(path)
    return Path(path.stem).suffix if path.suffix in COMPRESSED else path.suffix


def decode_lines(raw_lines: Iterable[bytes], name: str, lines: list[str] | None = None) -> list[str]:
    """UTF-8 lines (a binary file, stdin's buffer) without their line ends or a leading BOM;
    bad bytes raise DataError naming `name` and the line. Lines go into `lines` (if given)
    as they are read, so a caller still has them when the stream breaks."""
    lines = [] if lines is None else lines
    for lineno, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(
                f"{name}:{lineno}: not valid UTF-8 (byte {raw[e.start : e.start + 1]!r} "
                f"at column {e.start + 1})"
            ) from None
        lines.append(line.rstrip("\r\n"))
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    return lines


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> Pairs:
    """Two line-aligned plain-text files."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"misaligned corpus: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}"
        )
    return Pairs(src, tgt, f"{src_path} + {tgt_path}")


def read_tsv(path: str | os.PathLike) -> Pairs:
    """One `source<TAB>target` pair per line."""
    src, tgt = [], []
    for lineno, line in enumerate(read_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(
                f"{path}:{lineno}: expected 2 tab-separated fields, found {len(fields)}"
            )
        src.append(fields[0])
        tgt.append(fields[1])
    return Pairs(src, tgt, str(path))


def read_jsonl(path: str | os.PathLike, src_lang: str, tgt_lang: str) -> Pairs:
    """One JSON object per line: `{"it": ..., "en": ...}` or `{"translation": {...}}`."""
    src, tgt = [], []
    for lineno, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record = record.get("translation", record)
            src.append(record[src_lang])
            tgt.append(record[tgt_lang])
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as e:
            raise DataError(
                f"{path}:{lineno}: expected a JSON object with keys {src_lang!r} and "
                f"{tgt_lang!r} (or under 'translation'): {e!r}"
            ) from None
    return Pairs(src, tgt, str(path))


def read_pair_file(src: str | None, tgt: str | None, cfg: DataConfig) -> Pairs:
    """A TSV or JSONL file (recognised by its extension), or a pair of plain-text files."""
    if src is None:
        raise DataError("data=files needs train_src (and train_tgt for plain-text pairs)")
    src_path = user_path(src)
    if text_format(src_path) == ".tsv":
        return read_tsv(src_path)
    if text_format(src_path) in (".jsonl", ".json"):
        return read_jsonl(src_path, cfg.src_lang, cfg.tgt_lang)
    if tgt is None:
        raise DataError(f"{src_path} is a plain-text file: its target file must be given too")
    return read_parallel(src_path, user_path(tgt))


# --- corpora -------------------------------------------------------------------------


def corpus_files(cfg: DataConfig) -> dict[str, list[Path]] | None:
    """The local files each split is read from (their path, size and mtime find the
    prepared data without reading them: `data._source_key`).

    None for a corpus on the remote hub, whose files cannot be stat'ed.
    """
    root = project_path(cfg.root)
    s, t = cfg.src_lang, cfg.tgt_lang
    if cfg.name in (*OFFLINE, "sample"):
        folder = root / OFFLINE[cfg.name] if cfg.name in OFFLINE else project_path("data/sample")
        return {split: [find_text(folder / f"{split}.{s}"), find_text(folder / f"{split}.{t}")]
                for split in ("train", "dev")}
    if cfg.name == "files":
        files = {"train": [user_path(p) for p in (cfg.train_src, cfg.train_tgt) if p]}
        if cfg.dev_src:
            files["dev"] = [user_path(p) for p in (cfg.dev_src, cfg.dev_tgt) if p]
        return files
    if cfg.name in HUB_DEFAULTS:
        if not cfg.hub_local_dir:
            return None
        base = user_path(cfg.hub_local_dir) / _hub_settings(cfg)[1]
        return {"parquet": sorted(base.rglob("*.parquet"))}  # only for the cache key
    raise DataError(f"unknown corpus {cfg.name!r}: tatoeba | europarl | iwslt2017 | opus100 | files | sample")


def find_text(path: Path) -> Path:
    """`path`, or the first of `path.gz`, `.xz`, `.bz2` that exists (else `path` itself)."""
    for candidate in (path, *(path.with_name(path.name + ext) for ext in COMPRESSED)):
        if candidate.is_file():
            return candidate
    return path


def load_corpus(cfg: DataConfig) -> dict[str, Pairs]:
    """The raw `train` and `dev` pairs of the corpus named by `cfg.name`."""
    splits = {"train": load_split(cfg, "train")}
    if cfg.name == "files" and not cfg.dev_src:  # hold out the tail of train as dev
        train = splits["train"]
        n_dev = max(1, min(2000, len(train) // 50))
        log.warning("no dev_src given: holding out the last %d training pairs as dev", n_dev)
        splits["dev"] = Pairs(train.src[-n_dev:], train.tgt[-n_dev:], f"{train.origin} (tail)")
        splits["train"] = Pairs(train.src[:-n_dev], train.tgt[:-n_dev], train.origin)
    else:
        splits["dev"] = load_split(cfg, "dev")
    if cfg.max_train_pairs is not None:
        train, n = splits["train"], cfg.max_train_pairs
        splits["train"] = Pairs(train.src[:n], train.tgt[:n], train.origin)
    return splits


def load_split(cfg: DataConfig, split: str) -> Pairs:
    """One split (`train`, `dev`, or `test` for hub corpora) of the configured corpus."""
    if cfg.name in HUB_DEFAULTS:
        return load_hub_split(cfg, split)
    if cfg.name == "files":
        if split == "train":
            return read_pair_file(cfg.train_src, cfg.train_tgt, cfg)
        if split == "dev" and cfg.dev_src:
            return read_pair_file(cfg.dev_src, cfg.dev_tgt, cfg)
        if split == "dev":
            return load_corpus(cfg)["dev"]
    files = corpus_files(cfg)
    if split not in files:  # type: ignore[operator]
        raise DataError(f"corpus {cfg.name!r} has no {split!r} split")
    return read_parallel(*files[split])  # type: ignore[index]


def _hub_settings(cfg: DataConfig) -> tuple[str, str, str]:
    hub_id, config, revision = HUB_DEFAULTS[cfg.name]
    return cfg.hub_id or hub_id, cfg.hub_config or config, cfg.hub_revision or revision


def hub_data_files(cfg: DataConfig, split: str) -> list[str]:
    """Glob patterns for one split's parquet shards, on the hub or in `hub_local_dir`.

    The hub uses two layouts: `<config>/<split>/*.parquet` (its parquet conversion, as
    for IWSLT 2017) and `<config>/<split>-*.parquet` (OPUS-100's main branch); both are
    returned and `load_hub_split` keeps those that match files.
    """
    hub_id, config, revision = _hub_settings(cfg)
    if cfg.hub_local_dir:
        base = f"{user_path(cfg.hub_local_dir)}/{config}"
    else:  # a revision such as refs/convert/parquet is URL-encoded inside an hf:// path
        base = f"hf://datasets/{hub_id}@{quote(revision, safe='')}/{config}"
    name = HUB_SPLITS[split]
    return [f"{base}/{name}/*.parquet", f"{base}/{name}-*.parquet"]


def _glob(pattern: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(pattern)
    return fs.glob(path)


def load_hub_split(cfg: DataConfig, split: str) -> Pairs:
    """One split of a hub corpus whose rows are `translation: {it: ..., en: ...}`."""
    # datasets rejects a pattern that matches nothing: keep the layout this corpus uses
    patterns = [p for p in hub_data_files(cfg, split) if _glob(p)]
    if not patterns:
        where = cfg.hub_local_dir or _hub_settings(cfg)[0]
        raise DataError(f"no parquet files for split {HUB_SPLITS[split]!r} of {where}")
    try:
        ds = datasets.load_dataset(
            "parquet",
            data_files={split: patterns},
            split=split,
            cache_dir=str(project_path(cfg.cache_dir) / "hf"),
        )
    except FileNotFoundError as e:
        raise DataError(f"cannot load {patterns}: {e}") from e
    if "translation" not in ds.column_names:
        raise DataError(f"{patterns}: expected a 'translation' column, found {ds.column_names}")
    translation = ds.with_format("arrow")[:].column("translation").combine_chunks()
    try:
        src, tgt = (translation.field(lang).to_pylist() for lang in (cfg.src_lang, cfg.tgt_lang))
    except KeyError as e:
        raise DataError(
            f"{patterns}: no language {e} in 'translation' {translation.type}"
        ) from None
    return Pairs(src, tgt, " ".join(patterns))


# --- cleaning ------------------------------------------------------------------------


def normalize(text: str) -> str:
    """Unicode NFC, then strip and collapse every run of whitespace to one space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def normalize_pairs(pairs: Pairs) -> Pairs:
    return Pairs([normalize(s) for s in pairs.src], [normalize(t) for t in pairs.tgt], pairs.origin)


def drop_empty(pairs: Pairs) -> tuple[Pairs, int]:
    """Drop pairs with an empty side; returns the kept pairs and how many were dropped."""
    keep = [i for i, (s, t) in enumerate(zip(pairs.src, pairs.tgt)) if s and t]
    kept = Pairs([pairs.src[i] for i in keep], [pairs.tgt[i] for i in keep], pairs.origin)
    return kept, len(pairs) - len(kept)


def length_filter(
    src_lens: Sequence[int] | np.ndarray,
    tgt_lens: Sequence[int] | np.ndarray,
    max_len: int,
    max_len_ratio: float,
) -> tuple[np.ndarray, dict[str, int]]:
    """Indices of pairs within `max_len` tokens per side and `max_len_ratio` of each other.

    Rules apply in order and each pair is counted under the first rule that drops it.
    """
    src, tgt = np.asarray(src_lens), np.asarray(tgt_lens)
    too_long = (src > max_len) | (tgt > max_len)
    bad_ratio = ~too_long & (
        np.maximum(src, tgt) > max_len_ratio * np.maximum(1, np.minimum(src, tgt))
    )
    keep = np.flatnonzero(~too_long & ~bad_ratio)
    return keep, {"too_long": int(too_long.sum()), "length_ratio": int(bad_ratio.sum())}


def digest(pairs: Pairs) -> str:
    """A content hash of the pairs (the tokenizer's cache key)."""
    h = hashlib.sha256()
    for side in (pairs.src, pairs.tgt):
        h.update("\n".join(side).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
