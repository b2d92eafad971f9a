"""mt-average (transformer/commands/average.py): the averaged checkpoint holds the mean
weights of the last N step checkpoints, still tied, and translates.

Moved verbatim from tests/commands/test_translate.py (#52)."""

from __future__ import annotations

import pytest
import torch

from transformer.checkpoint import load_meta, load_model, save_checkpoint
from transformer.commands.average import main as average_main
from transformer.config import DecodeConfig
from transformer.decoding import text as decoding
from transformer.model.transformer import build_model

from helpers import FAST, LINES


def test_averaged_checkpoint_holds_the_mean_weights_and_translates(loaded, tmp_path, capsys):
    # Checkpoint averaging (transformer/commands/average.py): three step checkpoints of a run.
    model, tokenizer = loaded
    states = []
    for step, seed in [(100, 1), (200, 2), (300, 3)]:
        torch.manual_seed(seed)
        m = build_model(model.cfg)
        states.append(m.state_dict())
        save_checkpoint(tmp_path / "run" / "checkpoints" / f"step_{step}", m, tokenizer,
                        f"seed: {seed}\n", {"step": step}, trainer_state={"step": step})
    out = tmp_path / "avg"
    average_main([str(tmp_path / "run"), "--last", "2", "-o", str(out)])
    avg, _ = load_model(out)
    for k, v in avg.state_dict().items():
        torch.testing.assert_close(v, (states[1][k] + states[2][k]) / 2)
    assert avg.src_embed.weight is avg.out_proj.weight  # still tied
    assert load_meta(out)["step"] == 300 and not (out / "trainer_state.pt").exists()
    assert (out / "config.yaml").read_text() == "seed: 3\n"
    assert "averaged 2 checkpoints (step_200, step_300)" in capsys.readouterr().out
    assert decoding.translate_lines(avg, tokenizer, LINES[:1], DecodeConfig(**FAST))[0]
    with pytest.raises(SystemExit, match="fewer than --last 4"):
        average_main([str(tmp_path / "run"), "--last", "4", "-o", str(out)])
