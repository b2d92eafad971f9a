"""A joint SentencePiece vocabulary for both languages, with fixed special ids.

The serialized model (`Tokenizer.proto`) travels inside every checkpoint, so translating
needs no separate vocabulary file. Text is normalised by `corpus.normalize` before it
reaches SentencePiece, which is therefore told to leave it alone (`identity` rule): then
`decode(encode(x)) == x` for every normalised `x` made of characters seen in training.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm

from transformer.atomic_files import atomic_write
from transformer.data import perturb
from transformer.data.heartbeat import Heartbeat
from transformer.errors import UserError

log = logging.getLogger(__name__)

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

# The file a checkpoint directory and an export keep their tokenizer in.
TOKENIZER_FILE = "tokenizer.model"
# Bump when the training recipe below changes, so cached vocabularies are not reused.
TOKENIZER_RECIPE = "2"


class Tokenizer:
    """Encode text to ids and back with one SentencePiece model."""

    def __init__(self, processor: spm.SentencePieceProcessor) -> None:
        self._sp = processor
        ids = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError(f"SentencePiece model has special ids {ids}, expected (0, 1, 2, 3)")

    @classmethod
    def from_proto(cls, proto: bytes) -> Tokenizer:
        processor = spm.SentencePieceProcessor()
        processor.LoadFromSerializedProto(proto)
        return cls(processor)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        return cls.from_proto(Path(path).read_bytes())

    @property
    def proto(self) -> bytes:
        """The serialized SentencePiece model (what checkpoints store)."""
        return self._sp.serialized_model_proto()

    @property
    def digest(self) -> str:
        """A short content hash of the model, for cache keys."""
        return hashlib.sha256(self.proto).hexdigest()[:16]

    def save(self, path: str | os.PathLike) -> None:
        atomic_write(Path(path), self.proto)

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    pad_id = PAD_ID
    unk_id = UNK_ID
    bos_id = BOS_ID
    eos_id = EOS_ID

    def encode(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        """Token ids of each text, without BOS or EOS; `num_threads` SentencePiece threads."""
        return self._sp.encode(list(texts), out_type=int, num_threads=num_threads)

    def encode_line(self, text: str) -> list[int]:
        """One text's ids, without BOS or EOS: SentencePiece's call for one string, which
        starts no threads (its call for a list does, which costs more than encoding a few
        dozen short lines: `augment.py` encodes its changed lines one by one)."""
        return self._sp.encode(text, out_type=int)

    def sample(self, texts: list[str], alpha: float, nbest: int, seed: int) -> list[list[int]]:
        """A sampled segmentation of each text (subword regularisation): SentencePiece's
        sampling with `alpha` among the `nbest` best (-1: all) for a unigram model,
        BPE-dropout with probability `alpha` for a BPE one. SentencePiece's generator is
        set to `seed` first, so that calls with other seeds draw other samples (each call's
        thread starts from the seed last set); the same seed in another process does not
        give the same samples."""
        spm.set_random_generator_seed(seed)
        return self._sp.encode(list(texts), out_type=int, enable_sampling=True, alpha=alpha, nbest_size=nbest,
                               num_threads=1)

    def decode(self, ids: Iterable[Iterable[int]]) -> list[str]:
        """Text of each id sequence: stops at the first EOS, skips padding and BOS."""
        cleaned = []
        for seq in ids:
            out = []
            for i in seq:
                i = int(i)
                if i == EOS_ID:
                    break
                if i not in (PAD_ID, BOS_ID):
                    out.append(i)
            cleaned.append(out)
        return self._sp.decode(cleaned)

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def piece_ids(self, pieces: list[str]) -> list[int]:
        """The ids of SentencePiece pieces (`id_to_piece`'s inverse); ValueError naming a
        piece that is not in the vocabulary, or a control symbol (padding, BOS, EOS), which
        no text holds."""
        ids = [self._sp.piece_to_id(p) for p in pieces]
        for p, i in zip(pieces, ids, strict=True):
            if i == UNK_ID and p != self._sp.id_to_piece(UNK_ID):
                raise ValueError(f"{p!r} is not a piece of this model's vocabulary")
            if i in (PAD_ID, BOS_ID, EOS_ID):
                raise ValueError(f"{p!r} is a control symbol, not a piece of a text")
        return ids

    def unknown_characters(self, text: str) -> list[str]:
        """The characters of `text` this vocabulary has no piece for, which SentencePiece
        encodes as <unk> (and decodes as "⁇"): each once, in order of appearance."""
        chars = list(dict.fromkeys(c for c in text if not c.isspace()))
        found = self._sp.encode(chars, out_type=int) if chars else []
        return [c for c, ids in zip(chars, found, strict=True) if UNK_ID in ids]

    def require_known(self, text: str, where: str, error: type[Exception] = ValueError) -> None:
        """Refuse (`error`, naming `where`) a text to force into a translation (a target
        prefix) that holds characters this vocabulary lacks: forced as <unk>, they would
        begin the translation with "⁇", as `piece_ids` refuses a piece it lacks."""
        unknown = self.unknown_characters(text)
        if unknown:
            them = "it" if len(unknown) == 1 else "them"
            raise error(f"{where}: {', '.join(map(repr, unknown[:10]))} not in this model's vocabulary: "
                        f"forced as <unk>, the translation would begin with '\u2047'; remove or replace {them}")

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of one text (for labelling attention plots)."""
        return self._sp.encode(text, out_type=str)

    # SentencePieceProcessor pickles on its own, but being explicit keeps datasets.map's
    # worker processes and its fingerprint hashing independent of that detail.
    def __getstate__(self) -> dict:
        return {"proto": self.proto}

    def __setstate__(self, state: dict) -> None:
        processor = spm.SentencePieceProcessor()
        processor.LoadFromSerializedProto(state["proto"])
        self._sp = processor


class VocabularyError(UserError, ValueError):
    """SentencePiece cannot make the vocabulary asked for from this text."""


def train_tokenizer(
    sentences: Iterable[str],
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    input_sentence_size: int = 1_000_000,
    seed: int = 0,
    setting: str = "vocab_size",
) -> Tokenizer:
    """Train a SentencePiece model on `sentences` (both languages mixed).

    At most `input_sentence_size` sentences are used, a seeded random sample: drawn here,
    because SentencePiece's own sampling differs from one process to the next even with
    `set_random_generator_seed`, and the same corpus should give the same vocabulary.
    A vocabulary size the text cannot support raises VocabularyError naming `setting`.
    A line every few seconds says how far it is (`heartbeat.Heartbeat`).
    """
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    progress = _Progress(vocab_size, model_type, input_sentence_size)
    try:
        with Heartbeat(progress.status, logger=log):
            sample = _reservoir_sample(progress.count(sentences, "read"), input_sentence_size, seed)
            progress.sampled = len(sample)
            spm.SentencePieceTrainer.train(
                sentence_iterator=progress.count(sample, "fed"),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                input_sentence_size=input_sentence_size,
                shuffle_input_sentence=True,
                seed_sentencepiece_size=1_000_000,
                normalization_rule_name="identity",  # corpus.normalize already applied NFC
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                pad_piece="<pad>",
                num_threads=2,
                minloglevel=2,
            )
    except RuntimeError as e:
        raise VocabularyError(_vocabulary_error(str(e), vocab_size, setting)) from None
    return Tokenizer.from_proto(model.getvalue())


class _Progress:
    """How far `train_tokenizer` is, for its heartbeat: the corpus read for the sample, the
    sample read by SentencePiece, then SentencePiece choosing the pieces."""

    def __init__(self, vocab_size: int, model_type: str, at_most: int) -> None:
        self.vocab_size, self.model_type, self.at_most = vocab_size, model_type, at_most
        self.read = self.fed = 0
        self.sampled: int | None = None  # the sample's size, once drawn

    def count(self, items: Iterable[str], what: str) -> Iterator[str]:
        """`items`, counted into `self.read` or `self.fed` as they are taken."""
        for item in items:
            setattr(self, what, getattr(self, what) + 1)
            yield item

    def status(self) -> str:
        if self.sampled is None:
            return f"tokenizer: drawing a sample of at most {self.at_most:,} sentences: {self.read:,} read"
        if self.fed < self.sampled:
            return f"tokenizer: SentencePiece reads the sample: {self.fed:,} of {self.sampled:,} sentences"
        return (f"tokenizer: SentencePiece chooses {self.vocab_size:,} {self.model_type} pieces from "
                f"{self.sampled:,} sentences")


def _vocabulary_error(message: str, vocab_size: int, setting: str) -> str:
    """SentencePiece's complaint about the vocabulary size, as a user-facing line."""
    if m := re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message):
        return (f"{setting}={vocab_size} is too small: the corpus has {m.group(2)} characters, "
                f"each a piece of its own, plus 4 special pieces; raise {setting}")
    if m := re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", message):
        return (f"{setting}={vocab_size} is too large for this corpus: SentencePiece can make "
                f"at most {m.group(2)} pieces from it; lower {setting}")
    return f"{setting}={vocab_size}: SentencePiece failed: {' '.join(message.split())}"


def _reservoir_sample(items: Iterable[str], k: int, seed: int) -> list[str]:
    """A uniform random sample of k items in one pass (Algorithm R), in input order."""
    rng = random.Random(seed)
    sample: list[tuple[int, str]] = []
    for i, item in enumerate(items):
        if i < k:
            sample.append((i, item))
        else:
            j = rng.randrange(i + 1)
            if j < k:
                sample[j] = (i, item)
    return [item for _, item in sorted(sample)]


def with_case_copies(sentences: Iterable[str], probability: float, seed: int = 0) -> Iterator[str]:
    """`sentences`, each followed by its upper-cased copy with `probability` and its
    title-cased copy with `probability` (`perturb.upper`, `perturb.title`; drawn in order
    from `seed`, so the same text gives the same copies). A copy equal to its sentence is
    left out. For a vocabulary that cuts text typed in capitals into pieces it has, not
    into single letters (`data.spm_case_copies`)."""
    rng = random.Random(seed)
    for sentence in sentences:
        yield sentence
        for change in (perturb.upper, perturb.title):
            if rng.random() < probability and (copy := change(sentence)) != sentence:
                yield copy


def tokenizer_key(
    corpus_digest: str,
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    input_sentence_size: int,
    case_copies: float = 0.0,
) -> str:
    """Cache key: the training text's digest plus every setting that shapes the model."""
    settings = (
        f"{TOKENIZER_RECIPE}|{vocab_size}|{model_type}|{character_coverage}|{input_sentence_size}"
    )
    if case_copies:  # off: the keys of the vocabularies made before the setting existed
        settings += f"|case_copies={case_copies}"
    return hashlib.sha256(f"{corpus_digest}|{settings}".encode()).hexdigest()[:16]


def load_or_train_tokenizer(
    sentences: Iterable[str],
    corpus_digest: str,
    cache_dir: str | os.PathLike,
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    input_sentence_size: int = 1_000_000,
    setting: str = "vocab_size",
    case_copies: float = 0.0,
) -> tuple[Tokenizer, Path]:
    """Reuse `{cache_dir}/spm-<key>.model` if this corpus and these settings made one before.

    `corpus_digest` must change whenever the training text changes (see `corpus.digest`).
    Returns the tokenizer and the path of its cached model. A cached model that does not
    load raises VocabularyError naming the file.
    """
    key = tokenizer_key(
        corpus_digest, vocab_size, model_type, character_coverage, input_sentence_size, case_copies
    )
    path = Path(cache_dir) / f"spm-{key}.model"
    if path.exists():
        log.info("reusing tokenizer %s", path)
        try:
            return Tokenizer.load(path), path
        except Exception as e:
            raise VocabularyError(f"corrupt cached tokenizer {path} ({' '.join(str(e).split())}): "
                                  f"delete it to rebuild it") from None
    log.info("training a %s tokenizer with %d pieces -> %s", model_type, vocab_size, path)
    if case_copies:
        sentences = with_case_copies(sentences, case_copies)
    tokenizer = train_tokenizer(
        sentences, vocab_size, model_type, character_coverage, input_sentence_size, setting=setting
    )
    tokenizer.save(path)
    return tokenizer, path
