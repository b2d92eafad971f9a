"""Reading parallel corpora, and the cleaning rule.

A corpus split is read as a stream of (source, target) pairs (`iter_split`), which
preparation cleans in chunks (`clean_split.py`); small sets (test sets, a held-out dev set)
are read into `Pairs` lists. Plain-text files are read line by line as bytes, so a bad
byte or a misalignment is reported with the file name and line number; a file ending in
`.gz`, `.xz` or `.bz2` is decompressed as it is read, and a corrupt or truncated archive
is reported with its name. Hub corpora (IWSLT 2017, OPUS-100) go through `datasets`'
parquet loader, from the hub or from a local folder laid out the same way.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import itertools
import json
import logging
import lzma
import os
import re
import unicodedata
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import datasets
import fsspec
import numpy as np
import pyarrow as pa

from transformer.config import DataConfig
from transformer.errors import UserError, file_error
from transformer.paths import project_path, user_path

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


class DataError(UserError, ValueError):
    """A corpus that cannot be used as it is; the message names the file(s) at fault."""


@dataclass
class Pairs:
    """Aligned source and target sentences, and where they came from (for messages)."""

    src: list[str]
    tgt: list[str]
    origin: str

    def __len__(self) -> int:
        return len(self.src)

    def take(self, rows: Iterable[int], side: str) -> list[str]:
        """The `side` ("src" or "tgt") sentences at `rows`, in that order."""
        sentences = self.src if side == "src" else self.tgt
        return [sentences[i] for i in rows]


# --- reading files -------------------------------------------------------------------


def read_lines(path: str | os.PathLike) -> list[str]:
    """Lines of a UTF-8 file without their line ends; bad bytes raise DataError(file:line).

    `.gz`, `.xz` and `.bz2` files are decompressed while they are read.
    """
    return list(iter_lines(path))


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """`read_lines` as a stream: one line at a time, never the whole file in memory.

    A path that is not a regular file but can be read (a FIFO, `/dev/stdin`, a process
    substitution `<(...)`) is read the same way, once: a caller that reads a file twice
    reads it into memory first (mt-translate's prefixes)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"corpus file not found: {path}")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a file")
    opener = COMPRESSED.get(path.suffix)
    if opener is None:
        try:
            f = path.open("rb")
        except OSError as e:
            raise file_error(e, path, "read") from e
        with f:
            yield from _decoded(f, str(path))
        return
    n = 0
    try:
        with opener(path, "rb") as f:
            for line in _decoded(f, str(path)):
                n += 1
                yield line
    except _ARCHIVE_ERRORS as e:
        raise DataError(f"{path}: corrupt or truncated {path.suffix[1:]} archive (it breaks "
                        f"after line {n}: {' '.join(str(e).split()) or type(e).__name__})") from None


def text_format(path: str | os.PathLike) -> str:
    """A corpus file's format suffix, under any compression: `a.tsv.gz` -> `.tsv`."""
    path = Path(path)
    return Path(path.stem).suffix if path.suffix in COMPRESSED else path.suffix


def decode_lines(raw_lines: Iterable[bytes], name: str) -> list[str]:
    """UTF-8 lines (a binary file, stdin's buffer) without their line ends or a leading BOM;
    bad bytes raise DataError naming `name` and the line."""
    return list(_decoded(raw_lines, name))


def iter_decoded(raw_lines: Iterable[bytes], name: str) -> Iterator[str]:
    """`decode_lines` as a stream: a line is decoded when it is read (mt-translate's stdin)."""
    return _decoded(raw_lines, name)


def _decoded(raw_lines: Iterable[bytes], name: str) -> Iterator[str]:
    for lineno, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(
                f"{name}:{lineno}: not valid UTF-8 (byte {raw[e.start : e.start + 1]!r} "
                f"at column {e.start + 1})"
            ) from None
        yield line[1:].rstrip("\r\n") if lineno == 1 and line.startswith("\ufeff") else line.rstrip("\r\n")


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> Pairs:
    """Two line-aligned plain-text files."""
    return _pairs(iter_parallel(src_path, tgt_path), f"{src_path} + {tgt_path}")


def _pairs(stream: Iterable[tuple[str, str]], origin: str) -> Pairs:
    src: list[str] = []
    tgt: list[str] = []
    for s, t in stream:
        src.append(s)
        tgt.append(t)
    return Pairs(src, tgt, origin)


_END = object()


def iter_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """Two line-aligned plain-text files, a pair at a time; files of different lengths
    raise DataError with both names and line counts when the shorter one ends."""
    src, tgt = iter_lines(src_path), iter_lines(tgt_path)
    for n, (s, t) in enumerate(itertools.zip_longest(src, tgt, fillvalue=_END)):
        if s is _END or t is _END:
            rest = 1 + sum(1 for _ in (tgt if s is _END else src))
            n_src, n_tgt = (n, n + rest) if s is _END else (n + rest, n)
            raise DataError(f"misaligned corpus: {src_path} has {n_src} lines but {tgt_path} has {n_tgt}")
        yield s, t


def iter_tsv(path: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """One `source<TAB>target` pair per line."""
    for lineno, line in enumerate(iter_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(
                f"{path}:{lineno}: expected 2 tab-separated fields, found {len(fields)}"
            )
        yield fields[0], fields[1]


def iter_jsonl(path: str | os.PathLike, src_lang: str, tgt_lang: str) -> Iterator[tuple[str, str]]:
    """One JSON object per line: `{"it": ..., "en": ...}` or `{"translation": {...}}`."""
    for lineno, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record = record.get("translation", record)
            pair = record[src_lang], record[tgt_lang]
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as e:
            raise DataError(
                f"{path}:{lineno}: expected a JSON object with keys {src_lang!r} and "
                f"{tgt_lang!r} (or under 'translation'): {e!r}"
            ) from None
        yield pair


def iter_pair_file(src: str | None, tgt: str | None, cfg: DataConfig) -> tuple[Iterator[tuple[str, str]], str]:
    """A TSV or JSONL file (recognised by its extension), or a pair of plain-text files:
    its pairs as a stream, and their origin (for messages)."""
    if src is None:
        raise DataError("data=files needs train_src (and train_tgt for plain-text pairs)")
    src_path = user_path(src)
    if text_format(src_path) == ".tsv":
        return iter_tsv(src_path), str(src_path)
    if text_format(src_path) in (".jsonl", ".json"):
        return iter_jsonl(src_path, cfg.src_lang, cfg.tgt_lang), str(src_path)
    if tgt is None:
        raise DataError(f"{src_path} is a plain-text file: its target file must be given too")
    tgt_path = user_path(tgt)
    return iter_parallel(src_path, tgt_path), f"{src_path} + {tgt_path}"


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


class HeldOutTail:
    """The training pairs of a `files` corpus without a dev set, all but its tail: the
    last `max(1, min(2000, n // 50))` of its n pairs, in `tail` once the stream ends. A
    window of at most 4,000 pairs is held back, whatever n is."""

    MAX = 2000

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.pairs, self.tail, self.count = pairs, [], 0

    def __iter__(self) -> Iterator[tuple[str, str]]:
        window: list[tuple[str, str]] = []
        for pair in self.pairs:
            self.count += 1
            window.append(pair)
            if len(window) > 2 * self.MAX:  # emit the older half: the tail is within the newer
                yield from window[: self.MAX]
                del window[: self.MAX]
        n_dev = max(1, min(self.MAX, self.count // 50))
        log.warning("no dev_src given: holding out the last %d training pairs as dev", n_dev)
        self.tail = window[len(window) - n_dev :]
        yield from window[: len(window) - n_dev]


def load_split(cfg: DataConfig, split: str) -> Pairs:
    """One split (`train`, `dev`, or `test` for hub corpora) of the configured corpus, in
    memory (for small sets: preparation streams, `clean_split.clean_corpus`)."""
    if cfg.name == "files" and split == "dev" and not cfg.dev_src:
        train, origin = iter_split(cfg, "train")
        held = HeldOutTail(train)
        for _ in held:
            pass
        return _pairs(held.tail, f"{origin} (tail)")
    return _pairs(*iter_split(cfg, split))


def iter_split(cfg: DataConfig, split: str) -> tuple[Iterator[tuple[str, str]], str]:
    """One split of the configured corpus as a stream of pairs, and its origin. (A `files`
    corpus without `dev_src` has no dev split of its own: `HeldOutTail` holds one out.)"""
    if cfg.name in HUB_DEFAULTS:
        return iter_hub_split(cfg, split)
    if cfg.name == "files":
        if split == "train":
            return iter_pair_file(cfg.train_src, cfg.train_tgt, cfg)
        if split == "dev" and cfg.dev_src:
            return iter_pair_file(cfg.dev_src, cfg.dev_tgt, cfg)
    files = corpus_files(cfg)
    if split not in files:  # type: ignore[operator]
        raise DataError(f"corpus {cfg.name!r} has no {split!r} split")
    src, tgt = files[split]  # type: ignore[index]
    return iter_parallel(src, tgt), f"{src} + {tgt}"


def _hub_settings(cfg: DataConfig) -> tuple[str, str, str]:
    hub_id, config, revision = HUB_DEFAULTS[cfg.name]
    return cfg.hub_id or hub_id, cfg.hub_config or config, cfg.hub_revision or revision


def hub_data_files(cfg: DataConfig, split: str) -> list[str]:
    """Glob patterns for one split's parquet shards, on the hub or in `hub_local_dir`.

    The hub uses two layouts: `<config>/<split>/*.parquet` (its parquet conversion, as
    for IWSLT 2017) and `<config>/<split>-*.parquet` (OPUS-100's main branch); both are
    returned and `iter_hub_split` keeps those that match files.
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


def iter_hub_split(cfg: DataConfig, split: str) -> tuple[Iterator[tuple[str, str]], str]:
    """One split of a hub corpus whose rows are `translation: {it: ..., en: ...}`: its
    pairs as a stream (read from the memory-mapped Arrow cache of `datasets`), and origin."""
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
    table = ds.with_format("arrow")[:]
    kind = table.schema.field("translation").type
    for lang in (cfg.src_lang, cfg.tgt_lang):
        if not pa.types.is_struct(kind) or kind.get_field_index(lang) < 0:
            raise DataError(f"{patterns}: no language {lang!r} in 'translation' {kind}")

    def pairs() -> Iterator[tuple[str, str]]:
        for batch in table.column("translation").chunks:
            yield from zip(batch.field(cfg.src_lang).to_pylist(), batch.field(cfg.tgt_lang).to_pylist(),
                           strict=True)

    return pairs(), " ".join(patterns)


# --- cleaning ------------------------------------------------------------------------


def normalize(text: str) -> str:
    """Unicode NFC, then strip and collapse every run of whitespace to one space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


# Bump when `clean` changes what it makes of a text. The prepared data is keyed by the
# cleaned text, so a change reaches the keys of the corpora it changes by itself; but a
# note that maps a file's path and mtime to that text's digest (pipeline `_source_key`) was
# made by the older rule and is not trusted.
CLEANING = "2"

# An apostrophe written as an HTML character reference and spaced out by a tokenizer, as
# in Europarl's Italian side ("dell & # x02BC; intervento", about 7,600 times in 5,000 pairs).
_SPACED_APOSTROPHE = re.compile(r" ?& ?# ?x0*(?:2bc|2019) ?; ?", re.IGNORECASE)


def repair(text: str) -> str:
    """`text` with a spaced-out apostrophe reference joined again as the apostrophe it
    stands for: "dell & # x02BC; intervento" -> "dell'intervento"."""
    return _SPACED_APOSTROPHE.sub("'", text) if "&" in text else text


def clean(src: Sequence[str], tgt: Sequence[str]) -> tuple[list[str], list[str]]:
    """The cleaning rule, for training and test sets alike: both sides normalised and
    repaired (`repair`), pairs with an empty side dropped."""
    def cleaned(lines: Sequence[str]) -> Iterator[str]:
        return (repair(normalize(line)) for line in lines)

    kept = [(s, t) for s, t in zip(cleaned(src), cleaned(tgt), strict=True) if s and t]
    return [s for s, _ in kept], [t for _, t in kept]


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


class Digest:
    """A content hash of pairs fed in chunks, the same however they are chunked: the UTF-8
    text of the sources, their lengths, the same of the targets (read straight from Arrow
    string arrays, without a copy into Python)."""

    def __init__(self) -> None:
        self._parts = [hashlib.sha256() for _ in range(4)]

    def update(self, src: Sequence[str], tgt: Sequence[str]) -> None:
        self.update_arrays(pa.array(src, pa.string()), pa.array(tgt, pa.string()))

    def update_arrays(self, src: pa.Array, tgt: pa.Array) -> None:
        for (text, lengths), side in zip((self._parts[:2], self._parts[2:]), (src, tgt), strict=True):
            offsets = np.frombuffer(side.buffers()[1], np.int32)[side.offset : side.offset + len(side) + 1]
            if len(side) and offsets[-1] > offsets[0]:
                text.update(memoryview(side.buffers()[2])[int(offsets[0]) : int(offsets[-1])])
            lengths.update(np.diff(offsets).astype("<i8").tobytes())

    def hexdigest(self) -> str:
        return hashlib.sha256(b"".join(h.digest() for h in self._parts)).hexdigest()[:16]


def digest(pairs: Pairs) -> str:
    """`Digest` of pairs in memory (fed in one chunk: the same as in any other chunks)."""
    d = Digest()
    d.update(pairs.src, pairs.tgt)
    return d.hexdigest()
