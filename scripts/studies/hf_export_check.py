"""A checkpoint and its transformers export (`mt-export format=hf`) side by side on a test set.

    mt-export checkpoint=runs/tatoeba_cpu/checkpoints/best output=exports/tatoeba_hf format=hf
    python scripts/studies/hf_export_check.py runs/tatoeba_cpu/checkpoints/best exports/tatoeba_hf \
        --lines 200 [--onnx exports/tatoeba_onnx --onnx-python /tmp/onnx-env/bin/python] [--ct2]

On the first `--lines` lines of `--test` (tatoeba-test.it): how many translations
`generate()` makes exactly as our search does, greedy and beam 5 without a length penalty;
how many of our default beam search (GNMT lenpen 0.6) the folder's generation_config
gives; the largest difference of teacher-forced logits (our greedy outputs as targets,
fp32); whether the transformers tokenizer encodes the sources and decodes our outputs as
ours does. With --onnx: the greedy outputs of optimum's ONNX export, run by onnxruntime
in another environment (`hf_onnx_greedy.py` says how to make one). With --ct2: whether
CTranslate2's converter for transformers models converts the folder.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from transformer.checkpoint import load_model
from transformer.config import DecodeConfig
from transformer.data.batching import pad
from transformer.data.corpus import read_lines
from transformer.data.sentences import encode_sources
from transformer.decoding.search import max_lengths
from transformer.deploy.hf_check import compare, generate_like, logit_gap, ours
from transformer.device import describe_cpu
from transformer.paths import project_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("export", help="the mt-export format=hf folder of the checkpoint")
    parser.add_argument("--test", default=str(project_path("../shared/data/eval/tatoeba-test.it")))
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--onnx", help="optimum's ONNX export of the folder")
    parser.add_argument("--onnx-python", help="the Python of an environment with optimum-onnx")
    parser.add_argument("--ct2", action="store_true", help="try ct2-transformers-converter")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model, tokenizer = load_model(args.checkpoint)
    hf = AutoModelForSeq2SeqLM.from_pretrained(args.export).eval()
    hf_tok = AutoTokenizer.from_pretrained(args.export)
    lines = read_lines(args.test)[: args.lines]
    src = encode_sources(tokenizer, lines, model.cfg.max_positions)
    greedy = DecodeConfig(method="greedy")
    mine = ours(model, src, greedy)
    report = {"model": f"{args.checkpoint} ({type(hf).__name__})", "lines": len(src),
              "cpu": describe_cpu(), "torch": torch.__version__}
    report["greedy equal"] = compare(mine, generate_like(hf, src, greedy, model.cfg)).equal
    beam = DecodeConfig(method="beam", beam_size=5, lenpen=0.0)
    report["beam 5 lenpen 0 equal"] = compare(ours(model, src, beam),
                                              generate_like(hf, src, beam, model.cfg)).equal
    report["our default beam (lenpen 0.6) equal to generation_config"] = compare(
        ours(model, src, DecodeConfig()), _default_generate(hf, src, model.cfg)).equal
    targets = pad([[model.cfg.bos_id, *t] for t in mine], model.cfg.pad_id)
    report["max teacher-forced logit difference"] = max(
        logit_gap(model, hf, pad(src[i:i + 50], 0), targets[i:i + 50]) for i in range(0, len(src), 50))
    report["tokenizer encodes alike"] = sum(a == b for a, b in zip(hf_tok(lines)["input_ids"], src))
    decoded = hf_tok.batch_decode([[model.cfg.bos_id, *t, model.cfg.eos_id] for t in mine],
                                  skip_special_tokens=True)
    report["tokenizer decodes alike"] = sum(a == b for a, b in zip(decoded, tokenizer.decode(mine)))
    if args.onnx:
        report["onnx greedy equal"] = _onnx(args, model, src, mine)
    if args.ct2:
        report["ct2-transformers-converter"] = _ct2(args.export)
    print(json.dumps(report, indent=2))


def _default_generate(hf, src: list[list[int]], cfg) -> list[list[int]]:
    """generate() with the folder's generation_config only, a batch of 50 at a time."""
    out = []
    for i in range(0, len(src), 50):
        ids = pad(src[i:i + 50], cfg.pad_id)
        seqs = hf.generate(input_ids=ids, attention_mask=(ids != cfg.pad_id).long()).tolist()
        out += [s[1:s.index(cfg.eos_id)] if cfg.eos_id in s else s[1:] for s in seqs]
    return out


def _onnx(args, model, src: list[list[int]], mine: list[list[int]]) -> int:
    limits = max_lengths(model, pad(src, model.cfg.pad_id), 1.2, 10, 1).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        inputs, outputs = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inputs.write_text(json.dumps({"src": src, "max_length": [n + 2 for n in limits]}))
        script = Path(__file__).with_name("hf_onnx_greedy.py")
        subprocess.run([args.onnx_python, str(script), args.onnx, str(inputs), str(outputs)], check=True)
        theirs = json.loads(outputs.read_text())
    eos = model.cfg.eos_id
    theirs = [s[1:s.index(eos)] if eos in s else s[1:] for s in theirs]
    return compare(mine, theirs).equal


def _ct2(export: str) -> str:
    import ctranslate2

    with tempfile.TemporaryDirectory() as tmp:
        try:
            ctranslate2.converters.TransformersConverter(export).convert(tmp, force=True)
        except Exception as e:  # what the converter says is the finding
            return f"fails: {type(e).__name__}: {e}"
    return "converts"


if __name__ == "__main__":
    sys.exit(main())
