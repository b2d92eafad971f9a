"""decoding/finished.py: the device-side store of finished hypotheses, checked on a
hand-written sequence of steps whose outcome is worked out on paper."""

from __future__ import annotations

import math

import pytest
import torch

from transformer.decoding.finished import Finished, Hypothesis, length_penalty

BOS = 2
CPU = torch.device("cpu")


def two_steps(lenpen: float) -> list[list[Hypothesis]]:
    """Two sentences, K = 2. Step 1: sentence 0 ends one candidate (token 5, -1.0),
    sentence 1 two (7: -2.0, 8: -3.0), which fills it. Step 2: sentence 0 ends two
    candidates (5 9: -0.5, 6 10: -4.0), of which only the first has room; sentence 1,
    done, ends one more (7 11: -0.1), which is refused."""
    f = Finished(n=2, k=2, max_tokens=3, pad_id=0, device=CPU)
    sent = torch.tensor([0, 1])
    history = torch.tensor([[BOS, 5], [BOS, 6], [BOS, 7], [BOS, 8]])  # (R, t + 1), t = 1
    f.add(sent, torch.tensor([[True, False], [True, True]]), torch.tensor([[-1.0, -9.0], [-2.0, -3.0]]),
          torch.tensor([[0, 1], [2, 3]]), history)
    assert f.close(sent).tolist() == [False, True]
    history = torch.tensor([[BOS, 5, 9], [BOS, 6, 10], [BOS, 7, 11], [BOS, 8, 12]])  # t = 2
    f.add(sent, torch.tensor([[True, True], [True, False]]), torch.tensor([[-0.5, -4.0], [-0.1, -9.0]]),
          torch.tensor([[0, 1], [2, 3]]), history)
    assert f.close(sent).tolist() == [True, True]
    return f.hypotheses(lenpen)


def test_each_sentence_keeps_its_first_k_endings_and_none_once_done():
    first, second = two_steps(lenpen=0.0)
    assert first == [Hypothesis([5, 9], -0.5), Hypothesis([5], -1.0)]  # best first; 6 10 had no room
    assert second == [Hypothesis([7], -2.0), Hypothesis([8], -3.0)]  # 7 11 came after it was done


def test_scores_are_divided_by_the_length_penalty_counting_the_eos():
    first, _ = two_steps(lenpen=1.0)
    by_tokens = {tuple(h.tokens): h.score for h in first}
    assert by_tokens[(5, 9)] == pytest.approx(-0.5 / ((5 + 3) / 6))
    assert by_tokens[(5,)] == pytest.approx(-1.0 / ((5 + 2) / 6))
    assert length_penalty(4, 0.0) == 1.0 and length_penalty(1, 1.0) == 1.0


def test_equal_scores_keep_the_order_they_finished_in():
    f = Finished(n=1, k=3, max_tokens=2, pad_id=0, device=CPU)
    history = torch.tensor([[BOS, 4], [BOS, 5], [BOS, 6]])
    f.add(torch.tensor([0]), torch.tensor([[True, True, True]]), torch.tensor([[-1.0, -1.0, -1.0]]),
          torch.tensor([[2, 0, 1]]), history)
    assert [h.tokens for h in f.hypotheses(0.0)[0]] == [[6], [4], [5]]


def test_close_also_ends_sentences_short_of_k_and_an_empty_one_has_no_hypotheses():
    f = Finished(n=2, k=2, max_tokens=2, pad_id=0, device=CPU)
    sent = torch.tensor([0, 1])
    assert f.close(sent, also=torch.tensor([False, True])).tolist() == [False, True]
    assert f.close(sent).tolist() == [False, True]  # once done, done
    assert f.hypotheses(0.0) == [[], []]
    assert math.isnan(f.scores[0])  # unused slots stay NaN: never read as a hypothesis
