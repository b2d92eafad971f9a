"""`mt-translate`: translate Italian text with a checkpoint (also `python -m transformer.commands.translate`).

    echo "Ciao, come stai?" | mt-translate checkpoint=runs/tatoeba_cpu/checkpoints/best
    mt-translate checkpoint=CKPT input.file=news.it output=news.en decode=greedy
    mt-translate checkpoint=CKPT input.text="Che ore sono?" decode.nbest=3
    mt-translate checkpoint=EXPORT_DIR input.file=news.it       # a CTranslate2 export (mt-export)

One output line per input line, in input order; an empty input line gives an empty
output line. Each line is split into sentences, which are translated and joined again
(decode.split_sentences=false feeds every line whole); the summary line on stderr counts
both. With decode.nbest > 1 each input gives nbest lines `i ||| hyp ||| score`
(fairseq's layout, i counting input lines from 0). The input is read and translated a
decoding batch's worth at a time (`transformer.decoding.stream.iter_nbest`, what
`Translator.translate_iterable` runs): lines on stdout come as their batch is done, and
from an interactive stdin each line is translated as soon as nothing more is waiting.

`output=FILE` is checked before the model is loaded (`transformer/outputs.py`): a file
that exists is replaced only with force=true and only if mt-translate wrote it, never the
input itself; missing folders are made. The file is written whole or not at all. An
input file is read through once for bad bytes before the model is loaded; one that is not
a regular file (a FIFO, `/dev/stdin`, `<(...)`, `/dev/null`) is read once, as a stream
(whole, before the model is loaded, when `input.target_prefix_file` pairs its lines with
prefixes, which are counted against them). The prefix file is read once (it may be a
stream too); a prefix the model cannot force (characters its vocabulary lacks, more
pieces than it writes) is refused, naming its line, before any line is translated.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from omegaconf import DictConfig

from transformer import outputs
from transformer.checkpoint import find_checkpoint
from transformer.commands import cli
from transformer.config import (
    ConfigError,
    DecodeConfig,
    at_most_workers,
    check_device,
    positive,
    require,
)
from transformer.data.corpus import DataError, iter_decoded, iter_lines, normalize
from transformer.decoding.loading import in_decode_dtype, load_for_inference
from transformer.decoding.settings import decode_settings
from transformer.decoding.stream import input_ready, iter_nbest
from transformer.decoding.text import format_nbest

log = logging.getLogger(__name__)

@dataclass
class InputConfig:
    """What mt-translate reads: a file, a text, or stdin."""

    file: str | None = None
    """A UTF-8 file, one text per line (a sentence or a paragraph: decode.split_sentences);
    neither file nor text: stdin is read."""
    text: str | None = None
    """Translate this string (one output line per line of it)."""
    target_prefix_file: str | None = None
    """A UTF-8 file of target prefixes, one per input line (an empty line: none): each
    translation starts with its line's prefix (needs input.file or input.text)."""


@dataclass
class TranslateConfig:
    """The settings of mt-translate (configs/translate.yaml)."""

    checkpoint: str | None = None
    """Required: a checkpoint directory, a run directory (its best checkpoint, else its
    newest), or an mt-export directory."""
    input: InputConfig = field(default_factory=InputConfig)
    """What to translate."""
    output: str | None = None
    """A file to write; null: stdout. An existing file is refused (see force)."""
    force: bool = False
    """Replace output if an earlier mt-translate wrote it (never a file it did not write)."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    threads: int | None = None
    """CPU threads; null: torch's default for a checkpoint, 2 for an export (2
    single-threaded CTranslate2 workers)."""
    progress: bool = True
    """A progress bar on stderr when translating a file."""
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    """The search: the decode group."""

    def validate(self) -> None:
        require(bool(self.checkpoint), "checkpoint", self.checkpoint,
                "required: add checkpoint=path/to/checkpoint_dir")
        require(self.input.file is None or self.input.text is None, "input.text", self.input.text,
                "give input.file or input.text, not both")
        require(self.input.target_prefix_file is None or self.input.file is not None or
                self.input.text is not None, "input.target_prefix_file", self.input.target_prefix_file,
                "pairs its lines with input.file's or input.text's: give one of them")
        check_device("device", self.device)
        positive("threads", self.threads, optional=True)
        at_most_workers("threads", self.threads)
        self.decode.validate("decode")


def read_input(cfg: InputConfig) -> tuple[Iterable[str], Callable[[], bool] | None]:
    """The input's lines, read as they are needed, and whether more is waiting (stdin's
    `stream.input_ready`; None for a file or text, always at hand). A file is read through
    once first, so that a bad byte ends the command before the model is loaded."""
    if cfg.text is not None:
        return cfg.text.split("\n"), None
    if cfg.file is not None and not Path(cfg.file).expanduser().is_file():
        # a FIFO, /dev/stdin, <(...), /dev/null: it can be read once, as it comes, as stdin is
        try:
            stream = Path(cfg.file).expanduser().open("rb")
        except OSError as e:
            raise ConfigError(f"input.file={cfg.file}: cannot be read ({e.strerror or e})") from e
        return iter_decoded(stream, cfg.file), None
    if cfg.file is not None:
        for _ in iter_lines(cfg.file):  # DataError naming file:line
            pass
        return iter_lines(cfg.file), None
    if sys.stdin is None:  # started with stdin closed (<&-)
        raise ConfigError("stdin is closed and no input was given: add input.file=FILE or "
                          "input.text=...")
    return iter_decoded(sys.stdin.buffer, "<stdin>"), input_ready(sys.stdin)


def read_prefixes(cfg: InputConfig, lines: Iterable[str]) -> tuple[Iterable[str], list[str | None] | None]:
    """input.target_prefix_file's lines (None for an empty one), read once (a FIFO or
    `<(...)` too), and the input's lines, checked to be as many, before the model is
    loaded. A streamed input (a FIFO, `/dev/stdin`, `<(...)`) can be read only once: with
    prefixes it is read whole here, to be counted, and its lines are returned as a list."""
    if cfg.target_prefix_file is None:
        return lines, None
    prefixes = [line if line.strip() else None for line in iter_lines(cfg.target_prefix_file)]  # file:line
    if cfg.text is not None:
        count = len(cfg.text.split("\n"))
    elif Path(cfg.file).expanduser().is_file():  # type: ignore[arg-type]
        count = sum(1 for _ in iter_lines(cfg.file))  # type: ignore[arg-type]
    else:
        lines = list(lines)
        count = len(lines)
    if len(prefixes) != count:
        raise ConfigError(f"input.target_prefix_file={cfg.target_prefix_file} has {len(prefixes)} line(s) and "
                          f"the input {count}: give one prefix line (or an empty one) per input line")
    return lines, prefixes


def check_prefixes(prefixes: list[str | None], tokenizer, max_positions: int, file: str) -> None:
    """Refuse, before translating, a prefix line the model cannot force: characters its
    vocabulary lacks (they would be <unk>), or more pieces than it writes (file:line)."""
    for n, text in enumerate(prefixes, start=1):
        if text is None:
            continue
        tokenizer.require_known(normalize(text), f"{file}:{n}", DataError)
        pieces = len(tokenizer.encode([normalize(text)])[0])
        if pieces > max_positions - 1:
            raise DataError(f"{file}:{n}: a target prefix of {pieces} tokens, above this model's limit of "
                            f"{max_positions - 1} (model.max_positions={max_positions}, one of them the BOS): "
                            "shorten it")


def output_of(cfg: TranslateConfig) -> outputs.Output | None:
    """The output file, checked (None for stdout), and the inputs: before any work."""
    outputs.check_input(cfg.checkpoint, "checkpoint", is_dir=True)
    outputs.check_input(cfg.input.file, "input.file")
    outputs.check_input(cfg.input.target_prefix_file, "input.target_prefix_file")
    if cfg.output is None:
        return None
    out = outputs.Output.of(cfg.output, "output", "mt-translate", force=cfg.force)
    outputs.check(out, inputs=[cfg.input.file, cfg.input.target_prefix_file, cfg.checkpoint])
    return out


def write_lines(lines: Iterable[list[str]], out: outputs.Output | None) -> None:
    """Each group of output lines as it comes: to stdout, flushed per group, or into the
    output file, which is put in place (whole) when the last group is written."""
    if out is not None:
        with outputs.write_file(out) as tmp, tmp.open("w", encoding="utf-8") as f:
            for group in lines:
                f.writelines(f"{line}\n" for line in group)
        return
    try:
        for group in lines:
            sys.stdout.write("".join(f"{line}\n" for line in group))
            sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


def translate(cfg: TranslateConfig) -> None:
    cfg = dataclasses.replace(cfg, checkpoint=str(find_checkpoint(cfg.checkpoint)))  # a run: its best
    out = output_of(cfg)
    lines, ready = read_input(cfg.input)  # before loading the model: a bad input costs nothing
    lines, prefixes = read_prefixes(cfg.input, lines)
    if cfg.output is None and sys.stdout is None:  # started with stdout closed (>&-)
        raise ConfigError("stdout is closed: add output=FILE")
    model, tokenizer, device = load_for_inference(cfg.checkpoint, cfg.device, cfg.threads)
    if prefixes is not None:  # before any line is translated
        check_prefixes(prefixes, tokenizer, model.cfg.max_positions, cfg.input.target_prefix_file)
    decode = decode_settings(cfg.decode, device, model)  # once for the command
    model = in_decode_dtype(model, decode)  # the weights cast once: no window casts them again
    progress = cfg.progress and cfg.input.file is not None and Path(cfg.input.file).expanduser().is_file()
    start, counts = time.perf_counter(), {"lines": 0, "sentences": 0}
    found = iter_nbest(model, tokenizer, lines, decode, device, ready=ready, progress=progress, counts=counts,
                       prefixes=None if prefixes is None else iter(prefixes))
    write_lines(_formatted(found, cfg.decode.nbest > 1), out)
    log.info("translated %d line(s), %d sentence(s) in %.1f s", counts["lines"],
             counts["sentences"], time.perf_counter() - start)


def _formatted(found: Iterator[list[tuple[str, float]]], nbest: bool) -> Iterator[list[str]]:
    """Each line's output lines: its best translation, or its `i ||| hyp ||| score` lines."""
    for i, hyps in enumerate(found):
        yield format_nbest([hyps], start=i) if nbest else [hyps[0][0]]


# An absolute config path: "../configs" is resolved as a Python package when main() is
# called from another module (tests, notebooks) rather than run as a script.
@hydra.main(config_path=cli.CONFIG_PATH, config_name="translate", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    cli.run_command("mt-translate", TranslateConfig, cfg, translate)



def main() -> None:
    """The `mt-translate` console script."""
    cli.hydra_entry("mt-translate", hydra_main, TranslateConfig)


if __name__ == "__main__":
    main()
