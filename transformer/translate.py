"""`mt-translate`: translate Italian text with a checkpoint (also `python -m transformer.translate`).

    echo "Ciao, come stai?" | mt-translate checkpoint=runs/tatoeba_cpu/checkpoints/best
    mt-translate checkpoint=CKPT input.file=news.it output=news.en decode=greedy
    mt-translate checkpoint=CKPT input.text="Che ore sono?" decode.nbest=3

One output line per input line, in input order; an empty input line gives an empty
output line. With decode.nbest > 1 each input gives nbest lines `i ||| hyp ||| score`
(fairseq's layout, i counting input lines from 0). `translate_lines` is the library
entry point (the trainer's dev BLEU uses it).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import hydra
import torch
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from transformer.checkpoint import CheckpointError, load_model
from transformer.config import DecodeConfig, to_dataclass
from transformer.corpus import PROJECT_ROOT, DataError, decode_lines, normalize, read_lines
from transformer.runtime import autocast, keep_large_blocks_in_the_heap, resolve_device
from transformer.search import search
from transformer.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class InputConfig:
    file: str | None = None  # read this file; neither file nor text: read stdin
    text: str | None = None  # translate this string (one line per line of it)


@dataclass
class TranslateConfig:
    checkpoint: str | None = None  # a checkpoint directory (required)
    input: InputConfig = field(default_factory=InputConfig)
    output: str | None = None  # write this file; null: stdout
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    progress: bool = True  # tqdm bar on stderr when translating a file
    decode: DecodeConfig = field(default_factory=DecodeConfig)


# ---- library ------------------------------------------------------------------------


def encode_sources(tokenizer: Tokenizer, lines: list[str], max_len: int) -> list[list[int]]:
    """Normalise as the training data was, encode, and cut to the model's `max_len`.

    The ids are what `batching.collate` puts on the source side: no BOS, no EOS.
    """
    ids = tokenizer.encode([normalize(line) for line in lines])
    too_long = [i for i, seq in enumerate(ids) if len(seq) > max_len]
    if too_long:
        shown = ", ".join(str(i + 1) for i in too_long[:10]) + (", ..." if len(too_long) > 10 else "")
        log.warning("%d input line(s) longer than the model's limit of %d tokens were "
                    "truncated (line %s)", len(too_long), max_len, shown)
    return [seq[:max_len] for seq in ids]


def length_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped, longest first, so that rows * longest length <= max_tokens.

    A sentence longer than max_tokens gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def pad(seqs: list[list[int]], pad_id: int) -> torch.Tensor:
    """Right-pad id lists to a (B, S) long tensor (S >= 1)."""
    out = torch.full((len(seqs), max(1, *map(len, seqs))), pad_id, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


def resolve(cfg: DecodeConfig, device: torch.device) -> DecodeConfig:
    """`cfg` with its device-dependent defaults filled in: precision auto -> bf16 on CUDA,
    fp32 on CPU; max_tokens null -> 8000 source tokens per batch on CUDA, 2000 on CPU."""
    precision = cfg.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"decode.precision={cfg.precision!r}: choose auto, fp32 or bf16")
    # Measured on the small model: on a CPU, batches of 2,000 source tokens decode greedy
    # and beam 5 about 1.16x faster than 8,000 (README, "Decoding speed").
    max_tokens = cfg.max_tokens
    if max_tokens is None:
        max_tokens = 8000 if device.type == "cuda" else 2000
    elif max_tokens < 1:
        raise ValueError(f"decode.max_tokens={max_tokens}: must be a positive number of "
                         "source tokens, or null for the device's default")
    return dataclasses.replace(cfg, precision=precision, max_tokens=max_tokens)


def translate_nbest(
    model,
    tokenizer: Tokenizer,
    lines: list[str],
    cfg: DecodeConfig,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> list[list[tuple[str, float]]]:
    """The n-best (text, score) list of every line, in input order.

    Empty lines are not decoded: they give [("", 0.0)]. The model is put in eval mode
    for the call and restored afterwards.
    """
    model = getattr(model, "module", model)  # DistributedDataParallel wraps the model
    device = torch.device(device) if device is not None else next(model.parameters()).device
    cfg = resolve(cfg, device)
    src = encode_sources(tokenizer, lines, model.cfg.max_len)
    results: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in lines]
    todo = [i for i, ids in enumerate(src) if ids]
    was_training = model.training
    model.eval()
    bar = tqdm(total=len(todo), unit="sent", file=sys.stderr, disable=not progress)
    with torch.inference_mode(), autocast(cfg.precision, device):
        for batch in length_batches([len(src[i]) for i in todo], cfg.max_tokens):
            index = [todo[j] for j in batch]
            src_ids = pad([src[i] for i in index], tokenizer.pad_id).to(device)
            for i, hyps in zip(index, search(model, src_ids, cfg), strict=True):
                texts = tokenizer.decode([h.tokens for h in hyps])
                results[i] = [(t, h.score) for t, h in zip(texts, hyps, strict=True)]
            bar.update(len(index))
    bar.close()
    model.train(was_training)
    return results


def translate_lines(
    model,
    tokenizer: Tokenizer,
    lines: list[str],
    cfg: DecodeConfig,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> list[str]:
    """The best translation of every line, in input order ("" for an empty line)."""
    return [hyps[0][0] for hyps in translate_nbest(model, tokenizer, lines, cfg, device, progress)]


def format_nbest(nbest: list[list[tuple[str, float]]]) -> list[str]:
    """fairseq-like n-best lines: `i ||| hypothesis ||| score`."""
    return [f"{i} ||| {text} ||| {score:.4f}"
            for i, hyps in enumerate(nbest) for text, score in hyps]


def load_for_inference(checkpoint: str | None, device_pref: str):
    """(model, tokenizer, device) from a checkpoint directory."""
    if not checkpoint:
        raise CheckpointError("no checkpoint given: add checkpoint=path/to/checkpoint_dir")
    device = resolve_device(device_pref)
    if device.type == "cpu":
        keep_large_blocks_in_the_heap()
    model, tokenizer = load_model(checkpoint, device)
    return model, tokenizer, device


# ---- command line -------------------------------------------------------------------


def read_input(cfg: InputConfig) -> list[str]:
    if cfg.file is not None and cfg.text is not None:
        raise ValueError("give input.file or input.text, not both")
    if cfg.text is not None:
        return cfg.text.split("\n")
    if cfg.file is not None:
        return read_lines(cfg.file)
    return decode_lines(sys.stdin.buffer, "<stdin>")


def write_output(lines: list[str], path: str | None) -> None:
    text = "".join(f"{line}\n" for line in lines)
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def translate(cfg: TranslateConfig) -> None:
    model, tokenizer, device = load_for_inference(cfg.checkpoint, cfg.device)
    lines = read_input(cfg.input)
    progress = cfg.progress and cfg.input.file is not None
    nbest = translate_nbest(model, tokenizer, lines, cfg.decode, device, progress)
    if cfg.decode.method == "beam" and cfg.decode.nbest > 1:
        write_output(format_nbest(nbest), cfg.output)
    else:
        write_output([hyps[0][0] for hyps in nbest], cfg.output)


C = TypeVar("C")
USER_ERRORS = (CheckpointError, DataError, OSError, OmegaConfBaseException, ValueError)


def run_cli(prog: str, schema: type[C], cfg: DictConfig, job: Callable[[C], object]) -> None:
    """Validate `cfg` against `schema` and run `job`; user errors exit with one clear line."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"{prog}: %(levelname)s: %(message)s")
    try:
        job(to_dataclass(schema, cfg))
    except USER_ERRORS as e:
        sys.exit(f"{prog}: error: {e}")


# An absolute config path: "../configs" is resolved as a Python package when main() is
# called from another module (tests, notebooks) rather than run as a script.
@hydra.main(config_path=str(PROJECT_ROOT / "configs"), config_name="translate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_cli("mt-translate", TranslateConfig, cfg, translate)


if __name__ == "__main__":
    main()
