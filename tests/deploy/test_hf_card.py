"""The model card of a transformers export: a YAML header the Hub reads, and what a reader
needs (class, sizes, data, recipe, scores with signatures, licences)."""

from __future__ import annotations

import yaml

from transformer.config import ModelConfig
from transformer.deploy.hf_card import CORPUS_LICENCES, model_card

RUN = {"data": {"src_lang": "it", "tgt_lang": "en", "corpora": {"europarl": 1.0, "tatoeba": 3.0}},
       "optim": {"lr": 0.002, "warmup_steps": 500, "label_smoothing": 0.1}}
META = {"step": 1246, "train_seconds": 3600.0, "best_bleu": 15.37}
REPORT = {"test_set": "tatoeba-test", "sentences": 8616, "decode": {"method": "beam"},
          "scores": {"BLEU": 31.5, "chrF2": 50.1},
          "signatures": {"BLEU": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1"}}


def header(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_the_header_is_yaml_the_hub_reads_with_one_bleu_per_report():
    card = model_card(ModelConfig(pre_norm=True), "PegasusForConditionalGeneration", RUN, META,
                      [REPORT, {**REPORT, "test_set": "flores200-devtest", "scores": {"BLEU": 20.0}}],
                      "cc-by-4.0")
    meta = header(card)
    assert meta["language"] == ["it", "en"] and meta["license"] == "cc-by-4.0"
    assert meta["pipeline_tag"] == "translation" and meta["library_name"] == "transformers"
    results = meta["model-index"][0]["results"]
    assert [r["metrics"][0]["value"] for r in results] == [31.5, 20.0]
    assert [r["dataset"]["name"] for r in results] == ["tatoeba-test", "flores200-devtest"]


def test_the_body_names_the_class_the_recipe_the_scores_and_the_corpora_licences():
    card = model_card(ModelConfig(pre_norm=False, d_model=256), "MarianMTModel", RUN, META, [REPORT], "mit")
    assert "`MarianMTModel`" in card and "post-norm" in card and "| d_model / heads / d_ff | 256 /" in card
    assert "1246 updates in 1.0 h" in card and "best dev BLEU 15.37" in card
    assert REPORT["signatures"]["BLEU"] in card and "| 31.5 |" in card
    assert CORPUS_LICENCES["tatoeba"] in card and CORPUS_LICENCES["europarl"] in card


def test_without_reports_or_run_config_the_card_says_what_it_lacks():
    card = model_card(ModelConfig(), "PegasusForConditionalGeneration", {}, {}, [], "unknown")
    assert "model-index" not in header(card)
    assert "No test scores were given" in card and "training progress not recorded" in card
