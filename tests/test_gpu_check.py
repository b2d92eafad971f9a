"""scripts/gpu_check.sh --cpu: every step of the GPU check at toy size on a CPU, so that
the script cannot rot between the rare times a GPU is at hand (docs/gpu.md,
"Checking a GPU"). Slow (two minutes on a 2-core CPU): CI's `pytest -m slow`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_cpu_mode_runs_every_step_and_writes_the_json(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=env)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    failed = {k: v.get("error") for k, v in report["steps"].items() if v["status"] != "passed"}
    assert proc.returncode == 0 and report["passed"], failed or proc.stderr[-2000:]
    steps = report["steps"]
    assert list(steps) == ["device", "data", "tests", "bench", "train", "ddp", "decode", "profile"]
    assert steps["device"]["matmul_tflops"]["fp32"] > 0
    assert {r["precision"] for r in steps["bench"]["results"]} == {"fp32", "bf16"}
    assert all(r["tokens_per_s"] > 0 and r["ratio"] > 0 for r in steps["bench"]["results"])
    assert {r["compile"] for r in steps["bench"]["results"]} == {False}  # compiling: GPU rows only
    train = steps["train"]
    assert train["updates"] == 16 and set(train["loss_at"]) == {"1", "5", "10", "16"}
    assert train["first_compile_s"] is None and train["compile_error"] is None  # eager on a CPU
    # the profile of 10 updates, logged every 10: one read of the metrics (the GPU's code paths)
    assert train["host_syncs_per_update"] == 0.1 and train["aten_ops_per_update"] > 100
    assert train["kernel_launches_per_update"] is None and train["gpu_busy_fraction"] is None
    assert train["compare"]["fp32"]["max_rel_diff"] <= 0.03
    assert steps["ddp"]["backend"] == "gloo" and steps["ddp"]["resumed_to"] == 4
    assert steps["decode"]["cpu"]["sentences"] == 20
    profile = steps["profile"]
    for name, methods in (("tatoeba", ("beam", "greedy")), ("europarl", ("beam",))):
        for method in methods:
            batches = profile[name][method]["batches"]
            assert batches and all(b["decoder_steps"] > 0 for b in batches), (name, method)


def test_an_unknown_step_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--out", str(tmp_path),
                           "--steps", "device,warp"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gpu_check: --steps: unknown step 'warp'; choose from " \
                                  "device, data, tests, bench, train, ddp, decode, profile"
    assert not (tmp_path / "gpu_check.json").exists()  # refused before any work


def test_the_gpu_mode_refuses_a_machine_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": "python"})
    assert proc.returncode == 2 and "no CUDA device here" in proc.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def test_every_module_level_import_of_the_package_reaches_the_gpu_machine():
    """The GPU machine has no network: a third-party module the package imports at module
    level must be on its image or in the wheels `--pack` carries (sentence-splitter was
    neither once, which would have failed every step that imports the trainer)."""
    import ast
    import sys

    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    from gpu_check import IMAGE_MODULES, PACKED_MODULES

    pack = (ROOT / "scripts" / "gpu" / "gpu_wheels.sh").read_text()  # the wheels both GPU scripts carry
    for module in PACKED_MODULES - {"antlr4"}:  # antlr4 is built as a wheel, named otherwise
        assert module.replace("_", "-").split(".")[0] in pack.replace("_", "-"), module
    stdlib = set(sys.stdlib_module_names)
    missing = {}
    for path in sorted((ROOT / "transformer").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only: lazy imports are optional
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for name in names:
                top = name.split(".")[0]
                if top not in stdlib and top != "transformer" and top not in IMAGE_MODULES | PACKED_MODULES:
                    missing.setdefault(top, path.name)
    assert not missing, f"not on the GPU image nor in scripts/gpu/gpu_wheels.sh: {missing}"


def test_the_quick_plan_fits_240_seconds_and_names_steps_of_the_table():
    """--quick beside the recipe in one session's 15 minutes of GPU time: its step limits
    add up to at most its 240 s deadline, each a step of the table, the profile last; the
    full check's default steps still fill its 540 s without the profile."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    import gpu_check

    quick = gpu_check.QUICK
    assert quick.deadline <= 240 and sum(quick.limits[s] for s in quick.steps) <= quick.deadline
    assert set(quick.steps) <= set(gpu_check.STEPS) and quick.steps[-1] == "profile"
    assert quick.bench_compile_models == ["base", "big"] and quick.compare_precisions == []
    full = gpu_check.GPU
    assert "profile" not in full.steps and sum(full.limits[s] for s in full.steps) == full.deadline
