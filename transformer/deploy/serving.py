"""Fair, batched translation for a server: every request's cost bounded, none starved.

Used by `scripts/serving/libretranslate_guard.py` inside LibreTranslate's own venv, so it imports
nothing but the standard library (the translator it is handed is a
`ctranslate2.Translator`, or anything with its `translate_batch`).

A request's sentences (all its texts, lines and sentences) are sorted by length and cut
into chunks of at most `chunk_pieces` source pieces, each chunk of sentences that share a
length limit; every chunk is a job on one queue, served by `workers` threads, one
CTranslate2 call each (the translator's `inter_threads`). A sentence of n pieces gets at
most a·n' + b target pieces (mt-translate's rule, a = 1.2, b = 10, n' = n rounded up to a
multiple of `length_bucket`) instead of CTranslate2's flat 256, so that what a request
costs follows its length: text that makes the model babble cannot cost 256 steps a
sentence.
The queue is ordered by how much of its request came before the job (least attained
service first), then by arrival: a one-sentence request goes before the second chunk of
any long one, so it waits for at most the chunks already running, never for whole long
requests; long requests share what is left round-robin. A worker fills its call with
the next jobs of the queue (any request, same search settings) up to `chunk_pieces`, so
concurrent short requests are decoded as one batch (those whose limits agree). A
request past its deadline is
answered with `Refused` (503) and its jobs not yet started are dropped.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

LENGTH_PENALTY = 0.2  # Argos's, fixed in its code (translate.apply_packaged_translation)


class Refused(Exception):
    """A request the server answers with `status` and `message` instead of translating."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class ServeLimits:
    """What one request may cost, and how the translator is shared."""

    max_sentences: int = 1000  # sentences a request may hold (all its texts and lines)
    max_pieces: int = 20_000  # source pieces a request may hold
    chunk_pieces: int = 256  # source pieces a CTranslate2 call takes at most
    seconds: float = 20.0  # a request's time budget, queueing included
    workers: int = 2  # concurrent CTranslate2 calls (the translator's inter_threads)
    max_len_a: float = 1.2  # a sentence of n pieces gets at most a * n' + b target pieces,
    max_len_b: int = 10  # as DecodeConfig's (mt-translate's) defaults; CTranslate2's cap is 256
    length_bucket: int = 8  # n' = n rounded up to a multiple of this: sentences whose n'
    # agree share a limit, so they can share a batch

    def check(self) -> None:
        for name in ("max_sentences", "max_pieces", "chunk_pieces", "workers", "length_bucket"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if not 0 < self.seconds <= 3600:
            raise ValueError(f"seconds={self.seconds}: must be in (0, 3600]")
        if self.max_len_a < 0 or self.max_len_b < 1:
            raise ValueError(f"max_len_a={self.max_len_a}, max_len_b={self.max_len_b}: "
                             "a must be >= 0 and b >= 1")


MAX_DECODING = 256  # CTranslate2's default max_decoding_length, Argos's limit


def decode_limit(pieces: int, limits: ServeLimits) -> int:
    """The most target pieces a sentence of `pieces` source pieces may get."""
    bucket = -(-pieces // limits.length_bucket) * limits.length_bucket
    return min(MAX_DECODING, int(limits.max_len_a * bucket + limits.max_len_b))


class Budget:
    """One request's deadline and how many sentences and pieces it may still spend."""

    def __init__(self, limits: ServeLimits, clock: Callable[[], float] = time.monotonic):
        self.limits, self.clock = limits, clock
        self.deadline = clock() + limits.seconds
        self.sentences = self.pieces = 0

    def charge(self, sentences: int, pieces: int, check: bool = True) -> None:
        """Count sentences and pieces of the request; `check` them against the limits."""
        self.sentences += sentences
        self.pieces += pieces
        if check:
            self.check()

    def check(self) -> None:
        """Refused (400) if the request holds more than the limits allow."""
        lim = self.limits
        if self.sentences > lim.max_sentences:
            raise Refused(400, f"Invalid request: {self.sentences} sentences (all texts, lines "
                               f"and sentences together) exceed the limit of {lim.max_sentences} "
                               "a request: send fewer lines or split the text")
        if self.pieces > lim.max_pieces:
            raise Refused(400, f"Invalid request: {self.pieces} tokens exceed the limit of "
                               f"{lim.max_pieces} a request: send less text")

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def expired(self) -> Refused:
        return Refused(503, f"Server busy: the translation did not finish within "
                            f"{self.limits.seconds:g} s; try again, or send less text a request")


@dataclass
class Hypotheses:
    """The n best translations of one sentence: pieces and scores, best first."""

    pieces: list[list[str]]
    scores: list[float]


@dataclass(order=True)
class _Job:
    priority: tuple[int, int]  # (pieces of its request before it, arrival)
    sentences: list[list[str]] = field(compare=False)
    options: tuple = field(compare=False)  # (num_hypotheses, beam_size, length limit): a batch shares them
    prefix: list[str] | None = field(compare=False)
    done: threading.Event = field(compare=False, default_factory=threading.Event)
    result: list[Hypotheses] | None = field(compare=False, default=None)
    error: BaseException | None = field(compare=False, default=None)
    cancelled: bool = field(compare=False, default=False)
    taken: bool = field(compare=False, default=False)  # in a batch (still in the heap until popped)

    @property
    def pieces(self) -> int:
        return sum(len(s) for s in self.sentences)


def chunks(lengths: Sequence[int], chunk_pieces: int,
           key: Callable[[int], int] = lambda n: 0) -> list[list[int]]:
    """Indices of sentences grouped into chunks of at most `chunk_pieces` pieces (a longer
    sentence alone) whose `key` of the length agrees, in order of length so that a chunk
    pads little."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    size = 0
    for i in order:
        if not groups or size + lengths[i] > chunk_pieces or key(lengths[i]) != key(lengths[groups[-1][0]]):
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += lengths[i]
    return groups


class FairTranslator:
    """`workers` threads sharing one translator, serving jobs least-served request first."""

    def __init__(self, translator, limits: ServeLimits, beam_size: int = 4):
        limits.check()
        self.translator, self.limits, self.beam_size = translator, limits, beam_size
        self._queue: list[_Job] = []
        self._cond = threading.Condition()
        self._arrivals = itertools.count()
        self._stopped = False
        self._threads = [threading.Thread(target=self._work, name=f"translate-{i}", daemon=True)
                         for i in range(limits.workers)]
        for t in self._threads:
            t.start()

    def translate(self, sentences: list[list[str]], num_hypotheses: int, budget: Budget,
                  prefix: list[str] | None = None) -> list[Hypotheses]:
        """The `num_hypotheses` best translations of each sentence (lists of pieces), with
        Argos's search (beam max(n, beam_size), length penalty 0.2). Refused (503) if
        `budget` runs out first."""
        if not sentences:
            return []
        arrival = next(self._arrivals)
        beam = max(num_hypotheses, self.beam_size)
        limit = lambda n: decode_limit(n, self.limits)  # noqa: E731
        jobs, before = [], 0
        for group in chunks([len(s) for s in sentences], self.limits.chunk_pieces, limit):
            options = (num_hypotheses, beam, limit(len(sentences[group[0]])))
            job = _Job((before, arrival), [sentences[i] for i in group], options, prefix)
            before += job.pieces
            jobs.append((group, job))
        with self._cond:
            for _, job in jobs:
                heapq.heappush(self._queue, job)
            self._cond.notify_all()
        results: list[Hypotheses | None] = [None] * len(sentences)
        for group, job in jobs:
            if not job.done.wait(max(0.0, budget.remaining())):
                self._cancel([j for _, j in jobs])
                raise budget.expired()
            if job.error is not None:
                raise job.error
            for i, hyp in zip(group, job.result):
                results[i] = hyp
        return results

    def close(self) -> None:
        """Stop the workers once the jobs they run are done (the queue is dropped)."""
        with self._cond:
            self._stopped = True
            self._queue.clear()
            self._cond.notify_all()
        for t in self._threads:
            t.join()

    def queued(self) -> int:
        with self._cond:
            return sum(not (j.cancelled or j.taken) for j in self._queue)

    def _cancel(self, jobs: list[_Job]) -> None:
        with self._cond:
            for job in jobs:
                job.cancelled = True

    def _next_batch(self) -> list[_Job] | None:
        """The best job of the queue and the next best that fit beside it (the same
        options, `chunk_pieces` in all); None once closed."""
        with self._cond:
            while True:
                while self._queue and (self._queue[0].cancelled or self._queue[0].taken):
                    heapq.heappop(self._queue)
                if self._stopped:
                    return None
                if self._queue:
                    break
                self._cond.wait()
            batch = [heapq.heappop(self._queue)]
            size = batch[0].pieces
            for job in sorted(self._queue):  # a few dozen jobs at most: the requests in flight
                if size >= self.limits.chunk_pieces:
                    break
                if job.cancelled or job.taken or job.options != batch[0].options \
                        or job.prefix != batch[0].prefix or size + job.pieces > self.limits.chunk_pieces:
                    continue
                job.taken = True
                batch.append(job)
                size += job.pieces
            return batch

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                found = self._run(batch)
            except Exception as e:  # a bug or a CTranslate2 error: every request of the batch gets it
                for job in batch:
                    job.error = e
                    job.done.set()
                continue
            start = 0
            for job in batch:
                job.result = found[start:start + len(job.sentences)]
                start += len(job.sentences)
                job.done.set()

    def _run(self, batch: list[_Job]) -> list[Hypotheses]:
        num_hypotheses, beam_size, limit = batch[0].options
        source = [s for job in batch for s in job.sentences]
        prefix = None if batch[0].prefix is None else [batch[0].prefix] * len(source)
        found = self.translator.translate_batch(
            source, target_prefix=prefix, replace_unknowns=True, beam_size=beam_size,
            num_hypotheses=num_hypotheses, length_penalty=LENGTH_PENALTY, return_scores=True,
            max_decoding_length=limit)
        return [Hypotheses([list(h) for h in r.hypotheses], list(r.scores)) for r in found]
