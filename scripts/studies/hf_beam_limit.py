"""Where beam search (lenpen 0) and a transformers export's `generate()` disagree, both
outputs scored by our model, with and without the closing EOS's log-probability.

    python scripts/studies/hf_beam_limit.py CHECKPOINT EXPORT [--lines 200]
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForSeq2SeqLM

from transformer.checkpoint import load_model
from transformer.config import DecodeConfig
from transformer.data.batching import pad
from transformer.data.corpus import read_lines
from transformer.data.sentences import encode_sources
from transformer.decoding.search import max_lengths
from transformer.deploy.hf_check import compare, generate_like, ours
from transformer.paths import project_path


def scores(model, src: list[int], tokens: list[int]) -> tuple[float, float]:
    """Sum of the tokens' log-probabilities, without and with the closing EOS."""
    tgt_in = torch.tensor([[model.cfg.bos_id, *tokens]])
    logp = model(torch.tensor([src]), tgt_in).log_softmax(-1)[0]
    each = [float(logp[i, t]) for i, t in enumerate([*tokens, model.cfg.eos_id])]
    return sum(each[:-1]), sum(each)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("export")
    parser.add_argument("--test", default=str(project_path("../shared/data/eval/tatoeba-test.it")))
    parser.add_argument("--lines", type=int, default=200)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model, tokenizer = load_model(args.checkpoint)
    hf = AutoModelForSeq2SeqLM.from_pretrained(args.export).eval()
    src = encode_sources(tokenizer, read_lines(args.test)[: args.lines], model.cfg.max_positions)
    beam = DecodeConfig(method="beam", beam_size=5, lenpen=0.0)
    mine, theirs = ours(model, src, beam), generate_like(hf, src, beam, model.cfg)
    limits = max_lengths(model, pad(src, model.cfg.pad_id), beam.max_len_a, beam.max_len_b, beam.min_len).tolist()
    result = compare(mine, theirs)
    print(f"{result.equal} of {result.total} alike")
    for i in result.differing:
        (a0, a1), (b0, b1) = scores(model, src[i], mine[i]), scores(model, src[i], theirs[i])
        print(f"line {i + 1}: limit {limits[i]}, lengths {len(mine[i])} and {len(theirs[i])}; without EOS "
              f"ours {a0:.2f}, generate() {b0:.2f}; with EOS ours {a1:.2f}, generate() {b1:.2f}")


if __name__ == "__main__":
    main()
