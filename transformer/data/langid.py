"""Language identification of many sentences at once, with py3langid's model.

py3langid (a fork of Lui and Baldwin's langid.py, 2012) scores a text with a naive Bayes
model over byte n-grams, found by walking a finite automaton over the text's bytes. Its
`classify` walks one text at a time in Python, byte by byte; `LanguageId` walks a whole
chunk of texts in step, one NumPy gather per byte position over the texts still that
long, and scores them with one weighted sum of the model's rows per text: the same
languages and probabilities (tests/data/test_langid.py compares them with py3langid's
own), at a fraction of the cost (docs/results/filters.md). The model ships inside the
package (a NumPy archive, never a pickle); it is loaded once per process.
"""

from __future__ import annotations

import functools
import itertools
import unicodedata
from collections.abc import Sequence

import numpy as np
import torch

from transformer.data.corpus import DataError

MAX_BYTES = 2048  # a text's first bytes that are read: a huge line costs no more than this
# Texts walked together: at most this many bytes (and features, 8 bytes each, times a few)
BATCH_BYTES = 4_000_000
NO_FEATURES = -1  # `classify`'s language index for a text with no n-gram the model knows


class LanguageId:
    """py3langid's model, with normalised probabilities (its `norm_probs=True`)."""

    def __init__(self) -> None:
        try:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier
        except ImportError:
            raise DataError("data.filters.langid needs py3langid: pip install 'transformer-mt[filters]'") from None
        model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        self.languages: list[str] = list(model.nb_classes)
        self.nextmove = np.asarray(model.tk_nextmove)  # automaton: state row x byte -> state
        self.rowbase = np.asarray(model.tk_row, dtype=np.int64) << 8
        self.output = np.asarray(model.tk_output, dtype=np.int64)  # state -> feature, or -1
        self.ptc = torch.from_numpy(np.asarray(model.nb_ptc, dtype=np.float32))  # features x languages
        self.pc = torch.from_numpy(np.asarray(model.nb_pc, dtype=np.float32))  # languages
        first: dict[str, int] = {}
        self.aliases: list[tuple[int, int]] = []  # a label of two columns (a script alias): (first, other)
        for i, language in enumerate(self.languages):
            if language in first:
                self.aliases.append((first[language], i))
            first.setdefault(language, i)

    def classify(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each text's most probable language (an index into `languages`, or NO_FEATURES
        for a text without any n-gram the model knows) and its probability."""
        probs, featureless = self.probabilities(texts)
        best, best_index = probs.max(dim=1)
        index = best_index.numpy().copy()
        index[featureless] = NO_FEATURES
        return index, best.numpy()

    def probabilities(self, texts: Sequence[str]) -> tuple[torch.Tensor, np.ndarray]:
        """Each text's probability of each language (texts x languages; a script alias's
        column is folded into its language's and holds 0), and which texts have no n-gram
        the model knows (their probabilities are uniform)."""
        data = [_encode(t) for t in texts]
        lengths = np.array([len(b) for b in data], dtype=np.int64)
        # groups of at most BATCH_BYTES (a text's bytes bound the features it yields)
        group = np.concatenate([[0], np.cumsum(lengths)[:-1]]) // BATCH_BYTES
        cuts = [0, *np.flatnonzero(np.diff(group)) + 1, len(texts)]
        probs, featureless = [], []
        for a, b in itertools.pairwise(cuts):
            rows, features = self._walk(data[a:b], lengths[a:b])
            scores = self._scores(rows, features, b - a)
            scores *= torch.from_numpy(1.0 / np.sqrt(np.maximum(lengths[a:b], 1)).astype(np.float32))[:, None]
            probs.append(torch.softmax(scores, dim=1))
            featureless.append(np.bincount(rows, minlength=b - a) == 0)
        out = torch.cat(probs) if probs else torch.zeros(0, len(self.languages))
        for i, j in self.aliases:
            out[:, i] += out[:, j]
            out[:, j] = 0.0
        return out, np.concatenate(featureless) if featureless else np.zeros(0, dtype=bool)

    def _walk(self, data: list[bytes], lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The automaton run over every text in step: (text, feature) of each feature seen."""
        order = np.argsort(-lengths, kind="stable")  # longest first: the texts still going are a prefix
        flat = np.frombuffer(b"".join(data[i] for i in order), dtype=np.uint8)
        starts = np.concatenate([[0], np.cumsum(lengths[order])[:-1]]).astype(np.int64)
        going = lengths[order]
        state = np.zeros(len(data), dtype=np.int64)
        rows, features = [], []
        for t in range(int(going[0]) if len(data) else 0):
            n = int(np.searchsorted(-going, -t, side="left"))  # texts longer than t
            state[:n] = self.nextmove[self.rowbase[state[:n]] + flat[starts[:n] + t]]
            out = self.output[state[:n]]
            hit = np.flatnonzero(out >= 0)
            rows.append(order[hit])
            features.append(out[hit])
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(rows), np.concatenate(features)

    def _scores(self, rows: np.ndarray, features: np.ndarray, n: int) -> torch.Tensor:
        """Naive Bayes log scores (texts x languages): log(1 + count) of each feature times
        its row of the model, plus the priors; zero for a text without features (py3langid's
        uniform abstention)."""
        n_features = self.ptc.shape[0]
        keys, counts = np.unique(rows * n_features + features, return_counts=True)
        text, feature = keys // n_features, keys % n_features
        starts = np.searchsorted(text, np.arange(n))  # each text's first (text, feature) entry
        scores = torch.nn.functional.embedding_bag(
            torch.from_numpy(feature), self.ptc, torch.from_numpy(starts), mode="sum",
            per_sample_weights=torch.from_numpy(np.log1p(counts).astype(np.float32)))
        featureless = torch.from_numpy(np.bincount(text, minlength=n) == 0)
        return torch.where(featureless[:, None], 0.0, scores + self.pc)


def _encode(text: str) -> bytes:
    """py3langid's input: an all-capitals text lower-cased, NFC, UTF-8; its first MAX_BYTES."""
    if text.isupper():
        text = text.lower()
    return unicodedata.normalize("NFC", text).encode("utf-8", errors="surrogatepass")[:MAX_BYTES]


@functools.cache
def language_id() -> LanguageId:
    """The process's model (a worker loads it once, on its first chunk)."""
    return LanguageId()
