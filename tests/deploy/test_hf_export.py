"""mt-export format=hf: transformers loads the folder and computes and searches what our
model does.

The models are random tiny ones with every parameter perturbed, in the four variants
post-/pre-norm x tied/untied embeddings (tests/deploy/test_ct2_export.py's `tiny_model`),
and `end_sentences` makes most of their searches end on their own, so that both the
length limit and a natural EOS are exercised.
"""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open

from transformer.checkpoint import save_checkpoint
from transformer.config import ConfigError, DecodeConfig
from transformer.data.batching import pad
from transformer.data.sentences import encode_sources
from transformer.deploy.ct2_export import ExportConfig
from transformer.deploy.hf_check import compare, generate_like, logit_gap, ours
from transformer.deploy.hf_export import CLASSES, HF_FILES, hidden_permutation
from transformer.outputs import OutputError

from helpers import EXPORT_VARIANTS
from helpers import perturbed_model as tiny_model

transformers = pytest.importorskip("transformers", minversion="5")

from transformer.commands.export import export  # noqa: E402


def export_hf(model, tokenizer, where, **settings):
    """Save `model` as a checkpoint under `where` and export it with format=hf."""
    ckpt = save_checkpoint(where / "ckpt", model, tokenizer, "", {})
    return export(ExportConfig(checkpoint=str(ckpt), output=str(where / "hf"), format="hf", **settings))


@pytest.fixture(scope="module", params=list(EXPORT_VARIANTS), ids=list(EXPORT_VARIANTS))
def pair(request, tokenizer, tmp_path_factory):
    """Our model, its export folder and the export loaded by transformers, per variant."""
    model = tiny_model(tokenizer.vocab_size, *EXPORT_VARIANTS[request.param])
    path = export_hf(model, tokenizer, tmp_path_factory.mktemp(request.param))
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    return model, path, hf


def test_the_class_follows_the_norm_placement(pair):
    model, path, hf = pair
    assert type(hf).__name__ == CLASSES[model.cfg.pre_norm][1]
    card = (path / "README.md").read_text()
    assert f"`{type(hf).__name__}`" in card


def test_teacher_forced_logits_agree_within_1e_4(pair):
    """A padded batch: sources and targets of different lengths, one of length 1."""
    model, _, hf = pair
    src = pad([[5, 6, 7, 8, 9, 10, 11], [12], [40, 50, 60, 70]], 0)
    tgt = pad([[2, 20, 21, 22, 23], [2, 30, 31], [2]], 0)
    assert logit_gap(model, hf, src, tgt) < 1e-4


@pytest.mark.parametrize("limit", ["ours", "one"])
def test_greedy_generate_equals_ours(pair, tokenizer, lines, limit):
    """Within our length limit, a * |x| + b per sentence (a call per limit, on a few
    lines), or one limit for all (one padded batch of them all)."""
    model, _, hf = pair
    cfg = DecodeConfig(method="greedy")
    if limit == "one":
        cfg = replace(cfg, max_len_a=0.0, max_len_b=40)
    src = encode_sources(tokenizer, lines[:12] if limit == "ours" else lines, model.cfg.max_positions)
    mine = ours(model, src, cfg)
    assert compare(mine, generate_like(hf, src, cfg, model.cfg)).differing == []
    assert sum(len(t) < 1.2 * len(s) + 10 for t, s in zip(mine, src)) >= 5  # not all at the limit


def test_beam_generate_equals_ours_without_length_penalty(pair, tokenizer, lines):
    model, _, hf = pair
    src = encode_sources(tokenizer, lines, model.cfg.max_positions)
    cfg = DecodeConfig(method="beam", beam_size=5, lenpen=0.0, max_len_a=0.0, max_len_b=40)
    assert compare(ours(model, src, cfg), generate_like(hf, src, cfg, model.cfg)).differing == []
    with pytest.raises(ValueError, match=r"lenpen=0\.6"):
        generate_like(hf, src, replace(cfg, lenpen=0.6), model.cfg)


def test_generation_config_is_our_beam_without_length_penalty(pair, tokenizer, lines):
    """generate() with nothing but the folder's generation_config.json: our beam search
    (lenpen 0) within the positional table."""
    model, path, hf = pair
    saved = json.loads((path / "generation_config.json").read_text())
    assert saved["num_beams"] == 5 and saved["length_penalty"] == 0.0
    assert saved["decoder_start_token_id"] == model.cfg.bos_id
    src = encode_sources(tokenizer, lines[:8], model.cfg.max_positions)
    cfg = DecodeConfig(method="beam", beam_size=5, lenpen=0.0, max_len_a=0.0,
                       max_len_b=model.cfg.max_positions - 1)
    src_ids = pad(src, 0)
    with torch.no_grad():
        out = hf.generate(input_ids=src_ids, attention_mask=(src_ids != 0).long())
    theirs = [seq[1:seq.index(3)] if 3 in seq else seq[1:] for seq in out.tolist()]
    assert ours(model, src, cfg) == theirs


def test_tokenizer_loads_offline_and_encodes_and_decodes_as_ours(pair, tokenizer, lines, monkeypatch):
    model, path, _ = pair

    def no_network(*args, **kwargs):
        raise AssertionError("the tokenizer tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    assert len(hf_tok) == tokenizer.vocab_size  # no token added
    assert (hf_tok.pad_token_id, hf_tok.unk_token_id, hf_tok.bos_token_id, hf_tok.eos_token_id) == (0, 1, 2, 3)
    src = encode_sources(tokenizer, lines, model.cfg.max_positions)
    assert hf_tok(lines)["input_ids"] == src  # no </s> appended: what our model was trained on
    mine = ours(model, src, DecodeConfig(method="greedy"))
    generated = [[model.cfg.bos_id, *t, model.cfg.eos_id] for t in mine]
    assert hf_tok.batch_decode(generated, skip_special_tokens=True) == tokenizer.decode(mine)


def test_weights_are_safetensors_and_the_hidden_dimension_is_permuted(tokenizer, tmp_path):
    model = tiny_model(tokenizer.vocab_size, False, True)
    path = export_hf(model, tokenizer, tmp_path)
    assert sorted(p.name for p in path.iterdir()) == sorted([*HF_FILES, ".mt-output"])
    perm = hidden_permutation(model.cfg.d_model)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        shared = f.get_tensor("model.shared.weight")
        assert torch.equal(shared, model.src_embed.weight.detach()[:, perm])
        assert not f.get_tensor("final_logits_bias").any()
    assert sorted(perm.tolist()) == list(range(model.cfg.d_model))


def test_output_is_never_overwritten_unless_asked_and_never_if_not_an_export(tokenizer, tmp_path):
    model = tiny_model(tokenizer.vocab_size, True, True)
    path = export_hf(model, tokenizer, tmp_path)
    with pytest.raises(OutputError, match="output="):
        export_hf(model, tokenizer, tmp_path)
    assert export_hf(model, tokenizer, tmp_path, force=True) == path
    (path / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"notes\.txt"):
        export_hf(model, tokenizer, tmp_path, force=True)
    assert (path / "notes.txt").read_text() == "mine"


def test_settings_hf_cannot_take_are_refused_by_key():
    with pytest.raises(ConfigError, match="quantization='int8'"):
        ExportConfig(checkpoint="c", output="o", format="hf", quantization="int8").validate()
    with pytest.raises(ConfigError, match="license="):
        ExportConfig(checkpoint="c", output="o", format="hf", license="my licence").validate()


def test_model_card_quotes_the_models_evaluation_reports(tokenizer, tmp_path, monkeypatch):
    """mt-export format=hf puts the scores and signatures of the reports mt-evaluate wrote
    for the checkpoint (its outputs/eval folder) into the card, with the licence given."""
    monkeypatch.chdir(tmp_path)
    model = tiny_model(tokenizer.vocab_size, True, True)
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints" / "best", model, tokenizer, "", {})
    reports = tmp_path / "outputs" / "eval" / "run-best"
    reports.mkdir(parents=True)
    signature = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1"
    (reports / "tatoeba-test.beam.json").write_text(json.dumps(
        {"test_set": "tatoeba-test", "sentences": 8616, "decode": {"method": "beam"},
         "scores": {"BLEU": 31.5, "chrF2": 50.1}, "signatures": {"BLEU": signature}}))
    path = export(ExportConfig(checkpoint=str(ckpt), output="hf", format="hf", license="cc-by-4.0"))
    card = (path / "README.md").read_text()
    assert signature in card and "31.5" in card and 'license: "cc-by-4.0"' in card
