"""transformer/deploy/serving.py: fair, batched, bounded translation for the LibreTranslate server.

The scheduling is checked against a scripted translator that records every call and
holds it until the test opens a gate, so the queue's order can be set up and read on
paper; the results against CTranslate2 itself on a tiny export.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from transformer.deploy.serving import (
    Budget,
    FairTranslator,
    Refused,
    ServeLimits,
    chunks,
    decode_limit,
)
from transformer.paths import PROJECT_ROOT

from helpers import tiny_checkpoint

WAIT = 10.0  # seconds any step may take before the test fails instead of hanging


class Scripted:
    """translate_batch recording each call's sentences; each sentence's n hypotheses are
    its pieces reversed (scores -len, -len-1, ...). Calls wait for `gate`."""

    def __init__(self):
        self.calls: list[list[list[str]]] = []
        self.limits: list[int] = []
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)
        self.fail_on: str | None = None

    def translate_batch(self, source, target_prefix=None, *, beam_size, num_hypotheses, **kw):
        assert kw["length_penalty"] == 0.2 and beam_size >= max(num_hypotheses, 4)
        self.calls.append([list(s) for s in source])
        self.limits.append(kw["max_decoding_length"])
        self.entered.release()
        assert self.gate.wait(WAIT)
        if self.fail_on and any(self.fail_on in s for s in source):
            raise RuntimeError("scripted failure")
        return [SimpleNamespace(hypotheses=[s[::-1]] * num_hypotheses,
                                scores=[-len(s) - i for i in range(num_hypotheses)]) for s in source]


def sentence(tag: str, pieces: int) -> list[str]:
    return [f"{tag}{i}" for i in range(pieces)]


def in_thread(fair: FairTranslator, sentences, limits: ServeLimits, n: int = 1) -> dict:
    """Start a request in a thread; the dict gets its `result` or `error`, and `thread`."""
    out: dict = {}

    def go():
        try:
            out["result"] = fair.translate(sentences, n, Budget(limits))
        except Refused as e:
            out["error"] = e

    out["thread"] = threading.Thread(target=go, daemon=True)
    out["thread"].start()
    return out


def wait_until(condition) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.fixture
def scripted():
    made = []

    def make(**limits) -> tuple[Scripted, FairTranslator, ServeLimits]:
        translator, lim = Scripted(), ServeLimits(**({"workers": 1} | limits))
        made.append((translator, FairTranslator(translator, lim)))
        return translator, made[-1][1], lim

    yield make
    for translator, fair in made:
        translator.gate.set()
        fair.close()


def test_chunks_cover_every_sentence_once_in_length_order_within_the_bound():
    lengths = [5, 1, 9, 3, 3, 20, 2, 7]
    groups = chunks(lengths, chunk_pieces=10)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    flat = [lengths[i] for g in groups for i in g]
    assert flat == sorted(lengths)
    assert all(sum(lengths[i] for i in g) <= 10 or len(g) == 1 for g in groups)
    assert [20] in [[lengths[i] for i in g] for g in groups]  # longer than a chunk: alone


def test_each_sentence_gets_its_own_hypotheses_back_in_request_order(scripted):
    translator, fair, limits = scripted(chunk_pieces=6)
    translator.gate.set()
    sentences = [sentence(t, k) for t, k in zip("abcdef", [3, 1, 5, 2, 4, 6])]
    found = fair.translate(sentences, 2, Budget(limits))
    assert [h.pieces for h in found] == [[s[::-1]] * 2 for s in sentences]
    assert [h.scores for h in found] == [[-len(s), -len(s) - 1] for s in sentences]
    assert all(sum(map(len, call)) <= 6 or len(call) == 1 for call in translator.calls)


def test_a_sentence_gets_at_most_a_times_its_length_plus_b_and_batches_share_that_limit(scripted):
    limits = ServeLimits()
    assert [decode_limit(n, limits) for n in (1, 8, 9, 16, 200, 400)] == [19, 19, 29, 29, 250, 256]
    translator, fair, limits = scripted(chunk_pieces=100)
    translator.gate.set()
    sentences = [sentence(t, k) for t, k in zip("abcdef", [3, 8, 9, 12, 17, 30])]
    fair.translate(sentences, 1, Budget(limits))
    assert sorted(map(len, translator.calls)) == [1, 1, 2, 2]  # 3 and 8, 9 and 12, 17, 30
    for call, limit in zip(translator.calls, translator.limits):
        assert {decode_limit(len(s), limits) for s in call} == {limit}


def test_a_short_request_goes_before_the_rest_of_a_long_one(scripted):
    translator, fair, limits = scripted(chunk_pieces=4)
    long = in_thread(fair, [sentence(f"L{i}-", 4) for i in range(4)], limits)  # 4 chunks
    assert translator.entered.acquire(timeout=WAIT)  # its first chunk runs, the gate shut
    short = in_thread(fair, [sentence("S", 2)], limits)
    wait_until(lambda: fair.queued() == 4)  # the long one's 3 other chunks and the short one
    translator.gate.set()
    for r in (long, short):
        r["thread"].join(WAIT)
    assert "error" not in long and "error" not in short
    assert translator.calls[1] == [sentence("S", 2)]  # the very next call
    assert len(translator.calls) == 5


def test_short_requests_waiting_together_are_decoded_as_one_batch(scripted):
    translator, fair, limits = scripted(chunk_pieces=8)
    first = in_thread(fair, [sentence("F", 3)], limits)
    assert translator.entered.acquire(timeout=WAIT)
    others = [in_thread(fair, [sentence(t, 2)], limits) for t in "abc"]
    wait_until(lambda: fair.queued() == 3)
    translator.gate.set()
    for r, tag, k in [(first, "F", 3), *((r, t, 2) for r, t in zip(others, "abc"))]:
        r["thread"].join(WAIT)
        assert r["result"][0].pieces == [sentence(tag, k)[::-1]]
    assert len(translator.calls) == 2
    assert sorted(translator.calls[1]) == [sentence(t, 2) for t in "abc"]


def test_a_request_past_its_time_budget_is_refused_and_its_jobs_never_run(scripted):
    translator, fair, limits = scripted(chunk_pieces=4)
    first = in_thread(fair, [sentence("F", 3)], limits)
    assert translator.entered.acquire(timeout=WAIT)
    late = in_thread(fair, [sentence("X", 2), sentence("Y", 4)], ServeLimits(seconds=0.2, workers=1))
    late["thread"].join(WAIT)
    assert late["error"].status == 503 and "did not finish within 0.2 s" in late["error"].message
    assert fair.queued() == 0
    translator.gate.set()
    first["thread"].join(WAIT)
    assert first["result"] and len(translator.calls) == 1  # X and Y were never translated


def test_a_failing_call_fails_its_requests_and_the_workers_go_on(scripted):
    translator, fair, limits = scripted()
    translator.fail_on = "bad0"
    translator.gate.set()
    with pytest.raises(RuntimeError, match="scripted failure"):
        fair.translate([sentence("bad", 2)], 1, Budget(limits))
    assert fair.translate([sentence("ok", 2)], 1, Budget(limits))[0].pieces == [["ok1", "ok0"]]


def test_the_budget_refuses_a_request_over_its_sentences_or_pieces():
    budget = Budget(ServeLimits(max_sentences=10, max_pieces=100))
    budget.charge(10, 100)
    with pytest.raises(Refused, match=r"11 sentences .* exceed the limit of 10") as e:
        budget.charge(1, 0)
    assert e.value.status == 400
    budget = Budget(ServeLimits(max_sentences=10, max_pieces=100))
    budget.charge(50, 500, check=False)  # counted first, checked once: the error gives the total
    with pytest.raises(Refused, match="50 sentences"):
        budget.check()
    with pytest.raises(ValueError, match="workers=0: must be >= 1"):
        ServeLimits(workers=0).check()


def test_batched_results_equal_each_sentence_translated_alone(tmp_path):
    """With CTranslate2 and a tiny fp32 model (max_positions 300: a random model writes
    until its length limit): sentences of several requests, batched and cut
    into chunks, come back as translating each one alone gives them. In fp32 a batch's
    padding changes scores by float rounding only; int8 can turn such a difference into
    another hypothesis where scores nearly tie (as Argos's own batches can): see
    docs/serving.md."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    spm = pytest.importorskip("sentencepiece")
    from transformer.commands.export import export
    from transformer.data.corpus import read_lines
    from transformer.deploy.ct2_export import ExportConfig

    from helpers import SAMPLE

    ct2 = export(ExportConfig(checkpoint=str(tiny_checkpoint(tmp_path / "ckpt", max_positions=300)),
                              output=str(tmp_path / "ct2"), quantization="none"))
    sp = spm.SentencePieceProcessor(model_file=str(ct2 / "tokenizer.model"))
    translator = ctranslate2.Translator(str(ct2), compute_type="default", inter_threads=2, intra_threads=1)
    sentences = [sp.encode(line, out_type=str) for line in read_lines(SAMPLE / "dev.it")[:24]]
    limits = ServeLimits(chunk_pieces=40, workers=2)
    fair = FairTranslator(translator, limits)
    try:
        requests = [sentences[i::3] for i in range(3)]
        results: list = [None] * 3

        def go(k):
            results[k] = fair.translate(requests[k], 2, Budget(limits))

        threads = [threading.Thread(target=go, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        fair.close()
    for request, found in zip(requests, results):
        for s, hyp in zip(request, found):
            alone = translator.translate_batch([s], beam_size=4, num_hypotheses=2, length_penalty=0.2,
                                               replace_unknowns=True, return_scores=True,
                                               max_decoding_length=decode_limit(len(s), limits))[0]
            assert hyp.pieces == alone.hypotheses
            assert hyp.scores == pytest.approx(alone.scores, abs=1e-4)


def test_the_script_refuses_a_serve_home_holding_the_users_files(tmp_path):
    """MT_SERVE_HOME is where the script writes its package, index and caches: a folder
    that holds files it did not write is refused in one line, before anything is packed,
    and the files are left as they were."""
    home = tmp_path / "mine"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    (home / "ckpt.argosmodel").write_text("also mine")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = PROJECT_ROOT / "scripts" / "serving" / "serve_libretranslate.sh"
    proc = subprocess.run([str(script), str(tmp_path), str(port)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "MT_SERVE_HOME": str(home)})
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"serve_libretranslate: error: MT_SERVE_HOME={home} holds files this "
                                   "script did not write: name a new or empty folder")
    assert sorted(p.name for p in home.iterdir()) == ["ckpt.argosmodel", "notes.txt"]
    assert (home / "ckpt.argosmodel").read_text() == "also mine"
