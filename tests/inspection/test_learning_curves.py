"""Learning curves read every resumed segment of a run and skip the pause between them."""

import pytest
from torch.utils.tensorboard import SummaryWriter

from transformer.inspection.learning_curves import (
    _chain_series,
    dev_sets,
    plot_learning_curves,
    plot_run_comparison,
    read_scalars,
    training_hours,
)
from transformer.paths import PROJECT_ROOT


def _segment(tb, steps, start_wall):
    w = SummaryWriter(str(tb))
    for i, step in enumerate(steps):
        w.add_scalar("train/loss", 5.0 - step / 10, step, walltime=start_wall + 60 * i)
        if step % 2 == 0:
            w.add_scalar("dev/bleu", step * 2.0, step, walltime=start_wall + 60 * i)
    w.close()


def test_curves_join_resumed_segments_without_the_gap(tmp_path):
    _segment(tmp_path / "tb", [1, 2, 3, 4], start_wall=1_000_000)
    _segment(tmp_path / "tb", [5, 6], start_wall=1_000_000 + 3 * 60 + 7200)  # resumed 2 h later
    scalars = read_scalars(tmp_path)
    assert [s for _, s, _ in scalars["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [s for _, s, _ in scalars["dev/bleu"]] == [2, 4, 6]
    hours = training_hours(scalars)
    assert abs(hours[6] - 5 * 60 / 3600) < 1e-9  # 3 + 1 one-minute intervals, the pause as a typical one
    png = plot_learning_curves(tmp_path, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_trainers_clock_places_the_points_where_the_run_logged_it(tmp_path):
    w = SummaryWriter(str(tmp_path / "tb"))
    for step in (1, 2, 3, 4):  # a minute of wall time a log, of which 30 s were training
        w.add_scalar("train/loss", 5.0 - step / 10, step, walltime=1_000_000 + 60 * step)
        w.add_scalar("train/hours", 30 * step / 3600, step, walltime=1_000_000 + 60 * step)
    w.close()
    hours = training_hours(read_scalars(tmp_path))
    assert hours == pytest.approx({1: 30 / 3600, 2: 60 / 3600, 3: 90 / 3600, 4: 120 / 3600})


def _mixed_run(run_dir, slope=1.0):
    w = SummaryWriter(str(run_dir / "tb"))
    for step in (1, 2, 3, 4):
        w.add_scalar("train/loss", 5.0 - step / 10, step, walltime=1_000_000 + 60 * step)
        for name, bleu in (("europarl", step * 3.0 * slope), ("tatoeba", step * 5.0 * slope)):
            w.add_scalar(f"dev/{name}/bleu", bleu, step, walltime=1_000_000 + 60 * step)
            w.add_scalar(f"dev/{name}/nll", 4.0 - step / 2, step, walltime=1_000_000 + 60 * step)
        w.add_scalar("dev/bleu", step * 4.0, step, walltime=1_000_000 + 60 * step)
    w.close()


def test_a_mixed_run_gets_one_line_per_dev_set(tmp_path):
    _mixed_run(tmp_path)
    assert dev_sets(read_scalars(tmp_path)) == ["europarl", "tatoeba"]
    png = plot_learning_curves(tmp_path, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_compare_in_one_picture_one_line_per_run_and_dev_set(tmp_path):
    _mixed_run(tmp_path / "a")
    _mixed_run(tmp_path / "b", slope=2.0)
    _segment(tmp_path / "single" / "tb", [1, 2, 3, 4], start_wall=1_000_000)  # one dev set: dev/bleu
    png = plot_run_comparison([tmp_path / "a", tmp_path / "b", tmp_path / "single"], tmp_path / "cmp.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="3 runs but 1 labels"):
        plot_run_comparison([tmp_path / "a", tmp_path / "b", tmp_path / "single"], tmp_path / "x.png", ["a"])


def test_a_chain_of_runs_is_one_line_each_stage_continuing_the_last(tmp_path):
    """A fine-tuning run drawn after its parent: the parent's one dev set (named by its
    config) continues as the child's dev set of the same name, steps offset."""
    _segment(tmp_path / "parent" / "tb", [1, 2, 3, 4], start_wall=1_000_000)
    (tmp_path / "parent" / "config.yaml").write_text("data:\n  name: tatoeba\n")
    _mixed_run(tmp_path / "child")
    series = _chain_series([tmp_path / "parent", tmp_path / "child"], ("bleu", "nll"), "updates")
    assert series["bleu", "tatoeba"] == ([2, 4, 5, 6, 7, 8], [4.0, 8.0, 5.0, 10.0, 15.0, 20.0])
    assert series["bleu", "europarl"][0] == [5, 6, 7, 8]
    assert ("nll", "tatoeba") in series and len(series["nll", "tatoeba"][0]) == 4  # the parent logged none
    png = plot_run_comparison([tmp_path / "child", f"{tmp_path / 'parent'}+{tmp_path / 'child'}"],
                              tmp_path / "chain.png", x="updates")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_test_set_scores_plot_from_evaluate_reports(tmp_path):
    """scripts/plots/plot_scores.py: one point per mt-evaluate folder, one line per test set."""
    import json
    import subprocess
    import sys

    folders = []
    for i, bleu in enumerate((10.0, 12.5)):
        folder = tmp_path / f"step_{i}"
        folder.mkdir()
        for name in ("europarl-test", "tatoeba-test"):
            report = {"test_set": name, "scores": {"BLEU": bleu + len(name), "chrF2": 30.0}}
            (folder / f"{name}.beam.json").write_text(json.dumps(report))
        folders.append(str(folder))
    script = PROJECT_ROOT / "scripts" / "plots" / "plot_scores.py"
    out = tmp_path / "scores.png"
    proc = subprocess.run([sys.executable, str(script), *folders, "--x", "0", "250", "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run([sys.executable, str(script), *folders, "--x", "0", "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "2 folders but 1 x values" in bad.stderr
