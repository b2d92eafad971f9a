"""What OMP_WAIT_POLICY costs or saves: training steps and greedy decoding, per policy.

OpenMP reads OMP_WAIT_POLICY once, when torch loads its runtime, so each policy runs in a
fresh child process; policies alternate round by round so that the machine's noise hits
them alike. `default` leaves the variable unset (libgomp spins a while before sleeping);
PASSIVE is what the `mt-*` commands set when the user has not (transformer/commands/__init__.py).

    python scripts/bench/bench_omp_wait.py                       # 2 threads, 3 rounds, quiet machine
    python scripts/bench/bench_omp_wait.py --busy 1              # plus one busy-looping process
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(threads: int, steps: int, sentences: int) -> None:
    """Time `steps` fp32 training steps and greedy decoding of `sentences` dev sentences."""
    import dataclasses

    import torch  # first: the policy is the parent's choice (`transformer.commands` sets one)

    from transformer.config import DataConfig, DecodeConfig, ModelConfig, load_preset, to_dataclass
    from transformer.data.batching import TokenBatchSampler, collate, token_lengths
    from transformer.data.pipeline import prepare_data
    from transformer.decoding.text import translate_lines
    from transformer.device import keep_large_blocks_in_the_heap
    from transformer.model.transformer import build_model
    from transformer.training.loss import batch_loss

    keep_large_blocks_in_the_heap()
    torch.set_num_threads(threads)
    data = prepare_data(to_dataclass(DataConfig, load_preset(DataConfig, ROOT / "configs/data/tatoeba.yaml")))
    tok = data.tokenizer
    cfg = to_dataclass(ModelConfig, load_preset(ModelConfig, ROOT / "configs/model/small.yaml"))
    cfg = dataclasses.replace(cfg, vocab_size=tok.vocab_size, attn_dropout=0.0, ffn_dropout=0.0)
    train = data.train.select_columns(["src_ids", "tgt_ids"])
    sampler = TokenBatchSampler(*token_lengths(train), max_tokens=4096, seed=1)
    batches = [collate(train[i], tok.pad_id, tok.bos_id, tok.eos_id)
               for i in sampler.batches(0)[: steps + 1]]
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    cpu = torch.device("cpu")
    tokens, seconds = 0, 0.0
    for i, batch in enumerate(batches):  # the first step warms up and is not timed
        t0 = time.perf_counter()
        loss, _ = batch_loss(model, batch, 0.1, "fp32", cpu)
        (loss / batch.n_tgt_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            seconds += time.perf_counter() - t0
            tokens += batch.n_tgt_tokens
    dev = data.dev.select(range(0, len(data.dev), max(1, len(data.dev) // sentences)))
    src = list(dev["src"])[:sentences]
    decode = DecodeConfig(method="greedy", max_len_a=0.0, max_len_b=20)  # random model: fixed length
    t0 = time.perf_counter()
    translate_lines(model, tok, src, decode, cpu)
    decode_seconds = time.perf_counter() - t0
    print(json.dumps({"train_tok_s": tokens / seconds, "decode_sent_s": len(src) / decode_seconds}))


def busy_loop(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8, help="timed training steps per round")
    ap.add_argument("--sentences", type=int, default=300, help="dev sentences decoded per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--policies", nargs="+", default=["default", "PASSIVE"])
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes beside each child")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.threads, args.steps, args.sentences)
    from transformer.device import describe_cpu

    print(f"CPU: {describe_cpu()}; {args.threads} threads, {args.busy} busy process(es)")
    results: dict[str, list[dict]] = {p: [] for p in args.policies}
    for _ in range(args.rounds):
        for policy in args.policies:
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if policy != "default":
                env["OMP_WAIT_POLICY"] = policy
            hogs = [subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                                      f"from scripts.bench.bench_omp_wait import busy_loop; busy_loop(3600)"])
                    for _ in range(args.busy)]
            try:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", f"--threads={args.threads}",
                     f"--steps={args.steps}", f"--sentences={args.sentences}"],
                    env=env, capture_output=True, text=True, check=True, cwd=ROOT).stdout
            finally:
                for h in hogs:
                    h.kill()
            results[policy].append(json.loads(out.strip().splitlines()[-1]))
    base = args.policies[0]
    print(f"{'policy':<10}{'train tok/s':>14}{'decode sent/s':>16}{'train vs ' + base:>18}{'decode vs ' + base:>18}")
    med = {p: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for p, rs in results.items()}
    for p, m in med.items():
        print(f"{p:<10}{m['train_tok_s']:>14,.0f}{m['decode_sent_s']:>16,.1f}"
              f"{m['train_tok_s'] / med[base]['train_tok_s']:>18.2f}"
              f"{m['decode_sent_s'] / med[base]['decode_sent_s']:>18.2f}")
        rounds = ", ".join(f"{r['train_tok_s']:,.0f}/{r['decode_sent_s']:.1f}" for r in results[p])
        print(f"{'':<10}rounds (train tok/s / decode sent/s): {rounds}")


if __name__ == "__main__":
    main()
