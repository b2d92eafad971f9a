"""What a user made before the package was regrouped into subpackages (#44) still works.

tests/fixtures/before_layout/ holds a debug run's directory (its config.yaml and the
checkpoint of step 20, with the trainer state) and the prepared-data cache it trained on,
both written by the flat package (commit b005d97):

    mt-train debug=default data=sample trainer.num_threads=1 trainer.run_dir=RUN data.cache_dir=CACHE

Nothing in a checkpoint or a cache names a module (safetensors, JSON, a trainer state of
tensors and plain containers), so a move of modules must leave them valid: the checkpoint
loads and translates, the run resumes where it stopped, and preparation finds its cache.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from omegaconf import OmegaConf

from transformer.checkpoint import load_meta, load_model
from transformer.commands.train import train
from transformer.config import DecodeConfig, TrainConfig, to_dataclass
from transformer.decoding.text import translate_lines

from helpers import DEBUG, compose_cfg

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "before_layout"


def test_a_checkpoint_written_before_the_move_loads_and_translates():
    """Its greedy translations, pinned: the flat package that wrote it (b005d97), the code
    before issue #52's work (ccc58ba) and this tree all write these (fp32, as the suite runs
    on every CPU). A 20-step model says little, but each step is held: `</s>` is forbidden
    at the first step, so for the first line "to" comes first (log-prob -4.61, the next
    -4.64) and `</s>` second (-4.22, the next -4.46), with neither pad nor BOS among the four
    likeliest at either step; the second line stays empty; the fourth is split into two
    sentences and rejoined. A change to the search or the text path that is meant to change
    no output must keep these."""
    model, tokenizer = load_model(FIXTURE / "run" / "checkpoints" / "step_20")
    assert load_meta(FIXTURE / "run" / "checkpoints" / "step_20")["step"] == 20
    lines = ["Ciao, come stai?", "", "Mi chiamo Luke.", "Domani piove? Ci vediamo martedì alle due!"]
    out = translate_lines(model, tokenizer, lines, DecodeConfig(method="greedy"))
    assert out == ["to", "", "to", "to to"]


def test_a_run_and_a_cache_made_before_the_move_resume_without_preparing_again(tmp_path):
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    shutil.copytree(FIXTURE / "run", run_dir)
    shutil.copytree(FIXTURE / "cache", cache)
    # `source-<key>` notes map a file's path and mtime to its digest: a clone elsewhere
    # writes its own; the prepared data and the tokenizer are keyed by content alone.
    entries = sorted(p.name for p in cache.iterdir() if not p.name.startswith("source-"))
    cfg = compose_cfg(*DEBUG, f"trainer.run_dir={run_dir}", f"data.cache_dir={cache}",
                      "trainer.max_steps=22", "trainer.resume=auto")
    trainer = train(to_dataclass(TrainConfig, cfg), OmegaConf.to_yaml(cfg))
    assert trainer.state.step == 22  # continued from step 20, not from 0
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith("source-")) == entries
    assert (run_dir / "checkpoints" / "step_20" / "model.safetensors").read_bytes() == \
        (FIXTURE / "run" / "checkpoints" / "step_20" / "model.safetensors").read_bytes()
