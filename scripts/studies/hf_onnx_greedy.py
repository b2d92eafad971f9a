"""Greedy translations of an ONNX export, run by onnxruntime through optimum: the ONNX half
of scripts/studies/hf_export_check.py, which calls it with `--onnx-python`.

It runs in a Python environment that has optimum's ONNX exporter, which this project's
does not (optimum-onnx 0.1 requires transformers < 4.58; the project's is 5.x), and it
imports nothing from the project:

    python -m venv /tmp/onnx-env
    /tmp/onnx-env/bin/pip install torch "optimum-onnx[onnxruntime]" "transformers<4.58" sentencepiece
    /tmp/onnx-env/bin/optimum-cli export onnx --model exports/tatoeba_hf \
        --task text2text-generation-with-past exports/tatoeba_onnx
    /tmp/onnx-env/bin/python scripts/studies/hf_onnx_greedy.py exports/tatoeba_onnx in.json out.json

in.json: {"src": [[ids], ...], "max_length": [n, ...]} (source ids without BOS or EOS, and
each sentence's `generate()` max_length: BOS, our length limit, EOS); out.json: the
generated id sequences, in input order.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
from optimum.onnxruntime import ORTModelForSeq2SeqLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("onnx_dir", help="an optimum ONNX export of the transformers folder")
    parser.add_argument("inputs", help="in.json: src and max_length")
    parser.add_argument("output", help="out.json: the generated sequences")
    args = parser.parse_args()
    with open(args.inputs) as f:
        data = json.load(f)
    model = ORTModelForSeq2SeqLM.from_pretrained(args.onnx_dir)
    pad_id = model.config.pad_token_id
    groups = defaultdict(list)
    for i, n in enumerate(data["max_length"]):
        groups[n].append(i)
    out = [None] * len(data["src"])
    for max_length, rows in groups.items():
        width = max(len(data["src"][i]) for i in rows)
        ids = torch.tensor([data["src"][i] + [pad_id] * (width - len(data["src"][i])) for i in rows])
        generated = model.generate(input_ids=ids, attention_mask=(ids != pad_id).long(),
                                   num_beams=1, do_sample=False, max_length=max_length,
                                   min_new_tokens=1)
        for i, seq in zip(rows, generated.tolist(), strict=True):
            out[i] = seq
    with open(args.output, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
