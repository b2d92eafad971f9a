"""`Translator`: the package's Python face, text in and text out, as `mt-translate` does it.

    from transformer import Translator

    translator = Translator.load("runs/tatoeba_cpu/checkpoints/best")  # or an mt-export directory
    translator.translate(["Ciao, come stai?", "Che ore sono?"])         # ["Hi, how are you?", ...]
    translator.translate(lines, method="greedy", max_len_b=20)          # any decode.* setting
    translator.translate(lines, beam_size=8, nbest=3)                   # three hypotheses per line

What fairseq's `from_pretrained(...).translate()` and CTranslate2's `Translator` do, on
this project's library: `load` is `text.load_for_inference` (a checkpoint directory or a
CTranslate2 export), `translate` is `text.translate_nbest` (normalise, split into
sentences, batch by length, search, rejoin), so a list of lines translates exactly as
`mt-translate` translates the same lines from a file with the same settings. The settings
are `config.DecodeConfig`'s fields by name, checked as mt-translate checks them: a bad one
raises `ConfigError` naming mt-translate's key (`decode.beam_size=0: must be >= 1`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from omegaconf.errors import OmegaConfBaseException

from transformer.checkpoint import MODEL_CFG, CheckpointError
from transformer.config import (
    ConfigError,
    DecodeConfig,
    at_most_workers,
    check_device,
    omegaconf_error_line,
    positive,
    to_dataclass,
)
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.ct2_model import EXPORT_INFO, CT2Model, is_export
from transformer.decoding.text import decode_settings, load_for_inference, translate_nbest
from transformer.model.transformer import Transformer

SETTINGS = tuple(f.name for f in fields(DecodeConfig))  # the keywords `load` and `translate` take


@dataclass
class _Settings:
    """mt-translate's `decode` group alone, so that errors name its keys (`decode.lenpen`)."""

    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def validate(self) -> None:
        self.decode.validate("decode")


def decode_config(base: DecodeConfig, settings: dict[str, Any]) -> DecodeConfig:
    """`base` with `settings` (DecodeConfig fields by name) in its place, checked as
    mt-translate checks its `decode.*` overrides: types, finite numbers, ranges.

    Args:
        base: the settings to start from.
        settings: DecodeConfig field names and values (`beam_size=8`, `method="greedy"`).

    Returns:
        A new, checked DecodeConfig (device-dependent defaults still `auto`/None:
        `text.decode_settings` fills them in).

    Raises:
        ConfigError: an unknown name or a bad value; the message names the key.
    """
    unknown = [name for name in settings if name not in SETTINGS]
    if unknown:
        raise ConfigError(f"decode.{unknown[0]}: not a decode setting; the settings are "
                          f"{', '.join(SETTINGS)}")
    try:
        return to_dataclass(_Settings, {"decode": {**asdict(base), **settings}}).decode
    except OmegaConfBaseException as e:  # a value of the wrong type: one line naming the key
        raise ConfigError(omegaconf_error_line(e)) from None


def _check_path(path: str | Path) -> Path:
    """`path` as a Path, if it is a checkpoint directory or an export; else CheckpointError."""
    if not str(path):
        raise CheckpointError("no checkpoint given: Translator.load(path) takes a checkpoint "
                              "directory or a CTranslate2 export (mt-export)")
    where = Path(path).expanduser()
    if not where.is_dir():
        kind = "not a directory" if where.exists() else "no such directory"
        raise CheckpointError(f"{path}: {kind}; Translator.load takes a checkpoint directory "
                              "or a CTranslate2 export (mt-export)")
    if not is_export(where) and not (where / MODEL_CFG).is_file():
        raise CheckpointError(f"{path} is neither a checkpoint directory (it has no {MODEL_CFG}) "
                              f"nor a CTranslate2 export (no {EXPORT_INFO})")
    return where


def _as_lines(lines: Any) -> tuple[list[str], bool]:
    """`translate`'s argument as a list of lines, and whether it was a single str; a
    TypeError naming the argument or the line for anything else (bytes: decode them)."""
    def wrong(what: str, value: Any, wanted: str) -> TypeError:
        hint = ": decode it first (.decode('utf-8'))" if isinstance(value, (bytes, bytearray, memoryview)) else ""
        return TypeError(f"{what} is a {type(value).__name__}, not {wanted}{hint}")

    if isinstance(lines, str):
        return [lines], True
    if isinstance(lines, (bytes, bytearray, memoryview)) or not isinstance(lines, Iterable):
        raise wrong("lines", lines, "a str or an iterable of str")
    batch = list(lines)
    for i, line in enumerate(batch):
        if not isinstance(line, str):
            raise wrong(f"line {i + 1}", line, "a str")
    return batch, False


class Translator:
    """A model and its tokenizer, ready to translate lines of Italian into English.

    Build one with `Translator.load(path)`. `model` is a `Transformer` (in eval mode) or,
    for an export, a `ct2_model.CT2Model`; `tokenizer` the SentencePiece model that came
    with it; `device` where it runs; `decode` the settings `translate` starts from.
    """

    def __init__(self, model: Transformer | CT2Model, tokenizer: Tokenizer, *,
                 device: torch.device | str | None = None, decode: DecodeConfig | None = None,
                 path: Path | None = None) -> None:
        """A Translator for a model already in memory (`load` reads one from disk).

        Args:
            model: a `Transformer` or a `ct2_model.CT2Model`.
            tokenizer: the model's SentencePiece tokenizer.
            device: where the model is; None: where its weights are.
            decode: the settings `translate` starts from (checked here); None:
                `DecodeConfig()`.
            path: the directory the model came from, if any (for `repr`).
        """
        model = getattr(model, "module", model)  # DistributedDataParallel wraps the model
        if device is None:
            device = model.device if isinstance(model, CT2Model) else next(model.parameters()).device
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.decode = decode_config(DecodeConfig() if decode is None else decode, {})
        self.path = path

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        device: str = "auto",
        precision: str = "auto",
        threads: int | None = None,
        **settings: Any,
    ) -> Translator:
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
            threads: CPU threads: torch's (`torch.set_num_threads`, for the whole
                process) for a checkpoint, CTranslate2's workers for an export; None:
                torch's default, 2 for an export. mt-translate's `threads`.
            **settings: defaults for `translate`, by `DecodeConfig` field name
                (`method="greedy"`, `beam_size=8`, ...; `nbest` is `translate`'s alone).

        Returns:
            A Translator holding the model, its tokenizer and the checked settings.

        Raises:
            CheckpointError: `path` is not a checkpoint directory or an export, or is
                incomplete or corrupt (the message names the path).
            ConfigError: a bad device, thread count or setting (the message names the key),
                or an export that needs ctranslate2 (`pip install -e ".[ct2]"`).
        """
        if "nbest" in settings:
            raise ConfigError("decode.nbest: give nbest to translate(), whose result it shapes")
        device = str(device)  # a torch.device too
        check_device("device", device)
        positive("threads", threads, optional=True)
        at_most_workers("threads", threads)
        decode = decode_config(DecodeConfig(), {**settings, "precision": precision})
        where = _check_path(path)  # all of the above before any work
        model, tokenizer, torch_device = load_for_inference(str(where), device, threads)
        decode_settings(decode, torch_device, model)  # what depends on the device and the model
        return cls(model, tokenizer, device=torch_device, decode=decode, path=where)

    def translate(self, lines: str | Iterable[str], *, nbest: int | None = None,
                  **settings: Any) -> list[str] | list[list[str]] | str:
        """Translate lines, as `mt-translate` translates the lines of a file.

        Each line is normalised and split into sentences, which are translated together
        (batched by length) and joined again: one translation per line, in input order;
        an empty line gives "". A line break inside a line is a space.

        Args:
            lines: the Italian lines; a single string is one line.
            nbest: None: each line's best translation. k: each line's k best, best first,
                as a list (mt-translate's `decode.nbest`; needs `method="beam"` and
                k <= beam_size; an empty line gives [""]).
            **settings: decode settings for this call, by `DecodeConfig` field name:
                `method` ("beam" or "greedy"), `beam_size`, `lenpen`, `max_len_a`,
                `max_len_b`, `min_len`, `max_tokens`, `precision`, `split_sentences`.
                Those not given are the Translator's (`load`'s settings, else the
                defaults: beam 5, lenpen 0.6).

        Returns:
            A list with one string per line; with `nbest`, one list of strings per line.
            For a single string, its translation (or its list).

        Raises:
            ConfigError: a bad setting (the message names mt-translate's key, e.g.
                `decode.beam_size`).
            TypeError: `lines` or one of them is not a str (bytes included).
        """
        batch, single = _as_lines(lines)
        if nbest is not None:
            settings = {**settings, "nbest": nbest}
        cfg = decode_config(self.decode, settings)
        found = translate_nbest(self.model, self.tokenizer, batch, cfg, self.device)
        out = [[text for text, _ in hyps] for hyps in found] if nbest is not None \
            else [hyps[0][0] for hyps in found]
        return out[0] if single else out

    def __repr__(self) -> str:
        return (f"Translator({str(self.path)!r}, device={self.device}, "
                f"precision={self.decode.precision})")
