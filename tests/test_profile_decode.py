"""scripts/profile_decode.py: per decoding batch, its steps, milliseconds and host ops a
step, written as it goes (on a CPU: no allocator figures, no expandable-segments child)."""

from __future__ import annotations

import json
import sys

from transformer.paths import PROJECT_ROOT

from helpers import tiny_checkpoint

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
from profile_decode import profile  # scripts/ is not a package


def test_the_profile_reports_every_batch_and_writes_it(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "ck", max_positions=32)
    lines = ["Il gatto dorme.", "Ciao!", "Che ore sono adesso?"] * 4
    out = tmp_path / "profile.json"
    report = profile(str(checkpoint), lines, device="cpu", methods=("beam", "greedy"),
                     batch_tokens=20, dtype=None, json_path=out, expandable=True)
    assert json.loads(out.read_text()) == report
    assert "expandable_segments" not in report  # CUDA only
    for method in ("beam", "greedy"):
        batches = report[method]["batches"]
        assert len(batches) > 1 and report[method]["sent_per_s"] > 0
        for batch in batches:
            assert batch["decoder_steps"] > 0 and batch["ms_per_step"] > 0
            assert 0 < batch["ops_per_step"] < 200
