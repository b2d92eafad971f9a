"""scripts/gpu_recipe.sh --cpu: every step of the GPU recipe's one call (data, train,
average, evaluate, export) at toy size on a CPU, so that the script cannot rot between the
rare times a GPU is at hand (docs/gpu.md, "The GPU recipe in one call"). Slow (one to
two minutes on a 2-core CPU): CI's `pytest -m slow`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_recipe.sh"
TEST_SETS = {"tatoeba-test", "europarl-test", "flores200-devtest"}


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "OUT"}


@pytest.mark.slow
def test_the_cpu_mode_runs_every_step_and_writes_the_json(tmp_path):
    proc = subprocess.run([str(SCRIPT), "--cpu", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=600, env=env())
    report = json.loads((tmp_path / "gpu_recipe.json").read_text())
    failed = {k: v.get("error") for k, v in report["steps"].items() if v["status"] != "passed"}
    assert proc.returncode == 0 and report["passed"], failed or proc.stderr[-2000:]
    steps = report["steps"]
    assert list(steps) == ["data", "train", "average", "evaluate", "export"]
    assert all(s["status"] == "passed" for s in steps.values())  # ctranslate2 is installed here
    assert steps["data"]["pairs"] == {"europarl": 199, "tatoeba": 200}  # the toy mix, both corpora
    train = steps["train"]
    assert train["updates"] == 12 and train["tokens_per_s_median"] > 0 and train["parameters"] > 0
    curve = train["curve"]
    assert [s for s, _ in curve["train/loss"]] == list(range(1, 13))  # every update logged
    assert [s for s, _ in curve["dev/europarl/bleu"]] == [6, 12] == [s for s, _ in curve["dev/tatoeba/bleu"]]
    average = steps["average"]
    assert average["averaged"] == ["step_6", "step_9", "step_12"]
    assert set(average["dev_bleu"]) == {"last", "average"} and average["chosen"] in ("last", "average")
    for step in ("evaluate", "export"):
        assert set(steps[step]["test_sets"]) == TEST_SETS
        for result in steps[step]["test_sets"].values():
            assert result["sentences"] == 20 and result["device"] == "cpu"
            assert set(result["scores"]) >= {"BLEU", "chrF2", "TER"}
            assert result["signatures"]["BLEU"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert steps["evaluate"]["beam"] == 5 and steps["evaluate"]["checkpoint"] == average["checkpoint"]
    assert steps["export"]["test_sets"]["tatoeba-test"]["engine"].startswith("ctranslate2")


def test_an_unknown_step_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([str(SCRIPT), "--cpu", "--out", str(tmp_path), "--steps", "data,warp"],
                          capture_output=True, text=True, timeout=120, env=env())
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("gpu_recipe: --steps: unknown step 'warp'; choose from "
                                   "data, train, average, evaluate, export")
    assert not (tmp_path / "gpu_recipe.json").exists()  # refused before any work


def test_a_missing_packed_folder_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([str(SCRIPT), "--cpu", "--data", str(tmp_path / "nothing"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env())
    assert proc.returncode == 2 and proc.stderr.strip().endswith("run scripts/gpu_recipe.sh --pack first "
                                                                 "and carry .gpu/recipe")
    assert not (tmp_path / "gpu_recipe.json").exists()


def test_the_gpu_mode_refuses_a_machine_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run([str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**env(), "PYTHON": "python"})
    assert proc.returncode == 2 and "no CUDA device here" in proc.stderr
    assert not (tmp_path / "gpu_recipe.json").exists()


def test_the_package_imports_ctranslate2_only_where_it_exports():
    """The recipe's first call carries no ctranslate2 (its wheel and the corpus do not fit
    64 MiB together): no module may import it at module level, or every step would fail
    there at its first import; the export step imports it when it runs, or says skipped."""
    import ast

    found = []
    for path in sorted((ROOT / "transformer").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found += [path.name for name in names if name.split(".")[0] == "ctranslate2"]
    assert not found
    wheels = (ROOT / "scripts" / "gpu" / "gpu_wheels.sh").read_text()
    assert "--no-ct2) ct2= ;;" in wheels and "--no-ct2" in SCRIPT.read_text()
