"""The model card (README.md) of a transformers export (`hf_export.py`).

The Hub reads its YAML header (languages, licence, task, scores); people read the rest:
the class that holds the model and why it is exact, how to load and run it, the data and
recipe it was trained with (the checkpoint's config.yaml), and the test scores of the
given reports of `mt-evaluate`, each with its sacrebleu signature.
"""

from __future__ import annotations

import json

from transformer.config import ModelConfig

USAGE = """\
```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{path}")
model = AutoModelForSeq2SeqLM.from_pretrained("{path}")
batch = tokenizer(["Il gatto dorme sul divano."], return_tensors="pt", padding=True)
out = model.generate(**batch)                      # beam {beam}, as generation_config.json says
greedy = model.generate(**batch, num_beams=1)      # greedy search
print(tokenizer.batch_decode(out, skip_special_tokens=True))
```
"""


# The licences of the corpora the project's data presets name (data/README.md and the
# shared data's README say where each comes from).
CORPUS_LICENCES = {
    "tatoeba": "Tatoeba: CC-BY 2.0 FR (attribution: the Tatoeba project and its contributors)",
    "europarl": "Europarl: no known copyright restrictions (Koehn, statmt.org)",
    "opus100": "OPUS-100: the licences of its OPUS sources",
    "iwslt2017": "IWSLT 2017: CC BY-NC-ND 4.0",
}


def model_card(cfg: ModelConfig, architecture: str, run: dict, meta: dict, reports: list[dict],
               license: str, path: str = "path/to/this/folder") -> str:
    """README.md for an export of a model with `cfg`, held by the transformers class
    `architecture`; run: the checkpoint's resolved run config ({} if none); meta: its
    meta.json (step, training time, best dev BLEU); reports: mt-evaluate reports;
    license: the Hub's licence identifier."""
    data, optim = run.get("data", {}), run.get("optim", {})
    src, tgt = data.get("src_lang", "it"), data.get("tgt_lang", "en")
    header = {"language": [src, tgt], "license": license, "library_name": "transformers",
              "pipeline_tag": "translation", "tags": ["translation", architecture]}
    lines = ["---", *(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in header.items())]
    lines += [*_model_index(reports, src, tgt), "---", ""]
    norm = "pre-norm" if cfg.pre_norm else "post-norm (as in the paper)"
    lines += [
        f"# {src}→{tgt} Transformer ({architecture})", "",
        f"An encoder-decoder Transformer (Vaswani et al. 2017), {norm}, trained from scratch "
        f"and exported with `mt-export format=hf`. transformers holds it as `{architecture}`: "
        "the same layers, with the hidden units in another order (its sinusoidal positions "
        "lay out the sines and cosines in two halves), so it computes the same function.", "",
        "| setting | value |", "|---|---|",
        f"| class | `{architecture}` |",
        f"| layers | {cfg.n_encoder_layers} encoder + {cfg.n_decoder_layers} decoder |",
        f"| d_model / heads / d_ff | {cfg.d_model} / {cfg.n_heads} / {cfg.d_ff} |",
        f"| vocabulary | {cfg.vocab_size} SentencePiece pieces, shared by both languages |",
        f"| embeddings | {'tied (source, target, output)' if cfg.tie_embeddings else 'separate'} |",
        f"| longest sequence | {cfg.max_positions} tokens |", "",
        "## Use", "", USAGE.format(path=path, beam=_beam(run)),
        "The tokenizer adds no `</s>` to the source (the model was trained without it) and "
        "expects text as training saw it: Unicode NFC, one space between words. Greedy "
        "search gives the translations of the training project's greedy search; beam "
        "search scores by the sum of log-probabilities (`length_penalty=0`), the "
        "project's `decode.lenpen=0`.", "",
        "## Training", "",
        f"- data: {_data(data)}",
        f"- optimiser: Adam, lr {optim.get('lr', '?')}, {optim.get('warmup_steps', '?')} "
        f"warm-up steps, label smoothing {optim.get('label_smoothing', '?')}",
        f"- dropout {cfg.dropout}; {_progress(meta)}", "",
        "## Scores", "", *_scores(reports), "",
        "## Licence", "",
        f"The weights: `{license}`. The training data keep their own licences; check them "
        "before redistributing.", "", *_licences(data),
    ]
    return "\n".join(lines)


def _beam(run: dict) -> int:
    return int(run.get("decode", {}).get("beam_size", 5))


def _progress(meta: dict) -> str:
    """How far training went, from the checkpoint's meta.json."""
    if "step" not in meta:
        return "training progress not recorded"
    hours = meta.get("train_seconds", 0) / 3600
    bleu = meta.get("best_bleu")
    dev = f"; best dev BLEU {bleu:.2f} (greedy, during training)" if bleu is not None else ""
    return f"{meta['step']} updates in {hours:.1f} h of training{dev}"


def _licences(data: dict) -> list[str]:
    names = list(data.get("corpora") or {}) or [str(data.get("name", ""))]
    return [f"- {CORPUS_LICENCES[n]}" for n in names if n in CORPUS_LICENCES]


def _data(data: dict) -> str:
    corpora = data.get("corpora") or {}
    if corpora:
        return ", ".join(f"{name} (weight {w})" for name, w in corpora.items())
    return str(data.get("name", "unknown"))


def _scores(reports: list[dict]) -> list[str]:
    """A table of the reports' BLEU and chrF with their signatures."""
    if not reports:
        return ["No test scores were given to the export (mt-evaluate writes them)."]
    rows = ["| test set | sentences | search | BLEU | chrF2 | sacrebleu signature (BLEU) |",
            "|---|---|---|---|---|---|"]
    for r in reports:
        scores, decode = r.get("scores", {}), r.get("decode", {})
        rows.append(f"| {r.get('test_set', '?')} | {r.get('sentences', '?')} | "
                    f"{decode.get('method', '?')} | {scores.get('BLEU', '?')} | "
                    f"{scores.get('chrF2', '?')} | `{r.get('signatures', {}).get('BLEU', '?')}` |")
    return rows


def _model_index(reports: list[dict], src: str, tgt: str) -> list[str]:
    """The Hub's `model-index` entries: one BLEU result per report."""
    if not reports:
        return []
    lines = ["model-index:", "- name: transformer-mt", "  results:"]
    for r in reports:
        bleu = r.get("scores", {}).get("BLEU")
        lines += ["  - task: {type: translation, name: Translation " + f"{src}-{tgt}" + "}",
                  "    dataset: {type: " + json.dumps(str(r.get("test_set", "test"))) + ", name: "
                  + json.dumps(str(r.get("test_set", "test"))) + "}",
                  "    metrics:", f"    - {{type: bleu, value: {bleu}, name: BLEU}}"]
    return lines
