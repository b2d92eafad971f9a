"""mt-evaluate: its scores are the sacrebleu command line's on the files it writes (the
case-insensitive BLEU its -lc); a test set may be a process substitution; a perturbed test
set (perturb=) has its sources changed by data.augment's transforms, its references cased
to match, and files of its own beside the clean ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from transformer.commands import evaluate
from transformer.config import DecodeConfig
from transformer.data import perturb
from transformer.data.corpus import read_lines
from transformer.metrics.name_copy import SIGNATURE
from transformer.outputs import OutputError
from transformer.paths import PROJECT_ROOT

from helpers import tiny_checkpoint

ROOT = PROJECT_ROOT
SAMPLE = ROOT / "data" / "sample"


def sacrebleu_cli(ref: Path, hyp: Path) -> dict[str, dict]:
    """`sacrebleu REF -i HYP -m bleu chrf ter -w 4`, parsed: {metric name: its JSON}."""
    proc = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp),
         "-m", "bleu", "chrf", "ter", "-w", "4"],
        capture_output=True, text=True, check=True, timeout=60,
    )
    return {m["name"]: m for m in json.loads(proc.stdout)}


def assert_same_as_cli(report: dict, ref: Path, hyp: Path) -> None:
    cli = sacrebleu_cli(ref, hyp)
    assert set(cli) == {"BLEU", "chrF2", "TER"}
    for name, result in cli.items():
        assert report["scores"][name] == result["score"], name
        assert report["signatures"][name] == result["signature"], name


def test_scores_equal_the_sacrebleu_command_line(tmp_path):
    # Hypotheses that share some n-grams with the references, so no score is 0 or 100.
    refs = read_lines(SAMPLE / "dev.en")[:20]
    hyps = [" ".join(r.split()[: max(1, len(r.split()) - 1)]).lower() for r in refs]
    report = evaluate.score(hyps, refs)
    assert 0 < report["scores"]["BLEU"] < 100
    (tmp_path / "ref").write_text("".join(f"{r}\n" for r in refs), encoding="utf-8")
    (tmp_path / "hyp").write_text("".join(f"{h}\n" for h in hyps), encoding="utf-8")
    assert_same_as_cli(report, tmp_path / "ref", tmp_path / "hyp")


def test_the_case_insensitive_bleu_is_the_sacrebleu_command_lines_lc(tmp_path):
    refs = read_lines(SAMPLE / "dev.en")[:20]
    hyps = [r.upper() for r in refs]  # nothing in common but the letters' case
    report = evaluate.score(hyps, refs)
    assert report["scores"]["BLEU"] < 5 and report["scores"]["BLEU-lc"] == 100.0
    (tmp_path / "ref").write_text("".join(f"{r}\n" for r in refs), encoding="utf-8")
    (tmp_path / "hyp").write_text("".join(f"{h[:-2]}\n" for h in hyps), encoding="utf-8")  # not all perfect
    report = evaluate.score([h[:-2] for h in hyps], refs)
    proc = subprocess.run([sys.executable, "-m", "sacrebleu", str(tmp_path / "ref"), "-i", str(tmp_path / "hyp"),
                           "-m", "bleu", "-lc", "-w", "4"], capture_output=True, text=True, check=True, timeout=60)
    cli = json.loads(proc.stdout)
    assert report["scores"]["BLEU-lc"] == cli["score"] and report["signatures"]["BLEU-lc"] == cli["signature"]
    assert "case:lc" in cli["signature"] and report["verbose"]["BLEU-lc"].startswith("BLEU-lc = ")


def test_the_name_copy_rate_stands_beside_bleu_given_the_sources():
    src, refs = read_lines(SAMPLE / "dev.it"), read_lines(SAMPLE / "dev.en")
    hyps = [r.lower() for r in refs]  # every name lost, many n-grams kept
    plain, named = evaluate.score(hyps, refs), evaluate.score(hyps, refs, src)
    assert "names" not in plain["scores"] and "name_copy" not in plain
    assert {k: v for k, v in named["scores"].items() if k != "names"} == plain["scores"]
    assert named["scores"]["names"] == 0.0 and named["signatures"]["names"] == SIGNATURE
    assert named["name_copy"]["names"] > 0 and named["name_copy"]["copied"] == 0
    perfect = evaluate.score(refs, refs, src)
    assert perfect["scores"]["names"] == 100.0
    assert perfect["name_copy"] == {**named["name_copy"], "copied": named["name_copy"]["names"]}
    n = perfect["name_copy"]["names"]
    assert perfect["verbose"]["names"].startswith(f"names = 100.00 ({n}/{n} copied, ")


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """A random tiny model with a SentencePiece vocabulary trained on data/sample."""
    return tiny_checkpoint(tmp_path / "ckpt")


def test_mt_evaluate_writes_files_and_report_that_sacrebleu_agrees_with(
    checkpoint, tmp_path, monkeypatch, capsys
):
    pair = f"{SAMPLE / 'dev.it'},{SAMPLE / 'dev.en'}"
    out = tmp_path / "eval"
    monkeypatch.setattr(sys, "argv", [
        "mt-evaluate", f"checkpoint={checkpoint}", f"test_set='{pair}'", f"output_dir={out}",
        "max_sentences=12", "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=8",
        "progress=false",
    ])
    evaluate.main()
    report = json.loads((out / "dev.it.greedy.json").read_text())
    hyp, ref = out / "dev.it.greedy.hyp", out / "dev.it.ref"
    assert report["files"] == {"hyp": str(hyp), "ref": str(ref), "report": str(out / "dev.it.greedy.json")}
    assert len(read_lines(hyp)) == len(read_lines(ref)) == report["sentences"] == 12
    assert read_lines(ref) == read_lines(SAMPLE / "dev.en")[:12]
    assert report["decode"]["method"] == "greedy" and report["checkpoint"] == str(checkpoint)
    assert report["decode"]["batch_tokens"] == 2000 and report["decode"]["precision"] == "fp32"  # CPU defaults
    assert "max_tokens" not in report["decode"]  # the old name of batch_tokens is not reported
    assert report["sentences_per_second"] > 0
    assert_same_as_cli(report, ref, hyp)
    printed = capsys.readouterr().out
    assert f"BLEU = {report['scores']['BLEU']:.2f}" in printed
    # The first 12 sample pairs hold no name: no rate, and no division by zero.
    assert report["scores"]["names"] is None and report["name_copy"]["names"] == 0
    assert f"names = n/a (the references copy no name)  ({SIGNATURE})" in printed


def test_each_model_gets_its_own_report_folder_and_a_run_directory_its_best(tmp_path, monkeypatch, caplog):
    """The default output_dir is per model: a second model on the same test set writes
    beside the first; the same model again is refused (its files exist)."""
    run_dir = tmp_path / "myrun"
    tiny_checkpoint(run_dir / "checkpoints" / "best")
    tiny_checkpoint(run_dir / "checkpoints" / "step_10", seed=1)
    monkeypatch.chdir(tmp_path)
    pair = f"{SAMPLE / 'dev.it'},{SAMPLE / 'dev.en'}"

    def run(checkpoint: str) -> dict:
        return evaluate.evaluate(evaluate.EvaluateConfig(
            checkpoint=checkpoint, test_set=pair, max_sentences=4, progress=False,
            decode=DecodeConfig(method="greedy", max_len_a=0, max_len_b=6)))

    with caplog.at_level("INFO"):
        best = run("myrun")
    assert "checkpoint=myrun is a run directory: its best checkpoint" in caplog.text
    assert best["checkpoint"] == str(run_dir / "checkpoints" / "best")
    step = run("myrun/checkpoints/step_10")
    assert Path(best["files"]["report"]) == Path("outputs/eval/myrun-best/dev.it.greedy.json")
    assert Path(step["files"]["report"]) == Path("outputs/eval/myrun-step_10/dev.it.greedy.json")
    assert all(Path(f).is_file() for report in (best, step) for f in report["files"].values())
    with pytest.raises(OutputError, match=r"output_dir=outputs/eval/myrun-best: .* exists"):
        run("myrun/checkpoints/best")
    assert evaluate.model_name(str(tmp_path / "exports" / "mine")) == "mine"  # an export: its name


def test_a_process_substitution_is_a_test_set_as_a_file_is(checkpoint, tmp_path, monkeypatch):
    """`test_set=<(...),ref`: /dev/fd/N, the read end of a pipe, exists though it is no
    regular file; it is read once and scored as the same lines in a file are."""
    src, ref = SAMPLE / "dev.it", SAMPLE / "dev.en"
    read, write = os.pipe()

    def fill() -> None:
        with os.fdopen(write, "wb") as f:
            f.write(src.read_bytes())

    threading.Thread(target=fill, daemon=True).start()
    reports = {}
    try:
        for name, source in (("file", str(src)), ("pipe", f"/dev/fd/{read}")):
            out = tmp_path / name
            monkeypatch.setattr(sys, "argv", [
                "mt-evaluate", f"checkpoint={checkpoint}", f"test_set='{source},{ref}'", f"output_dir={out}",
                "max_sentences=12", "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=8", "progress=false"])
            evaluate.main()
            (reports[name],) = (json.loads(p.read_text()) for p in out.glob("*.greedy.json"))
    finally:
        os.close(read)
    assert reports["pipe"]["sentences"] == 12 and reports["pipe"]["scores"] == reports["file"]["scores"]
    assert read_lines(Path(reports["pipe"]["files"]["hyp"])) == read_lines(Path(reports["file"]["files"]["hyp"]))


def evaluate_sample(checkpoint: Path, out: Path, *overrides: str) -> dict:
    pair = f"{SAMPLE / 'dev.it'},{SAMPLE / 'dev.en'}"
    sys.argv = ["mt-evaluate", f"checkpoint={checkpoint}", f"test_set='{pair}'", f"output_dir={out}",
                "max_sentences=12", "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=8", "progress=false",
                *overrides]
    evaluate.main()
    (report,) = (json.loads(p.read_text()) for p in out.glob("*.greedy.json"))
    return report


@pytest.mark.parametrize("name", ["upper", "title", "nopunct", "typos"])
def test_a_perturbed_test_set_gets_files_of_its_own_and_references_cased_to_match(
        checkpoint, tmp_path, monkeypatch, name):
    monkeypatch.setattr(sys, "argv", sys.argv)
    clean = evaluate_sample(checkpoint, tmp_path / "clean")
    perturbed = evaluate_sample(checkpoint, tmp_path / "perturbed", f"perturb={name}")
    tag = "typos-seed1" if name == "typos" else name
    assert {k: Path(v).name for k, v in perturbed["files"].items()} == {
        "hyp": f"dev.it.{tag}.greedy.hyp", "ref": f"dev.it.{tag}.ref", "report": f"dev.it.{tag}.greedy.json"}
    assert not set(map(Path, clean["files"].values())) & {Path(f).parent.parent / "clean" / Path(f).name
                                                           for f in perturbed["files"].values()}
    assert perturbed["perturb"]["name"] == name and clean["perturb"] is None
    assert perturbed["perturb"]["seed"] == (1 if name == "typos" else None)
    refs = read_lines(SAMPLE / "dev.en")[:12]
    written = read_lines(Path(perturbed["files"]["ref"]))
    assert written == ([getattr(perturb, name)(r) for r in refs] if name in ("upper", "title") else refs)
    assert_same_as_cli(perturbed, Path(perturbed["files"]["ref"]), Path(perturbed["files"]["hyp"]))


def test_a_perturbed_report_goes_beside_the_clean_one_in_the_same_folder(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv)
    out = tmp_path / "eval"
    evaluate_sample(checkpoint, out)
    clean_ref = (out / "dev.it.ref").read_text()
    for overrides in (["perturb=upper"], ["perturb=typos"], ["perturb=typos", "perturb_seed=2"]):
        evaluate.evaluate(evaluate.EvaluateConfig(
            checkpoint=str(checkpoint), test_set=f"{SAMPLE / 'dev.it'},{SAMPLE / 'dev.en'}", output_dir=str(out),
            max_sentences=12, progress=False, perturb=overrides[0].split("=")[1],
            perturb_seed=int(overrides[1].split("=")[1]) if len(overrides) > 1 else 1,
            decode=DecodeConfig(method="greedy", max_len_a=0, max_len_b=8)))
    assert sorted(p.name for p in out.glob("dev.it.*.json")) == [
        "dev.it.greedy.json", "dev.it.typos-seed1.greedy.json", "dev.it.typos-seed2.greedy.json",
        "dev.it.upper.greedy.json"]
    assert (out / "dev.it.ref").read_text() == clean_ref

