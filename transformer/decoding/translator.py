"""`Translator`: the package's Python face, text in and text out, as `mt-translate` does it.

    from transformer import Translator

    translator = Translator.load("runs/tatoeba_cpu/checkpoints/best")  # or an mt-export directory
    translator.translate(["Ciao, come stai?", "Che ore sono?"])         # ["Hi, how are you?", ...]
    translator.translate(lines, method="greedy", max_len_b=20)          # any decode.* setting
    translator.translate(lines, nbest=3, return_scores=True)            # [[Translation(text, score), ...], ...]
    for text in translator.translate_iterable(open("news.it")):         # lazily, a batch at a time
        print(text)
    translator.score(["Ciao!"], ["Hi!"])                                # the model's score of a translation

What fairseq's `from_pretrained(...).translate()` and CTranslate2's `Translator` do, on
this project's library: `load` reads a checkpoint directory or a CTranslate2 export,
`translate` is `text.translate_nbest` (normalise, split into sentences, batch by length,
search, rejoin), so a list of lines translates exactly as `mt-translate` translates the
same lines from a file with the same settings; `translate_iterable` is
`stream.iter_nbest` (what mt-translate runs), `score` is `scoring.score_lines`. The
settings are `config.DecodeConfig`'s fields by name, checked as mt-translate checks them;
a bad one raises `ConfigError` naming the keyword (`beam_size=0: must be >= 1`).

Nothing here changes the process: `threads` holds for the translator's own calls only
(`arguments.torch_threads`), and glibc's allocator is left as it is (the `mt-*`
commands, which own their process, tune it: `device.keep_large_blocks_in_the_heap`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import torch

from transformer.checkpoint import load_model
from transformer.config import ConfigError, DecodeConfig, at_most_workers, check_device, positive
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.arguments import (
    SETTINGS,
    as_arguments,
    check_lines,
    check_path,
    decode_config,
    torch_threads,
)
from transformer.decoding.ct2_model import CT2Model, is_export, load_export
from transformer.decoding.scoring import score_lines
from transformer.decoding.stream import input_ready, iter_nbest
from transformer.decoding.text import decode_settings, translate_nbest
from transformer.device import resolve_device
from transformer.model.transformer import Transformer

__all__ = ["SETTINGS", "Translation", "Translator", "decode_config"]


@dataclass(frozen=True)
class Translation:
    """A translation and its score: the search's own, the sum of the log-probabilities of
    its tokens and EOS over GNMT's length penalty ((5 + |y|) / 6) ** lenpen; for a line of
    several sentences, the sum of its sentences' scores. `Translator.score` gives the same
    number for the same text."""

    text: str
    score: float


class Translator:
    """A model and its tokenizer, ready to translate lines of Italian into English.

    Build one with `Translator.load(path)`. `model` is a `Transformer` (in eval mode) or,
    for an export, a `ct2_model.CT2Model`; `tokenizer` the SentencePiece model that came
    with it; `device` where it runs; `decode` the settings `translate` starts from;
    `threads` torch's threads during its calls (None: torch's own setting).

    One Translator may serve several threads at once if they share its `threads` (torch's
    thread count is the process's: calls with different counts would change each other's).
    """

    def __init__(self, model: Transformer | CT2Model, tokenizer: Tokenizer, *,
                 device: torch.device | str | None = None, decode: DecodeConfig | None = None,
                 path: Path | None = None, threads: int | None = None) -> None:
        """A Translator for a model already in memory (`load` reads one from disk).

        Args:
            model: a `Transformer` or a `ct2_model.CT2Model`.
            tokenizer: the model's SentencePiece tokenizer.
            device: where the model is; None: where its weights are.
            decode: the settings `translate` starts from (checked here); None:
                `DecodeConfig()`.
            path: the directory the model came from, if any (for `repr`).
            threads: torch's intra-op threads during this translator's calls, restored
                after each; None: leave torch's setting alone. (An export's threads are
                its own: `load`'s `threads`.)
        """
        model = getattr(model, "module", model)  # DistributedDataParallel wraps the model
        if device is None:
            device = model.device if isinstance(model, CT2Model) else next(model.parameters()).device
        with as_arguments():
            positive("threads", threads, optional=True)
            self.decode = decode_config(DecodeConfig() if decode is None else decode, {})
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.path = path
        self.threads = None if isinstance(model, CT2Model) else threads

    @classmethod
    def load(cls, path: str | Path, *, device: str | torch.device = "auto", precision: str = "auto",
             threads: int | None = None, **settings: Any) -> Translator:
        """Load a checkpoint directory or a CTranslate2 export (`mt-export`).

        Args:
            path: a checkpoint directory (`model.safetensors`, `model.json`,
                `tokenizer.model`) or an export directory (`export.json` beside
                CTranslate2's files).
            device: `auto` (CUDA where there is a GPU, else the CPU), `cpu`, `cuda` or
                `cuda:N` (or a `torch.device`): mt-translate's `device`.
            precision: `auto` (bf16 on a GPU that has it, else fp16; bf16 on a CPU with
                native bf16, else fp32), `fp32`, `bf16` or `fp16` (CUDA only):
                mt-translate's `decode.precision`. An export computes in the type it was
                exported with and takes only `auto`.
            threads: CPU threads. A checkpoint: torch's, set for each of the translator's
                calls and restored after it (None: torch's setting as it is). An export:
                CTranslate2's workers, its own (None: 2). mt-translate's `threads`.
            **settings: defaults for `translate`, by `DecodeConfig` field name
                (`method="greedy"`, `beam_size=8`, ...; `nbest` is `translate`'s alone).

        Returns:
            A Translator holding the model, its tokenizer and the checked settings.

        Raises:
            CheckpointError: `path` is not a checkpoint directory or an export, or is
                incomplete or corrupt (the message names the path).
            ConfigError: a bad device, thread count or setting (the message names the
                keyword), or an export that needs ctranslate2 (`pip install -e ".[ct2]"`).
        """
        with as_arguments():
            if "nbest" in settings:
                raise ConfigError("nbest: give it to translate(), whose result it shapes")
            device = str(device)  # a torch.device too
            check_device("device", device)
            positive("threads", threads, optional=True)
            at_most_workers("threads", threads)
            decode = decode_config(DecodeConfig(), {**settings, "precision": precision})
            where = check_path(path)  # all of the above before any work
            if is_export(where):
                model, tokenizer, torch_device = load_export(where, device, threads)
            else:
                torch_device = resolve_device(device, key="device")
                model, tokenizer = load_model(where, torch_device)
            decode_settings(decode, torch_device, model)  # what depends on the device and the model
        return cls(model, tokenizer, device=torch_device, decode=decode, path=where, threads=threads)

    # One str gives one result, an iterable a list; nbest makes each result a list, and
    # return_scores a Translation (or a list of them) where a str would be.
    @overload
    def translate(self, lines: str, *, nbest: None = None, return_scores: Literal[False] = False,
                  **settings: Any) -> str: ...
    @overload
    def translate(self, lines: str, *, nbest: int, return_scores: Literal[False] = False,
                  **settings: Any) -> list[str]: ...
    @overload
    def translate(self, lines: str, *, nbest: None = None, return_scores: Literal[True],
                  **settings: Any) -> Translation: ...
    @overload
    def translate(self, lines: str, *, nbest: int, return_scores: Literal[True],
                  **settings: Any) -> list[Translation]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: None = None,
                  return_scores: Literal[False] = False, **settings: Any) -> list[str]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: int, return_scores: Literal[False] = False,
                  **settings: Any) -> list[list[str]]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: None = None, return_scores: Literal[True],
                  **settings: Any) -> list[Translation]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: int, return_scores: Literal[True],
                  **settings: Any) -> list[list[Translation]]: ...

    def translate(self, lines: str | Iterable[str], *, nbest: int | None = None,
                  return_scores: bool = False, **settings: Any) -> Any:
        """Translate lines, as `mt-translate` translates the lines of a file.

        Each line is normalised and split into sentences, which are translated together
        (batched by length) and joined again: one translation per line, in input order;
        an empty line gives "". A line break inside a line is a space. All lines are read
        first (`translate_iterable` reads a batch's worth at a time).

        Args:
            lines: the Italian lines; a single string is one line.
            nbest: None: each line's best translation. k: each line's k best, best first,
                as a list (mt-translate's `decode.nbest`; needs `method="beam"` and
                k <= beam_size; an empty line gives [""]).
            return_scores: give `Translation(text, score)`s instead of strings: the
                search's length-normalised score; for a line of several sentences, the sum
                of theirs (n-best: the k-th entry joins the sentences' k-th hypotheses).
                An empty line scores 0.0.
            **settings: decode settings for this call, by `DecodeConfig` field name:
                `method` ("beam" or "greedy"), `beam_size`, `lenpen`, `max_len_a`,
                `max_len_b`, `min_len`, `max_tokens`, `precision`, `split_sentences`.
                Those not given are the Translator's (`load`'s settings, else the
                defaults: beam 5, lenpen 0.6).

        Returns:
            A list with one result per line (for a single string, its result): a str, a
            `Translation` with `return_scores`, and with `nbest` a list of those.

        Raises:
            ConfigError: a bad setting (the message names the keyword, e.g. `beam_size=0`).
            TypeError: a line that is not a str, or bytes given for lines.
        """
        check_lines(lines)
        single = isinstance(lines, str)
        batch = [lines] if single else list(lines)  # type: ignore[list-item]
        for i, line in enumerate(batch):
            if not isinstance(line, str):
                raise TypeError(f"line {i + 1} is a {type(line).__name__}, not a str")
        cfg = self._config(settings, nbest)
        with as_arguments(), torch_threads(self.threads):
            found = translate_nbest(self.model, self.tokenizer, batch, cfg, self.device)
        out = [_shaped(hyps, nbest, return_scores) for hyps in found]
        return out[0] if single else out

    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: None = None,
                           return_scores: Literal[False] = False, **settings: Any) -> Iterator[str]: ...
    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: int,
                           return_scores: Literal[False] = False, **settings: Any) -> Iterator[list[str]]: ...
    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: None = None,
                           return_scores: Literal[True], **settings: Any) -> Iterator[Translation]: ...
    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: int, return_scores: Literal[True],
                           **settings: Any) -> Iterator[list[Translation]]: ...

    def translate_iterable(self, lines: Iterable[str], *, nbest: int | None = None,
                           return_scores: bool = False, **settings: Any) -> Iterator[Any]:
        """Translate any iterable of lines lazily: one result per line, in input order.

        Lines are read a decoding batch's worth at a time (`decode.max_tokens` source
        tokens, at most that many lines), translated together as `translate` translates
        them, and given back before more are read: a generator of a million lines is
        never held whole, and the first results come after the first batch. From a file
        object with a descriptor (`sys.stdin`, a pipe), a batch is also closed when no
        further line is waiting, so an interactive input gets each line back at once.

        Args:
            lines: any iterable of str (not a single str: that is `translate`'s).
            nbest, return_scores, **settings: as for `translate`; the settings are
                checked here, before any line is read.

        Returns:
            An iterator over the lines' results, as `translate` gives them.

        Raises:
            ConfigError: a bad setting, here (named by its keyword).
            TypeError: a str or bytes given for lines, here; a line that is not a str,
                when the iterator reaches it.
        """
        check_lines(lines)
        if isinstance(lines, str):
            raise TypeError("translate_iterable takes an iterable of lines; for one str use "
                            "translate(line)")
        cfg = self._config(settings, nbest)
        with as_arguments():
            found = iter_nbest(self.model, self.tokenizer, lines, cfg, self.device,
                               ready=input_ready(lines), around=lambda: torch_threads(self.threads))
        return self._results(found, nbest, return_scores)

    def _results(self, found: Iterator[list[tuple[str, float]]], nbest: int | None,
                 return_scores: bool) -> Iterator[Any]:
        with as_arguments():  # errors raised while the lines are read and translated
            for hyps in found:
                yield _shaped(hyps, nbest, return_scores)

    @overload
    def score(self, sources: str, targets: str, **settings: Any) -> float: ...
    @overload
    def score(self, sources: Iterable[str], targets: Iterable[str], **settings: Any) -> list[float]: ...

    def score(self, sources: str | Iterable[str], targets: str | Iterable[str],
              **settings: Any) -> float | list[float]:
        """The model's score of each given translation, as the search scores its own:
        `translate(line, return_scores=True).score` for the text it gave back.

        The log-probabilities of the translation's tokens and EOS (teacher forcing),
        summed and divided by GNMT's length penalty ((5 + |y|) / 6) ** lenpen. A line is
        split into sentences as `translate` splits it and its translation by the same
        splitter; each sentence is scored against its part and the scores summed. A line
        whose translation does not split into as many sentences as the source is scored
        whole (with a warning naming it); an empty line with an empty translation scores
        0.0. The translation is tokenised again, so a text `translate` gave back scores
        what its search scored when SentencePiece encodes the text to the same pieces
        (almost always; a string the model spelt in unusual pieces can differ).

        Args:
            sources: the Italian lines (a single str: one line).
            targets: their translations, one per source line (a single str with a str).
            **settings: decode settings by name, as for `translate`: `lenpen`,
                `split_sentences`, `max_tokens` (per batch) and `precision` apply, and for
                an export `min_len` (CTranslate2's search renormalises the steps before it).

        Returns:
            A float per line (for a single str, one float).

        Raises:
            ConfigError: a bad setting.
            TypeError: lines that are not str, or a str beside a list.
            ValueError: sources and targets of different lengths, or a translation longer
                than the model writes.
        """
        for given, name in ((sources, "sources"), (targets, "targets")):
            check_lines(given, name)
        single = isinstance(sources, str)
        if single != isinstance(targets, str):
            raise TypeError("give sources and targets both as a str, or both as lists of str")
        src = [sources] if single else list(sources)  # type: ignore[list-item]
        tgt = [targets] if single else list(targets)  # type: ignore[list-item]
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} sources but {len(tgt)} targets: give one translation "
                             "per source line")
        for name, lines in (("sources", src), ("targets", tgt)):
            for i, line in enumerate(lines):
                if not isinstance(line, str):
                    raise TypeError(f"{name}[{i}] is a {type(line).__name__}, not a str")
        cfg = self._config(settings, None)
        with as_arguments(), torch_threads(self.threads):
            cfg = decode_settings(cfg, self.device, self.model)
            scores = score_lines(self.model, self.tokenizer, src, tgt, cfg, self.device)
        return scores[0] if single else scores

    def _config(self, settings: dict[str, Any], nbest: int | None) -> DecodeConfig:
        """This call's settings, checked (a ConfigError names the keyword)."""
        with as_arguments():
            if nbest is not None:
                settings = {**settings, "nbest": nbest}
            return decode_config(self.decode, settings)

    def __repr__(self) -> str:
        return (f"Translator({str(self.path)!r}, device={self.device}, "
                f"precision={self.decode.precision})")


def _shaped(hyps: list[tuple[str, float]], nbest: int | None, scores: bool) -> Any:
    """A line's n-best list as `translate` returns it."""
    if nbest is None:
        return Translation(*hyps[0]) if scores else hyps[0][0]
    return [Translation(*h) for h in hyps] if scores else [text for text, _ in hyps]
