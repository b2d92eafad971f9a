"""A running LibreTranslate under load, next to mt-translate on the same sentences.

    scripts/serving/serve_libretranslate.sh runs/prose/checkpoints/best &       # int8 package, port 5000
    python scripts/bench/bench_serve.py --url http://127.0.0.1:5000 --checkpoint exports/prose_int8
    python scripts/bench/bench_serve.py --url http://127.0.0.1:5000 --seconds 5    # a quick check

Three measurements, each for --seconds seconds or --max-requests requests:
1. For 1 and 4 concurrent clients (--clients), each client posts one sentence at a time to
   /translate (JSON, it→en) and waits for the answer, cycling through --sentences lines of
   --input (FLORES-200 devtest by default): sentences/s (= requests/s), p50 and p95 latency.
2. The worst-case mix (--worst-clients, 6; 0 skips it): that many clients post the worst
   request in a loop, `"Ciao.\\n" * 833` (--worst-lines; 4,998 characters, inside the
   default limits), while one client posts one sentence at a time as in 1: the one-sentence
   requests' p50, p95 and worst latency, and what the long requests got (answers by status).
3. With --checkpoint (a checkpoint or an mt-export directory): how fast `mt-translate`'s
   code (`decoding.text.translate_lines`, --threads CPU threads) translates the same sentences
   in one batched call, with Argos's beam (4) and with mt-translate's default (beam 5);
   for an export, also how many sentences the server's batching translates as each one
   alone would be (int8 rounding can differ where hypotheses nearly tie).
A request that takes longer than --timeout fails. The server must listen on loopback
(127.0.0.1, ::1, localhost): this script loads no other machine. The server and this script
share the CPUs; the load average before each run says what else ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from transformer.config import DecodeConfig
from transformer.data.corpus import read_lines
from transformer.device import describe_cpu
from transformer.paths import PROJECT_ROOT

LOOPBACK = ("127.0.0.1", "::1", "localhost")
FLORES = PROJECT_ROOT.parent / "shared" / "data" / "eval" / "flores200-devtest.it"


def translate(url: str, text: str, timeout: float) -> int:
    """POST one text; the HTTP status (a translation came back if 200)."""
    body = json.dumps({"q": text, "source": "it", "target": "en"}).encode()
    req = urllib.request.Request(f"{url}/translate", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            json.loads(r.read())["translatedText"]
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


class Tally:
    """Latencies of the requests answered 200 and the statuses of all, across threads."""

    def __init__(self):
        self.lock, self.latencies, self.statuses = threading.Lock(), [], Counter()

    def add(self, status: int | str, seconds: float) -> None:
        with self.lock:
            self.statuses[status] += 1
            if status == 200:
                self.latencies.append(seconds)

    def summary(self, wall: float) -> dict:
        q = statistics.quantiles(self.latencies, n=100) if len(self.latencies) >= 2 else [float("nan")] * 99
        return {"requests": len(self.latencies), "failed": sum(self.statuses.values()) - len(self.latencies),
                "rps": len(self.latencies) / wall, "p50": q[49], "p95": q[94],
                "max": max(self.latencies, default=float("nan")), "statuses": dict(self.statuses)}


def client(url: str, texts: list[str], tally: Tally, stop_at: float, budget: list[int], timeout: float) -> None:
    """Post `texts` in turn, one at a time, until `stop_at` or the shared request budget ends."""
    i = 0
    while time.perf_counter() < stop_at:
        with tally.lock:
            if budget[0] <= 0:
                return
            budget[0] -= 1
        t0 = time.perf_counter()
        try:
            status = translate(url, texts[i % len(texts)], timeout)
        except (OSError, ValueError, KeyError) as e:
            status = type(e).__name__
        tally.add(status, time.perf_counter() - t0)
        i += 1


def run_clients(groups: list[tuple[int, list[str], Tally]], url: str, seconds: float,
                max_requests: int, timeout: float) -> float:
    """Start every group's clients (count, texts, tally) at once; the wall time they ran."""
    start = time.perf_counter()
    stop_at, budget = start + seconds, [max_requests]
    threads = [threading.Thread(target=client, args=(url, texts[k:] + texts[:k], tally, stop_at, budget, timeout),
                                daemon=True)
               for count, texts, tally in groups for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + timeout + 5)
    return time.perf_counter() - start


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def offline_speed(checkpoint: str, lines: list[str], threads: int) -> list[tuple[str, str, float]]:
    """(search, engine, sentences/s) of `decoding.text.translate_lines` on `lines`, after a warm-up."""
    from transformer.decoding.loading import load_for_inference
    from transformer.decoding.text import translate_lines

    model, tokenizer, device = load_for_inference(checkpoint, "cpu", threads=threads)
    engine = getattr(model, "engine", f"ours (PyTorch), {threads} threads")
    translate_lines(model, tokenizer, lines[:20], DecodeConfig(), device)
    found = []
    for name, cfg in (("beam 4 (Argos's)", DecodeConfig(beam_size=4)), ("beam 5 (mt-translate's)", DecodeConfig())):
        t0 = time.perf_counter()
        translate_lines(model, tokenizer, lines, cfg, device)
        found.append((name, engine, len(lines) / (time.perf_counter() - t0)))
    return found


def batch_agreement(export: Path, lines: list[str]) -> tuple[int, int, str, float]:
    """(sentences whose best translation is the same, sentences, compute type, sentences/s
    batched) when the server's fair translator batches them all as one request (chunks
    of 256 pieces, its length limits, 2 workers) and when each is translated alone with
    the same settings: an export's batch noise, and what the server's engine does with
    everything batched."""
    import ctranslate2
    import sentencepiece as spm

    from transformer.deploy.serving import Budget, FairTranslator, ServeLimits, decode_limit

    translator = ctranslate2.Translator(str(export), compute_type="default", inter_threads=2, intra_threads=1)
    sp = spm.SentencePieceProcessor(model_file=str(export / "tokenizer.model"))
    sentences = [sp.encode(line, out_type=str) for line in lines]
    limits = ServeLimits()
    fair = FairTranslator(translator, limits)
    try:
        fair.translate(sentences[:20], 1, Budget(ServeLimits(seconds=3600)))  # warm-up
        t0 = time.perf_counter()
        batched = [h.pieces[0] for h in fair.translate(sentences, 1, Budget(ServeLimits(seconds=3600)))]
        speed = len(sentences) / (time.perf_counter() - t0)
    finally:
        fair.close()
    alone = [translator.translate_batch([s], beam_size=4, length_penalty=0.2, replace_unknowns=True,
                                        max_decoding_length=decode_limit(len(s), limits))[0].hypotheses[0]
             for s in sentences]
    same = sum(a == b for a, b in zip(batched, alone))
    return same, len(sentences), translator.compute_type, speed


def ms(x: float) -> str:
    return f"{x * 1e3:.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:5000")
    p.add_argument("--checkpoint", help="a checkpoint or mt-export directory to time mt-translate with")
    p.add_argument("--input", type=Path, default=FLORES)
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--clients", type=int, nargs="*", default=[1, 4])
    p.add_argument("--worst-clients", type=int, default=6)
    p.add_argument("--worst-lines", type=int, default=833)
    p.add_argument("--max-requests", type=int, default=100_000)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    host = urlsplit(args.url).hostname
    if host not in LOOPBACK:
        p.error(f"--url {args.url}: not a loopback address ({', '.join(LOOPBACK)})")
    if not 0 < args.seconds <= 3600 or not all(1 <= c <= 64 for c in args.clients) \
            or not 0 <= args.worst_clients <= 64 or not 1 <= args.worst_lines <= 10_000 \
            or not 0 < args.timeout <= 600 or not 1 <= args.max_requests <= 10_000_000:
        p.error("--seconds must be in (0, 3600], --clients in [1, 64], --worst-clients in [0, 64], "
                "--worst-lines in [1, 10000], --timeout in (0, 600], --max-requests in [1, 1e7]")
    lines = [line for line in read_lines(args.input) if line.strip()][: args.sentences]
    if not lines:
        p.error(f"--input {args.input}: no sentences")
    if args.clients or args.worst_clients:  # a warm-up, and is anything there?
        try:
            status = translate(args.url, lines[0], args.timeout)
        except (OSError, ValueError, KeyError) as e:
            status = e
        if status != 200:
            p.error(f"--url {args.url}: no translation came back ({status})")
    print(f"CPU: {describe_cpu()}, {os.cpu_count()} CPUs; {len(lines)} sentences of {args.input.name}, "
          f"{args.seconds:g} s per run")
    if args.clients:
        print("\n| clients | requests | failed | sentences/s | p50 latency (ms) | p95 latency (ms) | before the run |")
        print("|---:|---:|---:|---:|---:|---:|---|")
    for clients in args.clients:
        before, tally = load_line(), Tally()
        wall = run_clients([(clients, lines, tally)], args.url, args.seconds, args.max_requests, args.timeout)
        r = tally.summary(wall)
        print(f"| {clients} | {r['requests']} | {r['failed']} | {r['rps']:.1f} | {ms(r['p50'])} | "
              f"{ms(r['p95'])} | {before} |", flush=True)
    if args.worst_clients:
        worst = "Ciao.\n" * args.worst_lines
        before, short, long = load_line(), Tally(), Tally()
        wall = run_clients([(args.worst_clients, [worst], long), (1, lines, short)], args.url,
                           args.seconds, args.max_requests, args.timeout)
        s, w = short.summary(wall), long.summary(wall)
        print(f"\nWorst-case mix: {args.worst_clients} clients posting \"Ciao.\\n\" * {args.worst_lines} "
              f"({len(worst)} characters) in a loop, one client posting one sentence at a time "
              f"({before} before the run)\n")
        print("| requests | answered 200 | other answers | p50 (ms) | p95 (ms) | worst (ms) |")
        print("|---|---:|---|---:|---:|---:|")
        for name, r in (("one sentence", s), (f"{args.worst_lines} lines", w)):
            other = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items(), key=str) if k != 200) or "none"
            print(f"| {name} | {r['requests']} | {other} | {ms(r['p50'])} | {ms(r['p95'])} | {ms(r['max'])} |",
                  flush=True)
    if args.checkpoint:
        print(f"\nmt-translate's code on the same {len(lines)} sentences, one batched call ({load_line()}):\n")
        print("| search | engine | sentences/s |\n|---|---|---:|")
        for name, engine, speed in offline_speed(args.checkpoint, lines, args.threads):
            print(f"| {name} | {engine} | {speed:.1f} |")
        if (Path(args.checkpoint) / "export.json").is_file():
            same, total, kind, speed = batch_agreement(Path(args.checkpoint), lines)
            print(f"| beam 4, the server's translator (`transformer.deploy.serving`), all {total} in one "
                  f"request | CTranslate2 {kind}, 2 workers x 1 thread | {speed:.1f} |")
            print(f"\nBatched by the server's fair translator and alone, {kind}: the same best "
                  f"translation for {same} of {total} sentences ({100 * same / total:.1f}%)")


if __name__ == "__main__":
    main()
