"""Sampling decoding: top-k 1 is greedy, draws follow the model's distribution (truncated
and tempered as asked), a seed reproduces them whatever the batch, the host reads the
device no more than in greedy search."""

from __future__ import annotations

import math

import pytest
import torch

from transformer.config import ConfigError, DecodeConfig, ModelConfig
from transformer.decoding.sampling import Sampler, sentence_key, unit_keys
from transformer.decoding.search import greedy_search, search
from transformer.decoding.text import translate_nbest
from transformer.device import HostReads

from helpers import LINES, pad_batch, tiny_model

# Chi-square critical values at p = 0.001, by degrees of freedom: a correct sampler fails
# one of these tests with probability 1/1000 per seed; the seeds here are fixed.
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47}


class FixedModel:
    """A fake model whose next-token logits are the same at every step and row: the
    distribution of a first token is known exactly."""

    def __init__(self, logits: list[float]) -> None:
        self.cfg = ModelConfig(vocab_size=len(logits), max_positions=8)
        self.logits = torch.tensor(logits)

    def encode(self, src_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*src_ids.shape, 1)

    def decode(self, tgt_in_ids, memory, src_ids, cache=None):
        return self.logits.expand(*tgt_in_ids.shape, -1).clone()


# pad 0, unk 1, bos 2, eos 3: pad and bos are never drawn, EOS not before min_len=1
LOGITS = [0.0, -1.0, 0.0, 0.5, 1.0, 0.3, -0.5, 2.0]
ALLOWED = [1, 4, 5, 6, 7]


def first_tokens(cfg: DecodeConfig, n: int = 20000) -> torch.Tensor:
    """The first token drawn for each of n sentences (their keys: lines 0..n-1)."""
    model = FixedModel(LOGITS)
    src = torch.full((n, 2), 4)
    hyps = search(model, src, cfg, keys=unit_keys(cfg.seed, list(range(n))))
    return torch.tensor([h[0].tokens[0] for h in hyps])


def chi2(tokens: torch.Tensor, expected: dict[int, float]) -> float:
    n = tokens.numel()
    counts = {t: int((tokens == t).sum()) for t in expected}
    assert sum(counts.values()) == n  # nothing outside the expected support
    return sum((counts[t] - n * p) ** 2 / (n * p) for t, p in expected.items())


def tempered(ids: list[int], temperature: float) -> dict[int, float]:
    weights = torch.softmax(torch.tensor([LOGITS[i] for i in ids]) / temperature, dim=0)
    return dict(zip(ids, weights.tolist(), strict=True))


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_first_tokens_follow_softmax_of_logits_over_temperature(temperature):
    cfg = DecodeConfig(method="sample", sampling_temperature=temperature, seed=3,
                       max_len_a=0, max_len_b=1, batch_tokens=None)
    tokens = first_tokens(cfg)
    assert chi2(tokens, tempered(ALLOWED, temperature)) < CHI2_999[len(ALLOWED) - 1]


def test_topk_draws_only_the_k_best_in_their_proportions():
    cfg = DecodeConfig(method="sample", sampling_topk=3, seed=4, max_len_a=0, max_len_b=1)
    kept = [7, 4, 5]  # the three best of ALLOWED
    assert chi2(first_tokens(cfg), tempered(kept, 1.0)) < CHI2_999[2]


def test_topp_keeps_the_smallest_prefix_that_reaches_p_then_temperature():
    # probabilities over ALLOWED: 7 .57, 4 .21, 5 .11, 1 .03 ...; topp .7 keeps 7 and 4
    p = tempered(ALLOWED, 1.0)
    assert p[7] < 0.7 < p[7] + p[4]
    cfg = DecodeConfig(method="sample", sampling_topp=0.7, sampling_temperature=0.5, seed=5,
                       max_len_a=0, max_len_b=1)
    assert chi2(first_tokens(cfg), tempered([7, 4], 0.5)) < CHI2_999[1]


@pytest.mark.parametrize("topk,topp", [(3, 1.0), (0, 0.5), (5, 0.3), (0, 0.9)])
def test_truncation_never_draws_outside_the_kept_set(topk, topp):
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(3 * torch.randn(4000, 50, generator=g), dim=-1)
    logp[:, :2] = -math.inf  # forbidden ids, as the search writes them
    sampler = Sampler(torch.tensor([sentence_key(0, i, 0) for i in range(4000)]), topk, topp, 1.3)
    rows = torch.arange(4000)
    order = logp.argsort(dim=-1, descending=True)
    probs = logp.exp().gather(1, order)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    keep = (probs.cumsum(dim=-1) - probs) < topp  # the nucleus: mass before a token below p
    if topk:
        keep[:, topk:] = False
    for step in range(5):
        tokens = sampler(logp, rows, step)
        rank = (order == tokens[:, None]).float().argmax(dim=-1)
        assert keep.gather(1, rank[:, None]).all()
    assert len(set(tokens.tolist())) > 1


@pytest.mark.parametrize("seed", [0, 7])
def test_topk_1_equals_greedy_token_for_token(seed):
    model = tiny_model(seed=seed)
    src = pad_batch([[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [17]])
    greedy = search(model, src, DecodeConfig(method="greedy", lenpen=0.6))
    for topp, temperature in ((1.0, 1.0), (0.5, 3.0)):
        cfg = DecodeConfig(method="sample", sampling_topk=1, sampling_topp=topp,
                           sampling_temperature=temperature, seed=seed, lenpen=0.6)
        sampled = search(model, src, cfg)
        assert [h[0].tokens for h in sampled] == [h[0].tokens for h in greedy]
        assert [h[0].score for h in sampled] == [h[0].score for h in greedy]


def test_the_same_seed_draws_the_same_and_another_seed_differs():
    model = tiny_model()
    src = pad_batch([[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [17]])

    def draw(seed: int) -> list[list[int]]:
        return [h[0].tokens for h in search(model, src, DecodeConfig(method="sample", seed=seed))]

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)
    assert draw(1) != [h[0].tokens for h in search(model, src, DecodeConfig(method="greedy"))]


def test_a_sampled_hypothesis_scores_the_models_log_probabilities():
    model = FixedModel(LOGITS)
    cfg = DecodeConfig(method="sample", sampling_temperature=0.3, sampling_topk=2, lenpen=0.0,
                       max_len_a=0, max_len_b=1)
    logp = torch.log_softmax(torch.tensor(LOGITS), dim=0)
    for hyps in search(model, torch.full((50, 2), 4), cfg):
        (token,) = hyps[0].tokens
        assert hyps[0].score == pytest.approx(float(logp[token] + logp[3]))  # the token, then EOS


def test_a_sentence_draws_the_same_alone_or_in_any_batch(checkpoint_model):
    """Keys come from each sentence's place in the input: batch sizes, order by length and
    windows change nothing (beyond the rounding of the model's probabilities)."""
    model, tokenizer = checkpoint_model
    lines = LINES * 3  # the same sentence at several lines: each line its own draws
    cfg = DecodeConfig(method="sample", seed=11, max_len_a=0.0, max_len_b=6)

    def texts(found):
        return [hyps[0][0] for hyps in found]

    whole = translate_nbest(model, tokenizer, lines, cfg)
    one_by_one = translate_nbest(model, tokenizer, lines, DecodeConfig(**{**vars(cfg), "max_batch_size": 1}))
    assert texts(one_by_one) == texts(whole)
    assert [h[0][1] for h in one_by_one] == pytest.approx([h[0][1] for h in whole], abs=1e-4)
    assert texts(translate_nbest(model, tokenizer, lines[5:], cfg, first_line=6)) == texts(whole)[5:]
    assert texts(whole)[0] != texts(whole)[len(LINES)]  # the same sentence on another line: new draws


def test_sampling_reads_the_device_no_more_than_greedy(monkeypatch):
    """The draw is device ops only: the reads are greedy search's (the step's one read,
    how many are live), at the same places, none in the sampler."""
    model = tiny_model()
    monkeypatch.setattr(type(model), "_check_ids", lambda self, ids, name: None)  # the model's own
    steps = []
    decode = model.decode
    monkeypatch.setattr(model, "decode", lambda *a, **kw: steps.append(1) or decode(*a, **kw))
    src = pad_batch([[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [17]])
    kw = dict(max_len_a=1.0, max_len_b=4, min_len=1)
    sampler = Sampler.build(DecodeConfig(method="sample", sampling_topk=5, sampling_topp=0.9,
                                         sampling_temperature=0.8), None, 4, src.device)
    with HostReads(sites=True) as greedy:
        greedy_search(model, src, **kw)
    steps.clear()
    with HostReads(sites=True) as sampled:
        greedy_search(model, src, sampler=sampler, **kw)
    assert sampled.by_site.keys() <= greedy.by_site.keys(), sampled.by_site
    search_reads = sum(n for site, n in sampled.by_site.items() if site.startswith("search.py"))
    assert search_reads <= len(steps) + 1  # one a step, and the shortest limit before them
    assert len(steps) >= 4


@pytest.mark.parametrize("setting,message", [
    (dict(sampling_topk=-1), "decode.sampling_topk=-1: must be >= 0"),
    (dict(sampling_topp=0.0), "decode.sampling_topp=0.0: must be in (0, 1]"),
    (dict(sampling_topp=1.5), "decode.sampling_topp=1.5: must be in (0, 1]"),
    (dict(sampling_temperature=0.0), "decode.sampling_temperature=0.0: must be > 0"),
    (dict(seed=-1), "decode.seed=-1: must be >= 0"),
    (dict(nbest=2, beam_size=2), "decode.nbest=2: sampling gives one hypothesis"),
])
def test_bad_sampling_settings_are_one_line_errors(setting, message):
    with pytest.raises(ConfigError) as e:
        DecodeConfig(method="sample", **setting).validate()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_keys_name_the_line_and_the_sentence_within_it():
    keys = unit_keys(5, [0, 0, 1, 2, 2, 2], first_line=10)
    assert keys == [sentence_key(5, 9, 0), sentence_key(5, 9, 1), sentence_key(5, 10, 0),
                    sentence_key(5, 11, 0), sentence_key(5, 11, 1), sentence_key(5, 11, 2)]
    assert len({sentence_key(s, line, 0) for s in range(20) for line in range(200)}) == 4000


@pytest.fixture(scope="module")
def checkpoint_model(checkpoint):
    from transformer.checkpoint import load_model

    model, tokenizer = load_model(checkpoint, torch.device("cpu"))
    return model.eval(), tokenizer

