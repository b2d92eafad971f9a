"""mt-export and ct2.CT2Model: a CTranslate2 export computes and searches what our model does.

The models are random tiny ones with every parameter perturbed (non-zero biases,
LayerNorm weights away from 1, a non-zero padding embedding), in the four variants
post-/pre-norm x tied/untied embeddings, so that no part of the conversion passes by
accident. `end_sentences` gives them an EOS that wins at about one decoding step in ten,
so that hypotheses end on their own; without it a random model writes until the length
limit, the other case.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from transformer.checkpoint import save_checkpoint
from transformer.commands import evaluate, translate
from transformer.config import ConfigError, DecodeConfig, to_dataclass
from transformer.data.batching import pad
from transformer.data.corpus import read_lines
from transformer.data.sentences import encode_sources, fit
from transformer.data.tokenizer import train_tokenizer
from transformer.decoding import text as decoding
from transformer.decoding.search import length_penalty, max_lengths, search
from transformer.model.transformer import Transformer
from transformer.outputs import OutputError
from transformer.paths import PROJECT_ROOT

from helpers import EXPORT_VARIANTS
from helpers import perturbed_model as tiny_model

ctranslate2 = pytest.importorskip("ctranslate2")

from transformer.commands.export import export  # noqa: E402
from transformer.decoding.ct2_model import CT2Model  # noqa: E402  (after the skip: it needs ctranslate2)
from transformer.deploy.ct2_export import (  # noqa: E402
    CheckpointConverter,
    ExportConfig,
    ExportError,
)

ROOT = PROJECT_ROOT
SAMPLE = ROOT / "data" / "sample"
# The four variants post-/pre-norm x tied/untied, with seeds that end most searches early.
VARIANTS = EXPORT_VARIANTS


def export_model(model: Transformer, tokenizer, where: Path, quantization: str = "none"):
    """Save `model` as a checkpoint under `where` and export it: (checkpoint, export) paths."""
    ckpt = save_checkpoint(where / "ckpt", model, tokenizer, "", {})
    return ckpt, export(ExportConfig(checkpoint=str(ckpt), output=str(where / "export"),
                                     quantization=quantization))


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def pair(request, tokenizer, tmp_path_factory) -> tuple[Transformer, CT2Model]:
    """Our model and its CTranslate2 export, for each variant."""
    model = tiny_model(tokenizer.vocab_size, *VARIANTS[request.param])
    _, path = export_model(model, tokenizer, tmp_path_factory.mktemp(request.param))
    return model, CT2Model(path, "cpu", threads=1)


# A padded batch: sources and targets of different lengths, one of each of length 1.
SRC = [[5, 6, 7, 8, 9, 10, 11], [12], [40, 50, 60, 70], [100, 101, 102, 103, 104, 105, 106, 107, 108]]
TGT = [[20, 21, 22, 23], [30, 31, 32], [33], [34, 35, 36, 37, 38, 39, 41, 42]]


def our_log_probs(model: Transformer, src: list[list[int]], tgt: list[list[int]]) -> list[list[float]]:
    """log_softmax of our logits at each target token and the final EOS, on a padded batch."""
    cfg = model.cfg
    tgt_in = pad([[cfg.bos_id, *t] for t in tgt], cfg.pad_id)
    with torch.no_grad():
        log_probs = F.log_softmax(model(pad(src, cfg.pad_id), tgt_in), dim=-1)  # (B, T, V)
    return [[log_probs[b, i, tok].item() for i, tok in enumerate([*t, cfg.eos_id])]
            for b, t in enumerate(tgt)]


def max_difference(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v))


def test_teacher_forced_log_probs_equal_ours(pair):
    model, ct2 = pair
    assert max_difference(ct2.score(SRC, TGT), our_log_probs(model, SRC, TGT)) < 1e-4


def ct2_table(max_len: int, d: int) -> torch.Tensor:
    """CTranslate2's own sinusoidal table (src/layers/common.cc): sines then cosines, from
    position 1, frequencies stepped by log(1e4) / (d/2 - 1)."""
    inv = torch.exp(torch.arange(d // 2) * -(math.log(1e4) / (d // 2 - 1)))
    angles = torch.arange(1, max_len + 1)[:, None] * inv
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def test_position_table_is_ours_not_ctranslate2s(tokenizer, tmp_path):
    model = tiny_model(tokenizer.vocab_size, pre_norm=False, tie=True)
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    spec = CheckpointConverter.from_model(model, pieces)._load()
    for table in (spec.encoder.position_encodings.encodings, spec.decoder.position_encodings.encodings):
        assert torch.equal(torch.from_numpy(table), model.sinusoids)  # interleaved, from 0
    assert not torch.allclose(ct2_table(64, 32), model.sinusoids, atol=0.1)

    class WithCT2Table(CheckpointConverter):  # what leaving the table to CTranslate2 gives
        def positions(self):
            return ct2_table(self.cfg.max_positions, self.cfg.d_model).numpy()

    WithCT2Table.from_model(model, pieces).convert(str(tmp_path / "ct2_table"))
    info = {"model": asdict(model.cfg), "quantization": "none"}
    (tmp_path / "ct2_table" / "export.json").write_text(json.dumps(info))
    wrong = CT2Model(tmp_path / "ct2_table", threads=1)
    assert max_difference(wrong.score(SRC, TGT), our_log_probs(model, SRC, TGT)) > 1e-2


def test_layer_norm_eps_is_written_and_is_what_ctranslate2_reads(pair, tmp_path):
    model, ct2 = pair
    eps = {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}
    config = json.loads((ct2.path / "config.json").read_text())
    assert eps == {config["layer_norm_epsilon"]} == {1e-5}
    # CTranslate2 applies the value written there: a large one moves the outputs.
    changed = tmp_path / "eps"
    changed.mkdir()
    for f in ct2.path.iterdir():
        (changed / f.name).write_bytes(f.read_bytes())
    (changed / "config.json").write_text(json.dumps({**config, "layer_norm_epsilon": 1.0}))
    moved = CT2Model(changed, threads=1).score(SRC, TGT)
    assert max_difference(moved, our_log_probs(model, SRC, TGT)) > 1e-3


def both(model, ct2, tokenizer, lines, cfg: DecodeConfig):
    ours = decoding.translate_nbest(model, tokenizer, lines, cfg)
    theirs = decoding.translate_nbest(ct2, tokenizer, lines, cfg)
    return ours, theirs


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("eos_rate", [0.1, None], ids=["ends", "runs-to-the-limit"])
def test_greedy_equals_ours_in_tokens_and_scores(tokenizer, lines, tmp_path, variant, eos_rate):
    """Hypotheses that end with EOS, and hypotheses closed at the length limit (whose EOS
    score comes from score_batch); each batch mixes several length limits."""
    pre_norm, tie, seed = VARIANTS[variant]
    model = tiny_model(tokenizer.vocab_size, pre_norm, tie, seed, eos_rate=eos_rate)
    ct2 = CT2Model(export_model(model, tokenizer, tmp_path)[1], threads=1)
    cfg = DecodeConfig(method="greedy", min_len=0, lenpen=0.6, batch_tokens=200)
    ours, theirs = both(model, ct2, tokenizer, lines, cfg)
    assert [h[0][0] for h in theirs] == [h[0][0] for h in ours]
    assert max(abs(a[0][1] - b[0][1]) for a, b in zip(ours, theirs)) < 1e-4
    src = encode_sources(tokenizer, lines, model.cfg.max_positions)
    limits = [int(1.2 * len(s) + 10) for s in src]
    at_limit = [len(tokenizer.encode([h[0][0]])[0]) >= n for h, n in zip(ours, limits)]
    assert len(set(limits)) > 5
    assert all(at_limit) if eos_rate is None else not all(at_limit)


def test_greedy_min_len_renormalises_the_first_step(pair, tokenizer, lines):
    """min_len=1: the same tokens; CTranslate2's scores are higher by -log(1 - p(EOS | <s>)),
    its softmax over the tokens left once EOS is masked (ct2.py's docstring)."""
    model, ct2 = pair
    cfg = DecodeConfig(method="greedy", min_len=1, lenpen=0.0)
    ours, theirs = both(model, ct2, tokenizer, lines, cfg)
    assert [h[0][0] for h in theirs] == [h[0][0] for h in ours]
    src = encode_sources(tokenizer, lines, model.cfg.max_positions)
    p_eos = [math.exp(lp[0]) for lp in our_log_probs(model, src, [[] for _ in src])]
    for a, b, p in zip(ours, theirs, p_eos):
        assert b[0][1] - a[0][1] == pytest.approx(-math.log1p(-p), abs=1e-4)


def reached_limit(hyps, limit: int) -> bool:
    return any(len(h.tokens) == limit for h in hyps)


@pytest.mark.parametrize("lenpen", [0.0, 0.6])
def test_beam_equals_ours_where_the_search_ends_before_the_limit(pair, tokenizer, lines, lenpen):
    """Beam 5, all 5 hypotheses: the same tokens and scores (GNMT's penalty applied to
    CTranslate2's sums) wherever our search finished 5 hypotheses before the limit.
    Where it reached the limit, every CTranslate2 hypothesis is still scored as ours:
    teacher-forced log-probabilities of its tokens and EOS, divided by GNMT's penalty.
    And asking for the best alone gives the head of the 5-best list."""
    model, ct2 = pair
    cfg = DecodeConfig(method="beam", beam_size=5, nbest=5, lenpen=lenpen, min_len=0)
    src = encode_sources(tokenizer, lines, model.cfg.max_positions)
    natural = 0
    for ids in src:
        src_ids = pad([ids], model.cfg.pad_id)
        limit = max_lengths(model, src_ids, cfg.max_len_a, cfg.max_len_b, cfg.min_len).item()
        ours, theirs = search(model, src_ids, cfg)[0], ct2.search(src_ids, cfg)[0]
        head = ct2.search(src_ids, replace(cfg, nbest=1))[0]  # limit hypotheses pruned unscored
        assert head[0].tokens == theirs[0].tokens
        assert head[0].score == pytest.approx(theirs[0].score, abs=1e-5)
        if not reached_limit(ours, limit):
            natural += 1
            assert [h.tokens for h in theirs] == [h.tokens for h in ours]
            assert max(abs(a.score - b.score) for a, b in zip(ours, theirs)) < 1e-4
        else:
            forced = our_log_probs(model, [ids] * len(theirs), [h.tokens for h in theirs])
            for h, log_probs in zip(theirs, forced):
                assert len(h.tokens) <= limit
                expected = sum(log_probs) / length_penalty(len(h.tokens) + 1, lenpen)
                assert h.score == pytest.approx(expected, abs=1e-4)
    assert natural >= 10  # the fixture's models end enough sentences on their own


def test_beam_min_len_1_searches_alike_and_scores_the_first_step_renormalised(pair, tokenizer, lines):
    """min_len=1 masks EOS at the first step only, whose renormalisation is the same for
    every hypothesis of a sentence: the same search, every score higher by
    -log(1 - p(EOS | <s>)) (lenpen 0)."""
    model, ct2 = pair
    cfg = DecodeConfig(method="beam", beam_size=5, nbest=5, lenpen=0.0, min_len=1)
    src = encode_sources(tokenizer, lines, model.cfg.max_positions)
    p_eos = [math.exp(lp[0]) for lp in our_log_probs(model, src, [[] for _ in src])]
    compared = []
    for ids, p in zip(src, p_eos):
        src_ids = pad([ids], model.cfg.pad_id)
        limit = max_lengths(model, src_ids, cfg.max_len_a, cfg.max_len_b, cfg.min_len).item()
        ours, theirs = search(model, src_ids, cfg)[0], ct2.search(src_ids, cfg)[0]
        if not reached_limit(ours, limit):
            assert [h.tokens for h in theirs] == [h.tokens for h in ours]
            for a, b in zip(ours, theirs):
                assert b.score - a.score == pytest.approx(-math.log1p(-p), abs=1e-4)
            compared += [len(h.tokens) for h in ours]
    assert len(compared) >= 50 and max(compared) >= 5


def test_long_input_is_cut_and_decoding_stays_within_the_table(tokenizer, tmp_path, caplog):
    model = tiny_model(tokenizer.vocab_size, pre_norm=True, tie=False, max_len=16, eos_rate=None)
    _, path = export_model(model, tokenizer, tmp_path)
    ct2 = CT2Model(path, threads=1)
    long_line = " ".join(["Ci vediamo martedì alle due"] * 10)  # one sentence > 16 tokens
    cfg = DecodeConfig(method="greedy", max_len_a=2.0, max_len_b=10)  # a limit past the table
    with caplog.at_level(logging.WARNING):
        ours, theirs = both(model, ct2, tokenizer, [long_line, "Ciao!"], cfg)
    assert "longer than the model's limit of 16 tokens" in caplog.text
    assert [h[0][0] for h in theirs] == [h[0][0] for h in ours]
    pieces, _ = fit(long_line, tokenizer, 16)  # translated piece by piece
    assert len(tokenizer.encode([theirs[0][0][0]])[0]) <= 15 * len(pieces)  # max_len minus BOS
    with pytest.raises(ValueError, match="exceeds model max_positions=16"):
        ct2.search(torch.full((1, 17), 5), cfg)


@pytest.mark.parametrize("quantization", ["int8", "int8_float32"])
def test_int8_export_loads_and_translates(tokenizer, lines, tmp_path, quantization):
    model = tiny_model(tokenizer.vocab_size, pre_norm=False, tie=True)
    _, fp32 = export_model(model, tokenizer, tmp_path / "fp32")
    _, int8 = export_model(model, tokenizer, tmp_path / "int8", quantization)
    assert (int8 / "model.bin").stat().st_size < 0.5 * (fp32 / "model.bin").stat().st_size
    loaded, tok, device = decoding.load_for_inference(str(int8), "cpu", threads=1)
    assert "int8" in loaded.engine and device.type == "cpu"
    assert json.loads((int8 / "export.json").read_text())["quantization"] == quantization
    out = decoding.translate_lines(loaded, tok, ["", *lines[:8]], DecodeConfig(method="beam"))
    assert len(out) == 9 and out[0] == ""


def test_strict_check_names_unused_tensors_and_missing_ones(tokenizer):
    model = tiny_model(tokenizer.vocab_size, pre_norm=True, tie=False)
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    state = dict(model.state_dict())
    extra = {**state, "decoder_layers.0.ffn.gate.weight": torch.zeros(3)}
    with pytest.raises(ExportError, match=r"1 tensor\(s\) .* no place in the spec: decoder_layers.0.ffn.gate"):
        CheckpointConverter(model.cfg, extra, pieces)._load()
    missing = {k: v for k, v in state.items() if k != "encoder_norm.bias"}
    with pytest.raises(ExportError, match=r"no tensor 'encoder_norm\.bias'"):
        CheckpointConverter(model.cfg, missing, pieces)._load()


def test_strict_check_names_unset_spec_variables(tokenizer):
    model = tiny_model(tokenizer.vocab_size, pre_norm=False, tie=True)
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]

    class Forgetful(CheckpointConverter):  # skips the cross-attention's output projection
        def _fill_decoder(self, spec, w):
            super()._fill_decoder(spec, w)
            spec.layer[1].attention.linear[2].weight = None
            spec.layer[1].attention.linear[2].bias = "__optional"
            spec.position_encodings.encodings = "__optional"

    with pytest.raises(ExportError, match="3 spec variable") as e:
        Forgetful.from_model(model, pieces)._load()
    for name in ("decoder/layer_1/attention/linear_2/weight",
                 "decoder/layer_1/attention/linear_2/bias", "decoder/position_encodings/encodings"):
        assert name in str(e.value)


def test_output_is_never_overwritten_unless_asked_and_never_if_not_an_export(tokenizer, tmp_path):
    model = tiny_model(tokenizer.vocab_size, pre_norm=False, tie=True)
    ckpt, path = export_model(model, tokenizer, tmp_path)
    again = ExportConfig(checkpoint=str(ckpt), output=str(path), quantization="int8")
    with pytest.raises(OutputError, match=r"exists \(an earlier output of mt-export\): add force=true"):
        export(again)
    assert json.loads((path / "export.json").read_text())["quantization"] == "none"
    again.force = True
    export(again)  # an earlier export: replaced
    assert json.loads((path / "export.json").read_text())["quantization"] == "int8"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError, match="is not an output of mt-export"):
        export(ExportConfig(checkpoint=str(ckpt), output=str(mine), force=True))
    (path / "notes.txt").write_text("keep me too")  # an export holding a file of the user's
    with pytest.raises(OutputError, match=r"holds files mt-export did not write \(notes.txt\)"):
        export(again)
    assert (mine / "notes.txt").read_text() == "keep me" and (path / "notes.txt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "export", "mine"]  # no leftovers


def test_export_is_self_contained(tokenizer, lines, tmp_path):
    model = tiny_model(tokenizer.vocab_size, pre_norm=True, tie=True)
    ckpt, path = export_model(model, tokenizer, tmp_path)
    info = json.loads((path / "export.json").read_text())
    assert info["model"] == json.loads((ckpt / "model.json").read_text())
    assert info["checkpoint"] == str(ckpt.resolve()) and info["quantization"] == "none"
    assert (path / "tokenizer.model").read_bytes() == tokenizer.proto
    config = json.loads((path / "config.json").read_text())
    assert (config["bos_token"], config["decoder_start_token"], config["eos_token"]) == ("<s>", "<s>", "</s>")
    assert not config["add_source_bos"] and not config["add_source_eos"]
    vocabulary = json.loads((path / "shared_vocabulary.json").read_text())
    assert vocabulary[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert vocabulary == [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    for f in ckpt.iterdir():  # the checkpoint gone, the export still translates
        f.unlink()
    loaded, tok, _ = decoding.load_for_inference(str(path), "cpu")
    assert decoding.translate_lines(loaded, tok, lines[:3], DecodeConfig(method="greedy"))


def test_a_tokenizer_that_is_not_the_exports_is_refused(pair, tmp_path):
    _, ct2 = pair
    other = train_tokenizer(read_lines(SAMPLE / "train.en"), vocab_size=300)
    for f in ct2.path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "tokenizer.model").write_bytes(other.proto)
    with pytest.raises(ConfigError, match="the tokenizer does not belong to it"):
        decoding.load_for_inference(str(tmp_path), "cpu")


def test_decode_precision_other_than_auto_is_refused(pair, tokenizer):
    _, ct2 = pair
    with pytest.raises(ConfigError, match=r"decode\.precision=bf16: an exported model"):
        decoding.translate_lines(ct2, tokenizer, ["Ciao"], DecodeConfig(precision="bf16"))


def test_export_config_names_its_keys():
    with pytest.raises(ConfigError, match="quantization='int4': choose one of none, int8"):
        to_dataclass(ExportConfig, {"checkpoint": "a", "output": "b", "quantization": "int4"})
    with pytest.raises(ConfigError, match="output=None: required"):
        to_dataclass(ExportConfig, {"checkpoint": "a"})


def test_without_ctranslate2_the_commands_say_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 fails
    with pytest.raises(ConfigError, match=r"mt-export needs ctranslate2.*pip install -e \"\.\[export\]\""):
        export(ExportConfig(checkpoint="ckpt", output=str(tmp_path / "out")))
    (tmp_path / "export.json").write_text("{}")
    with pytest.raises(ConfigError, match="an exported model needs ctranslate2"):
        decoding.load_for_inference(str(tmp_path), "cpu")


def run_cli(monkeypatch, main, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", list(argv))
    main()


def test_mt_export_then_mt_translate_and_mt_evaluate(tokenizer, lines, tmp_path, monkeypatch, capsys):
    """The commands on an exported directory: the lines our model gives, in input order,
    empty lines kept; n-best lines `i ||| hyp ||| score`; the evaluation report names it."""
    from transformer.commands import export as export_module

    model = tiny_model(tokenizer.vocab_size, pre_norm=False, tie=False)
    ckpt = save_checkpoint(tmp_path / "ckpt", model, tokenizer, "", {})
    out = tmp_path / "export"
    monkeypatch.chdir(tmp_path)
    run_cli(monkeypatch, export_module.main, "mt-export", f"checkpoint={ckpt}", f"output={out}")
    assert sorted(p.name for p in out.iterdir()) == [
        ".mt-output", "config.json", "export.json", "model.bin", "shared_vocabulary.json",
        "tokenizer.model"]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(monkeypatch, export_module.main, "mt-export", f"checkpoint={ckpt}", f"output={out}")
    assert exit_info.value.code == (f"mt-export: error: output={out}: exists (an earlier output of "
                                    "mt-export): add force=true to replace it")

    text = ["Che ore sono?", "", *lines[:6]]
    src = tmp_path / "in.it"
    src.write_text("".join(f"{line}\n" for line in text), encoding="utf-8")
    greedy = ("decode=greedy", "progress=false", "threads=1")
    run_cli(monkeypatch, translate.main, "mt-translate", f"checkpoint={out}", f"input.file={src}",
            f"output={tmp_path / 'out.en'}", *greedy)
    expected = decoding.translate_lines(model, tokenizer, text, DecodeConfig(method="greedy"))
    assert read_lines(tmp_path / "out.en") == expected and expected[1] == ""

    run_cli(monkeypatch, translate.main, "mt-translate", f"checkpoint={out}",
            "input.text='Che ore sono?\n\nSì!'", "decode=beam", "decode.beam_size=3", "decode.nbest=2")
    nbest = capsys.readouterr().out.splitlines()
    assert [line.split(" ||| ")[0] for line in nbest] == ["0", "0", "1", "2", "2"]
    assert nbest[2] == "1 |||  ||| 0.0000"
    scores = [float(line.split(" ||| ")[2]) for line in nbest]
    assert scores[0] >= scores[1] and scores[3] >= scores[4]

    pair = f"{SAMPLE / 'dev.it'},{SAMPLE / 'dev.en'}"
    run_cli(monkeypatch, evaluate.main, "mt-evaluate", f"checkpoint={out}", f"test_set='{pair}'",
            f"output_dir={tmp_path / 'eval'}", "max_sentences=12", *greedy)
    report = json.loads((tmp_path / "eval" / "dev.it.greedy.json").read_text())
    assert report["engine"].startswith("ctranslate2") and report["decode"]["precision"] == "auto"
    hyps = read_lines(tmp_path / "eval" / "dev.it.greedy.hyp")
    assert hyps == decoding.translate_lines(model, tokenizer, read_lines(SAMPLE / "dev.it")[:12],
                                            DecodeConfig(method="greedy"))


@pytest.mark.parametrize("size", [0, 100, 3000])
def test_a_truncated_model_bin_is_one_line_naming_the_export(pair, tmp_path, monkeypatch, size):
    _, ct2 = pair
    for f in ct2.path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "model.bin").write_bytes((ct2.path / "model.bin").read_bytes()[:size])
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={tmp_path}", "input.text=Ciao"])
    with pytest.raises(SystemExit) as info:
        translate.main()
    msg = str(info.value.code)
    assert msg.startswith(f"mt-translate: error: export {tmp_path} is corrupt or incomplete (")
    assert msg.endswith("export the checkpoint again with mt-export") and "\n" not in msg


def test_the_quick_starts_checkpoint_and_its_fp32_export_translate_alike_by_default(
        tmp_path, monkeypatch, capsys):
    """decode.precision=auto decodes a checkpoint in fp32 on a CPU, even one with native
    bf16 (mocked here; the suite pins fp32 otherwise), as its fp32 export computes: the
    quick start's model gives the same lines both ways with mt-translate's defaults (beam 5)."""
    from transformer import device
    from transformer.commands import export as export_module
    from transformer.decoding.settings import decode_settings

    from helpers import run

    run(tmp_path / "run")  # the quick start's debug run on the sample corpus
    monkeypatch.setattr(device, "cpu_bf16_support", lambda: (True, "AVX512-BF16 (mocked)"))
    assert device.resolve_precision("auto", torch.device("cpu"))[0] == "bf16"  # training's auto
    assert decode_settings(DecodeConfig(), torch.device("cpu")).precision == "fp32"
    monkeypatch.chdir(tmp_path)
    run_cli(monkeypatch, export_module.main, "mt-export", "checkpoint=run", "output=exports/run")
    capsys.readouterr()
    outputs = {}
    for model in ("run/checkpoints/best", "exports/run"):
        run_cli(monkeypatch, translate.main, "mt-translate", f"checkpoint={model}",
                f"input.file={SAMPLE / 'dev.it'}", "progress=false", "threads=1")
        outputs[model] = capsys.readouterr().out.splitlines()
    assert len(outputs["exports/run"]) == len(read_lines(SAMPLE / "dev.it"))
    assert outputs["run/checkpoints/best"] == outputs["exports/run"]


def test_sampling_settings_reach_ctranslate2_by_their_names(tokenizer, lines, tmp_path):
    """Each of top-k 1, a tiny top-p and a tiny temperature makes sampling greedy: so each
    reaches CTranslate2; the seed reproduces the draws in a new CT2Model (one worker); a
    sampled hypothesis is scored as the model scores it (our model's log-probabilities)."""
    model = tiny_model(tokenizer.vocab_size, False, True)
    path = export_model(model, tokenizer, tmp_path)[1]
    ct2 = CT2Model(path, threads=1)
    base = dict(min_len=0, lenpen=0.0, batch_tokens=200)

    def texts(ct2_or_ours, **settings) -> list[str]:
        cfg = DecodeConfig(**{**base, **settings})
        return [h[0][0] for h in decoding.translate_nbest(ct2_or_ours, tokenizer, lines, cfg)]

    greedy = texts(ct2, method="greedy")
    assert texts(ct2, method="sample", sampling_topk=1, seed=3) == greedy
    assert texts(ct2, method="sample", sampling_topp=1e-6, seed=3) == greedy
    assert texts(ct2, method="sample", sampling_temperature=1e-4, seed=3) == greedy
    drawn = texts(CT2Model(path, threads=1), method="sample", seed=3)
    assert drawn != greedy
    assert texts(CT2Model(path, threads=1), method="sample", seed=3) == drawn
    assert texts(CT2Model(path, threads=1), method="sample", seed=4) != drawn
    assert texts(ct2, method="sample", seed=3) != texts(ct2, method="sample", seed=3)  # draws go on
    cfg = DecodeConfig(method="sample", seed=3, **base)
    units: list[decoding.Unit] = []
    found = decoding.translate_nbest(ct2, tokenizer, lines, cfg, units=units)
    ours = [0.0] * len(lines)
    for unit, lp in zip(units, our_log_probs(model, [u.src for u in units], [u.hyps[0] for u in units])):
        ours[unit.line] += sum(lp)
    assert max(abs(h[0][1] - s) for h, s in zip(found, ours)) < 1e-3
