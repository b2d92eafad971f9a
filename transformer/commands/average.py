"""`mt-average`: average the weights of several checkpoints (fairseq's average_checkpoints).

    mt-average runs/tatoeba_cpu --last 5 -o runs/tatoeba_cpu/checkpoints/avg_last5
    mt-average CKPT_A CKPT_B CKPT_C -o runs/tatoeba_cpu/checkpoints/avg

Averaging the last few checkpoints of a run smooths out the noise of the final updates
and usually adds a little BLEU (Vaswani et al. 2017, section 6.1, averaged the last 5 or
20). Every parameter and buffer is the arithmetic mean over the checkpoints, computed in
float64 and stored in the original dtype. The result is a complete checkpoint directory
(weights, model config, tokenizer, the newest input's run config) without trainer state:
it translates and evaluates like any other, but training cannot resume from it.

The output is checked before anything is loaded (`transformer/outputs.py`): it must be a
new path (or an empty directory), never a run directory, a checkpoints folder, a path
inside a run other than a new checkpoint in its checkpoints folder, or an input; `--force` replaces only an earlier average (its `.mt-output` marker says so).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from transformer import outputs
from transformer.checkpoint import (
    RUN_CFG,
    CheckpointError,
    load_meta,
    load_model,
    step_checkpoints,
    write_checkpoint_files,
)
from transformer.commands import cli
from transformer.data.tokenizer import Tokenizer
from transformer.model.transformer import Transformer


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The newest `n` step checkpoints of a run directory, oldest first."""
    found = step_checkpoints(run_dir)
    if len(found) < n:
        raise CheckpointError(f"{run_dir} has {len(found)} step checkpoints, fewer than --last {n}")
    return found[-n:]


@torch.no_grad()
def average_checkpoints(paths: list[Path]) -> tuple[Transformer, Tokenizer]:
    """The model whose weights are the mean of the checkpoints' weights, and its tokenizer.

    All checkpoints must share the model config and the tokenizer.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    model, tokenizer = load_model(paths[0])
    total = {k: v.double() for k, v in model.state_dict().items()}
    for path in paths[1:]:
        other, other_tok = load_model(path)
        if other.cfg != model.cfg:
            raise CheckpointError(f"{path} has model config {other.cfg}, "
                                  f"but {paths[0]} has {model.cfg}")
        if other_tok.proto != tokenizer.proto:
            raise CheckpointError(f"{path} has a different tokenizer than {paths[0]}")
        for k, v in other.state_dict().items():
            total[k] += v.double()
    # Tied matrices appear under several keys; each copy receives the same mean.
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    model.load_state_dict({k: (v / len(paths)).to(dtypes[k]) for k, v in total.items()})
    return model, tokenizer


def average(paths: list[Path], output: Path, force: bool = False) -> Path:
    """Average `paths` into a new checkpoint directory `output` (checked first: see the
    module's docstring); returns its path."""
    out = outputs.Output.of(output, "-o", "mt-average", is_dir=True, force=force, checkpoint=True)
    outputs.check(out, inputs=paths)
    model, tokenizer = average_checkpoints(paths)
    newest = paths[-1]
    run_cfg = newest / RUN_CFG
    meta = {"averaged_from": [str(p) for p in paths]}
    if (newest / "meta.json").is_file() and "step" in (newest_meta := load_meta(newest)):
        meta["step"] = newest_meta["step"]
    with outputs.write_dir(out) as tmp:
        write_checkpoint_files(tmp, model, tokenizer, run_cfg.read_text() if run_cfg.is_file() else "",
                               meta)
    return output


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 1, as in every mt-* command."""

    def error(self, message: str):  # type: ignore[override]
        sys.exit(f"{self.prog}: error: {message} (see {self.prog} --help)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog="mt-average", description="Average the weights of several checkpoints.")
    parser.add_argument("inputs", nargs="+", type=Path,
                        help="checkpoint directories, or one run directory with --last")
    parser.add_argument("--last", type=int, default=None,
                        help="average the newest N step checkpoints of the run directory")
    parser.add_argument("-o", "--output", type=Path, required=True,
                        help="the checkpoint directory to write: a new path, or an empty directory")
    parser.add_argument("--force", action="store_true",
                        help="replace the output if it is an earlier mt-average output")
    args = parser.parse_args(argv)
    if args.last is not None and (len(args.inputs) != 1 or args.last < 1):
        parser.error("--last N takes one run directory and N >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    paths = cli.run("mt-average", lambda: last_checkpoints(args.inputs[0], args.last)
                    if args.last else args.inputs)
    out = cli.run("mt-average", lambda: average(paths, args.output, args.force))
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {out}")


if __name__ == "__main__":
    main()
