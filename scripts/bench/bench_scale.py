"""How preparation and training cost grow with the corpus: 1M, 3M and 10M pairs.

Builds synthetic corpora from the offline Europarl and Tatoeba training files (copy k of
every pair starts with `(k) ` on both sides, so no two pairs are alike and the prepared-
data cache's content key differs by size), then for each size:
- `mt-prepare data=files` with `data.num_proc` 1 and 2, each into a fresh cache: wall
  time, the CPU time of the process tree over the wall time (cores kept busy), peak
  memory of the tree (proportional set size: shared pages are not counted twice) and
  the cache's size on disk;
- `mt-train` of the prose recipe's model (small, pre-norm) on the prepared data for
  `--steps` updates: peak anonymous memory (what the process holds; the memory-mapped
  Arrow files are page cache, reported apart as file-backed).
Everything it made is deleted as it goes (disk use peaks at about 9.5 GB at 10M pairs: the
corpus 2.5 GB, the cache 4.6 GB and the cleaned text while it prepares, 2.3 GB).

    python scripts/bench/bench_scale.py                          # 1M, 3M, 10M pairs, 200 updates
    python scripts/bench/bench_scale.py --sizes 100000 --steps 20   # a quick look
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import transformer.commands  # noqa: F401  before torch: the OpenMP wait policy mt-train runs under
from transformer.data.corpus import read_lines
from transformer.device import describe_cpu
from transformer.paths import PROJECT_ROOT

SHARED = PROJECT_ROOT.parent / "shared" / "data"


def proc_tree(root: int) -> list[int]:
    """`root` and its descendants (from /proc/*/stat)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += parents.get(pid, [])
    return out


def memory_mb(pid: int) -> tuple[float, float]:
    """(anonymous, file-backed) proportional set size of the process tree, in MB."""
    anon = file = 0.0
    for p in proc_tree(pid):
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                key, _, value = line.partition(":")
                if key == "Pss_Anon":
                    anon += int(value.split()[0]) / 1024
                elif key == "Pss_File":
                    file += int(value.split()[0]) / 1024
        except (OSError, ValueError):
            continue
    return anon, file


def run_measured(cmd: list[str], cwd: Path, log: Path) -> dict:
    """Run a command, sampling its tree's memory twice a second: seconds, peak MB, and
    the CPU time of the whole tree over the wall time (`cores`: 2.0 keeps both busy)."""
    peak = {"anon": 0.0, "file": 0.0, "total": 0.0}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.5):
                anon, file = memory_mb(proc.pid)
                peak["anon"], peak["file"] = max(peak["anon"], anon), max(peak["file"], file)
                peak["total"] = max(peak["total"], anon + file)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = proc.wait()
        done.set()
        sampler.join()
        seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every descendant, once waited for
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if code != 0:
        sys.exit(f"bench_scale: {' '.join(cmd[:3])} ... failed ({code}); see {log}")
    return {"seconds": seconds, "cores": cpu / seconds, **peak}


def write_corpus(folder: Path, pairs: int) -> tuple[Path, Path]:
    """`pairs` pairs from copies of Europarl + Tatoeba, each copy marked `(k) `."""
    src = read_lines(SHARED / "europarl" / "train.it.gz") + read_lines(SHARED / "tatoeba" / "train.it")
    tgt = read_lines(SHARED / "europarl" / "train.en.gz") + read_lines(SHARED / "tatoeba" / "train.en")
    paths = folder / "train.it", folder / "train.en"
    with paths[0].open("w", encoding="utf-8") as fs, paths[1].open("w", encoding="utf-8") as ft:
        written, k = 0, 0
        while written < pairs:
            n = min(len(src), pairs - written)
            fs.writelines(f"({k}) {s}\n" for s in src[:n])
            ft.writelines(f"({k}) {t}\n" for t in tgt[:n])
            written, k = written + n, k + 1
    return paths


def du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,3000000,10000000", help="pairs, comma-separated")
    ap.add_argument("--steps", type=int, default=200, help="training updates per size")
    ap.add_argument("--workdir", default=None, help="where the corpora and caches go (a temp dir)")
    args = ap.parse_args()
    print(f"CPU: {describe_cpu()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench_scale-", dir=args.workdir))
    rows = []
    try:
        for pairs in (int(float(s)) for s in args.sizes.split(",")):
            folder = work / str(pairs)
            folder.mkdir()
            src, tgt = write_corpus(folder, pairs)
            data = ["data=files", f"data.train_src={src}", f"data.train_tgt={tgt}", "data.max_tokens=4096"]
            prep = {}
            for num_proc in (1, 2):
                cache = folder / f"cache{num_proc}"
                prep[num_proc] = run_measured(
                    [sys.executable, "-m", "transformer.commands.prepare", *data, f"data.num_proc={num_proc}",
                     f"data.cache_dir={cache}"], folder, folder / f"prepare{num_proc}.log")
                prep[num_proc]["cache_mb"] = du_mb(cache)
                phases = [line for line in (folder / f"prepare{num_proc}.log").read_text().splitlines()
                          if line.startswith("seconds:")]  # mt-prepare's own timing of its phases
                prep[num_proc]["phases"] = phases[-1] if phases else "?"
                print(f"{pairs:,} pairs, prepare num_proc={num_proc}: {prep[num_proc]}", flush=True)
                if num_proc == 1:
                    shutil.rmtree(cache)  # one cache on disk at a time
            train = run_measured(
                [sys.executable, "-m", "transformer.commands.train", *data, f"data.cache_dir={folder / 'cache2'}",
                 "model=small", "model.pre_norm=true", "model.attn_dropout=0", "model.ffn_dropout=0",
                 "optim.lr=2e-3", "optim.warmup_steps=500", f"trainer.max_steps={args.steps}",
                 f"trainer.val_every={args.steps}", "trainer.num_threads=2", "trainer.progress=false",
                 f"trainer.run_dir={folder / 'run'}", "trainer.resume=never"],
                folder, folder / "train.log")
            print(f"{pairs:,} pairs, train {args.steps} updates: {train}", flush=True)
            rows.append((pairs, prep, train))
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nCPU: {describe_cpu()}; mt-train: {args.steps} updates of the small model, "
          "precision auto, 2 threads")
    print("| pairs | prepare, `num_proc=1` | prepare, `num_proc=2` (cores busy) | prepare peak memory (1 / 2) "
          "| cache on disk | train peak anonymous | train peak file-backed | train wall |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for pairs, prep, train in rows:
        print(f"| {pairs:,} | {prep[1]['seconds']:.0f} s | {prep[2]['seconds']:.0f} s ({prep[2]['cores']:.2f}) "
              f"| {prep[1]['total'] / 1024:.2f} / {prep[2]['total'] / 1024:.2f} GB "
              f"| {prep[2]['cache_mb'] / 1024:.2f} GB | {train['anon'] / 1024:.2f} GB "
              f"| {train['file'] / 1024:.2f} GB | {train['seconds']:.0f} s |")


if __name__ == "__main__":
    main()
