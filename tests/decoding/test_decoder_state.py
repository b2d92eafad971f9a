"""The compiled decoder step (transformer/decoding/decoder_state.py, `decode.compile`):
it finds what the eager step finds, stays compiled over many batches of other shapes
(dynamo's counters, torch.compile's backend swapped for dynamo's `eager` or `aot_eager`,
so only tracing and guards run on a CPU), and a compiler that fails leaves decoding eager.

Shapes: B sentences, S source length.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from transformer.config import DecodeConfig
from transformer.decoding import decoder_state
from transformer.decoding.search import beam_search, greedy_search
from transformer.decoding.text import load_for_inference, translate_nbest
from transformer.model.attention import set_attention_path

from helpers import EOS, PAD, tiny_model

ROOT = Path(__file__).resolve().parents[2]
FROZEN = ROOT / "tests/fixtures/before_layout/run/checkpoints/step_20"  # a 20-update debug model
TATOEBA_TEST = ROOT.parent / "shared/data/eval/tatoeba-test.it"


@pytest.fixture
def compile_with(monkeypatch):
    """compile_with(backend): the step's torch.compile (its mode kept) on that backend,
    compiled anew in this test; dynamo's caches and counters cleared."""
    real = torch.compile

    def use(backend):
        monkeypatch.setattr(decoder_state, "_COMPILED", {})
        monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(
            fn, backend=backend, dynamic=kw.get("dynamic"), fullgraph=kw.get("fullgraph", False)))
        torch._dynamo.reset()
        counters.clear()

    yield use
    torch._dynamo.reset()


def padded(lengths: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = [[*torch.randint(4, 12, (n,), generator=g).tolist(), EOS] for n in lengths]
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_a_compiled_step_finds_what_the_eager_step_finds(method, compile_with):
    """aot_eager traces the step as inductor would (functionalised, decomposed), without a
    compiler: the same hypotheses over batches of other sizes, rows dropping in buckets."""
    model = tiny_model(max_positions=64).eval()
    set_attention_path(model, True)  # the path a compiled step takes

    def run(src, compile):
        kw = dict(max_len_a=1.0, max_len_b=4, min_len=2, sync_every=2, buckets=True, compile=compile)
        if method == "greedy":
            return [[h] for h in greedy_search(model, src, **kw)]
        return beam_search(model, src, 3, nbest=3, **kw)

    batches = [padded([7, 3, 5, 1, 6], 1), padded([4, 9, 2], 2), padded([5, 5, 8, 3, 2, 6, 4], 3)]
    eager = [run(src, None) for src in batches]
    compile_with("aot_eager")
    for src, want in zip(batches, eager, strict=True):
        got = run(src, "reduce-overhead")
        for g, w in zip(got, want, strict=True):
            assert [h.tokens for h in g] == [h.tokens for h in w]
            assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=1e-5)
    assert counters["stats"]["unique_graphs"] <= 2  # one, and one where a dimension is 1


@pytest.mark.skipif(not TATOEBA_TEST.exists(), reason="../shared/data is not beside the project")
def test_the_compiled_step_stays_compiled_over_many_batches(compile_with, caplog):
    """The first 400 tatoeba-test lines in batches of 40, greedy and beam 5, the CUDA
    policy (a read every 4 steps, row buckets) on a CPU, decode.compile=reduce-overhead:
    dynamo never reaches its recompile limit, makes at most 6 graphs per search in all,
    and every line equals the eager step's, score included (fp32)."""
    lines = TATOEBA_TEST.read_text(encoding="utf-8").splitlines()[:400]
    model, tokenizer, device = load_for_inference(str(FROZEN), "cpu", threads=1)
    set_attention_path(model, True)
    base = dict(beam_size=5, min_len=6, max_len_b=20, precision="fp32", max_batch_size=40,
                sync_every=4, buckets=True)
    for method in ("greedy", "beam"):
        eager = translate_nbest(model, tokenizer, lines, DecodeConfig(method=method, **base), device)
        compile_with("eager")
        with caplog.at_level(logging.WARNING, logger="torch._dynamo"):
            compiled = translate_nbest(model, tokenizer, lines,
                                       DecodeConfig(method=method, compile="reduce-overhead", **base), device)
        searches = -(-len(lines) // 40)
        assert not [r for r in caplog.records if "recompile_limit" in r.getMessage()
                    or "cache_size_limit" in r.getMessage()]
        assert counters["frames"]["ok"] >= 1  # it did compile
        assert 1 <= counters["stats"]["unique_graphs"] <= 6 * searches
        assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])  # in fact
        assert sum(a == b for a, b in zip(compiled, eager, strict=True)) == len(lines)


def test_a_compiler_that_fails_leaves_decoding_eager(compile_with, monkeypatch, caplog):
    """No C++ compiler, no Triton, an inductor error: one warning line, and the batch (and
    every later one) decodes eagerly, finding what the eager step finds."""
    from torch._dynamo.backends.registry import register_backend

    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler found")

    register_backend(broken, name="broken_for_test")
    model = tiny_model(max_positions=64).eval()
    src = padded([7, 3, 5, 1, 6], 1)
    want = greedy_search(model, src, max_len_b=4, min_len=2)
    compile_with("broken_for_test")
    with caplog.at_level(logging.WARNING, logger=decoder_state.__name__):
        got = greedy_search(model, src, max_len_b=4, min_len=2, compile="default")
        again = greedy_search(model, src, max_len_b=4, min_len=2, compile="default")
    assert [h.tokens for h in got] == [h.tokens for h in want] == [h.tokens for h in again]
    warned = [r.getMessage() for r in caplog.records if r.name == decoder_state.__name__]
    assert len(warned) == 1 and "no C++ compiler found" in warned[0] and "eagerly" in warned[0]
    assert "\n" not in warned[0]


def test_the_settings_reach_the_search_by_name(monkeypatch):
    """decode.compile, decode.sync_every and decode.buckets, as a Translator keyword or a
    Hydra key fills them, are what the search is given; buckets default to on only where
    the step is compiled on a device type of `search.BUCKETS`."""
    from transformer.decoding import search as search_module

    given = []
    monkeypatch.setattr(search_module, "greedy_search", lambda *a, **kw: given.append(kw) or [])
    src = padded([3, 4], 0)
    search_module.search(None, src, DecodeConfig(method="greedy"))
    search_module.search(None, src, DecodeConfig(method="greedy", compile="reduce-overhead"))
    monkeypatch.setattr(search_module, "BUCKETS", {"cuda", "cpu"})  # as if a GPU
    search_module.search(None, src, DecodeConfig(method="greedy", compile="reduce-overhead"))
    search_module.search(None, src, DecodeConfig(method="greedy", compile="default", buckets=False,
                                                 sync_every=8))
    assert [(kw["compile"], kw["buckets"], kw["sync_every"]) for kw in given] == [
        (None, False, 1), ("reduce-overhead", False, 1), ("reduce-overhead", True, 1), ("default", False, 8)]
