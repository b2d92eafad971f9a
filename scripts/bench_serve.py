"""A running LibreTranslate under load, next to mt-translate on the same sentences.

    scripts/serve_libretranslate.sh runs/prose/checkpoints/best &       # int8 package, port 5000
    python scripts/bench_serve.py --url http://127.0.0.1:5000 --checkpoint exports/prose_int8
    python scripts/bench_serve.py --url http://127.0.0.1:5000 --seconds 5    # a quick check

For 1 and 4 concurrent clients (--clients), each client posts one sentence at a time to
/translate (JSON, it→en) and waits for the answer, cycling through --sentences lines of
--input (FLORES-200 devtest by default), for --seconds seconds or --max-requests
requests, whichever comes first; a request that takes longer than --timeout fails.
Prints requests/s (= sentences/s), p50 and p95 latency, and failed requests, then, with
--checkpoint (a checkpoint or an mt-export directory), how fast `mt-translate`'s code
(`decoding.translate_lines`, --threads CPU threads) translates the same sentences in one
batched call, with Argos's beam (4) and with mt-translate's default (beam 5). The server
must listen on loopback (127.0.0.1, ::1, localhost): this script loads no other machine.
Run it on an otherwise idle machine; the server and this script share its CPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from transformer.config import PROJECT_ROOT, DecodeConfig
from transformer.corpus import read_lines
from transformer.runtime import describe_cpu

LOOPBACK = ("127.0.0.1", "::1", "localhost")
FLORES = PROJECT_ROOT.parent / "shared" / "data" / "eval" / "flores200-devtest.it"


def translate(url: str, text: str, timeout: float) -> None:
    body = json.dumps({"q": text, "source": "it", "target": "en"}).encode()
    req = urllib.request.Request(f"{url}/translate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        json.loads(r.read())["translatedText"]


def load(url: str, lines: list[str], clients: int, seconds: float, max_requests: int,
         timeout: float) -> dict:
    """`clients` threads, each one request at a time, until the time or count runs out."""
    lock, latencies, failed, issued = threading.Lock(), [], [0], [0]
    start = time.perf_counter()
    stop_at = start + seconds

    def client() -> None:
        while time.perf_counter() < stop_at:
            with lock:
                if issued[0] >= max_requests:
                    return
                text = lines[issued[0] % len(lines)]
                issued[0] += 1
            t0 = time.perf_counter()
            try:
                translate(url, text, timeout)
            except (OSError, ValueError, KeyError):
                with lock:
                    failed[0] += 1
                continue
            with lock:
                latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + timeout + 5)
    wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [float("nan")] * 99
    return {"clients": clients, "requests": len(latencies), "failed": failed[0], "seconds": wall,
            "rps": len(latencies) / wall, "p50": q[49], "p95": q[94]}


def offline_speed(checkpoint: str, lines: list[str], threads: int) -> list[tuple[str, str, float]]:
    """(search, engine, sentences/s) of `decoding.translate_lines` on `lines`, after a warm-up."""
    from transformer.decoding import load_for_inference, translate_lines

    model, tokenizer, device = load_for_inference(checkpoint, "cpu", threads=threads)
    engine = getattr(model, "engine", f"ours (PyTorch), {threads} threads")
    translate_lines(model, tokenizer, lines[:20], DecodeConfig(), device)
    found = []
    for name, cfg in (("beam 4 (Argos's)", DecodeConfig(beam_size=4)), ("beam 5 (mt-translate's)", DecodeConfig())):
        t0 = time.perf_counter()
        translate_lines(model, tokenizer, lines, cfg, device)
        found.append((name, engine, len(lines) / (time.perf_counter() - t0)))
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:5000")
    p.add_argument("--checkpoint", help="a checkpoint or mt-export directory to time mt-translate with")
    p.add_argument("--input", type=Path, default=FLORES)
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    p.add_argument("--max-requests", type=int, default=100_000)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    host = urlsplit(args.url).hostname
    if host not in LOOPBACK:
        p.error(f"--url {args.url}: not a loopback address ({', '.join(LOOPBACK)})")
    if not 0 < args.seconds <= 3600 or not 1 <= max(args.clients) <= 64:
        p.error("--seconds must be in (0, 3600] and --clients in [1, 64]")
    lines = [line for line in read_lines(args.input) if line.strip()][: args.sentences]
    if not lines:
        p.error(f"--input {args.input}: no sentences")
    try:
        translate(args.url, lines[0], args.timeout)  # warm-up, and is anything there?
    except (OSError, ValueError, KeyError) as e:
        p.error(f"--url {args.url}: no translation came back ({e})")
    print(f"CPU: {describe_cpu()}; {len(lines)} sentences of {args.input.name}, {args.seconds:g} s per run")
    print("\n| clients | requests | failed | requests/s | p50 latency (ms) | p95 latency (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for clients in args.clients:
        r = load(args.url, lines, clients, args.seconds, args.max_requests, args.timeout)
        print(f"| {clients} | {r['requests']} | {r['failed']} | {r['rps']:.1f} | "
              f"{r['p50'] * 1e3:.0f} | {r['p95'] * 1e3:.0f} |", flush=True)
    if args.checkpoint:
        print(f"\nmt-translate's code on the same {len(lines)} sentences, one batched call:\n")
        print("| search | engine | sentences/s |\n|---|---|---:|")
        for name, engine, speed in offline_speed(args.checkpoint, lines, args.threads):
            print(f"| {name} | {engine} | {speed:.1f} |")


if __name__ == "__main__":
    main()
