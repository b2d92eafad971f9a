"""docs/back-translation.md, walked on the sample corpus with the commands it shows (fewer
updates): English→Italian trained by swapping the data group's languages, English text
back-translated with sampling, the synthetic sources tagged and mixed with the real
pairs, Italian→English trained on the mix and evaluated."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from transformer.commands import evaluate, train, translate
from transformer.data.corpus import normalize, read_lines
from transformer.paths import PROJECT_ROOT

from helpers import shared_cache

SAMPLE = PROJECT_ROOT / "data" / "sample"
TAG = "<BT>"


def command(monkeypatch, main, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["mt-command", *argv])
    main()


def trained(monkeypatch, run_dir: Path, *overrides: str) -> None:
    command(monkeypatch, train.main, "debug=default", "data=sample", f"trainer.run_dir={run_dir}",
            f"data.cache_dir={shared_cache()}", "trainer.progress=false", "trainer.num_threads=1",
            "trainer.max_steps=10", "trainer.val_every=10", *overrides)


def evaluated(monkeypatch, run_dir: Path, out: Path) -> dict:
    command(monkeypatch, evaluate.main, f"checkpoint={run_dir}", "data=sample", "test_set=dev",
            f"output_dir={out}", "decode=greedy", "decode.max_len_b=8", "progress=false")
    return json.loads((out / "dev.greedy.json").read_text())


@pytest.mark.slow
def test_the_back_translation_walk_runs_on_the_sample(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    en_it, it_en = tmp_path / "runs" / "en_it", tmp_path / "runs" / "it_en"

    # 1. English→Italian: the sides swap in training, dev BLEU and mt-evaluate's references
    trained(monkeypatch, en_it, "data.src_lang=en", "data.tgt_lang=it")
    saved = OmegaConf.load(en_it / "checkpoints" / "best" / "config.yaml").data
    assert (saved.src_lang, saved.tgt_lang) == ("en", "it")
    report = evaluated(monkeypatch, en_it, tmp_path / "eval_en_it")
    italian = [normalize(line) for line in read_lines(SAMPLE / "dev.it")]
    assert read_lines(tmp_path / "eval_en_it" / "dev.ref") == italian
    assert report["sentences"] == len(italian)

    # 2. back-translation with sampling: one line per English line, the same for a seed
    mono = tmp_path / "mono.en"
    mono.write_text((SAMPLE / "train.en").read_text(encoding="utf-8"), encoding="utf-8")
    english = read_lines(mono)
    draws = {}
    for name, seed in (("mono.bt.it", 1), ("again.it", 1), ("other.it", 2)):
        command(monkeypatch, translate.main, f"checkpoint={en_it}", f"input.file={mono}",
                f"output={tmp_path / name}", "decode=sample", f"decode.seed={seed}",
                "decode.split_sentences=false", "decode.max_len_b=8", "progress=false")
        draws[name] = read_lines(tmp_path / name)
    assert len(draws["mono.bt.it"]) == len(english)
    assert draws["again.it"] == draws["mono.bt.it"] != draws["other.it"]

    # 3. the tag
    tagged = tmp_path / "bt.it"
    tagged.write_text("".join(f"{TAG} {line}\n" for line in draws["mono.bt.it"]), encoding="utf-8")

    # 4. the mix: synthetic pairs as `files`, the real ones as `sample`, a phase first
    trained(monkeypatch, it_en, "data.name=mix", "data.corpora={sample: 1, files: 1}",
            f"data.train_src={tagged}", f"data.train_tgt={mono}",
            f"data.dev_src={SAMPLE / 'dev.it'}", f"data.dev_tgt={SAMPLE / 'dev.en'}",
            "data.phases=[{epochs: 2, corpora: {sample: 1, files: 3}}]")
    log = (it_en / "train.log").read_text(encoding="utf-8")
    assert "dev sample:" in log and "dev files:" in log
    saved = OmegaConf.load(it_en / "checkpoints" / "best" / "config.yaml").data
    assert dict(saved.corpora) == {"sample": 1, "files": 1} and saved.train_src == str(tagged)
    report = evaluated(monkeypatch, it_en, tmp_path / "eval_it_en")
    assert read_lines(tmp_path / "eval_it_en" / "dev.ref") == [normalize(line) for line in read_lines(SAMPLE / "dev.en")]
    assert report["sentences"] == len(italian)


def test_evaluate_refuses_a_direction_that_is_not_the_models(tmp_path, monkeypatch, checkpoint):
    """The conftest checkpoint has no run config: the data group's sides hold. One with a
    run config that says en→it is scored so, and data.* that say otherwise are refused."""
    from transformer.commands.evaluate import EvaluateConfig, trained_direction, with_direction
    from transformer.config import ConfigError, DataConfig

    assert trained_direction(checkpoint) is None
    run = tmp_path / "ckpt"
    run.mkdir()
    (run / "config.yaml").write_text("data:\n  src_lang: en\n  tgt_lang: it\n")
    cfg = with_direction(EvaluateConfig(checkpoint=str(run)))
    assert (cfg.data.src_lang, cfg.data.tgt_lang) == ("en", "it")
    with pytest.raises(ConfigError, match=r"^data.src_lang=it data.tgt_lang=fr: the checkpoint translates en→it"):
        with_direction(EvaluateConfig(checkpoint=str(run), data=DataConfig(tgt_lang="fr")))
