"""decoding/finished.py: the device-side store of ending candidates and back-pointers,
checked on hand-written sequences of steps whose outcome is worked out on paper."""

from __future__ import annotations

import math

import pytest
import torch

from transformer.decoding.finished import Finished, Hypothesis, length_penalty

CPU = torch.device("cpu")
NAN = math.nan


def two_steps(lenpen: float) -> list[list[Hypothesis]]:
    """Two sentences, K = 2, one row each at step 0 (rows 0 and 1).
    Step 0: sentence 0 ends one candidate (the empty output, -1.0), sentence 1 one (-2.0).
    Both fan out: rows 0, 1 of step 1 extend row 0 with 5 and 6; rows 2, 3 extend row 1
    with 7 and 8.
    Step 1: sentence 0 ends two (5: -0.5, 6: -4.0), of which only the first has room;
    sentence 1 ends two (7: -0.125, 8: -0.375), of which only the first has room."""
    f = Finished(n=2, k=2, steps=3, rows=4, device=CPU)
    sent = torch.tensor([0, 1])
    f.add(0, sent, torch.tensor([[-1.0, NAN], [-2.0, NAN]]), torch.tensor([[0, 0], [1, 1]]))
    f.follow(0, torch.tensor([0, 0, 1, 1]), torch.tensor([5, 6, 7, 8]))
    f.add(1, sent, torch.tensor([[-0.5, -4.0], [-0.125, -0.375]]), torch.tensor([[0, 1], [2, 3]]))
    return f.hypotheses(lenpen)


def test_each_sentence_keeps_its_first_k_endings_in_step_order():
    first, second = two_steps(lenpen=0.0)
    assert first == [Hypothesis([5], -0.5), Hypothesis([], -1.0)]  # best first; 6 had no room
    assert second == [Hypothesis([7], -0.125), Hypothesis([], -2.0)]  # 8 came after K were found


def test_scores_are_divided_by_the_length_penalty_counting_the_eos():
    first, _ = two_steps(lenpen=1.0)
    by_tokens = {tuple(h.tokens): h.score for h in first}
    assert by_tokens[(5,)] == pytest.approx(-0.5 / ((5 + 2) / 6))
    assert by_tokens[()] == pytest.approx(-1.0 / ((5 + 1) / 6))
    assert length_penalty(4, 0.0) == 1.0 and length_penalty(1, 1.0) == 1.0


def test_back_pointers_give_each_hypothesis_its_own_tokens():
    """Step 0: rows 0, 1 take 5, 6; step 1: row 0 extends row 1 with 9, row 1 row 0 with
    10; both end at step 2: their outputs are 6 9 and 5 10."""
    f = Finished(n=1, k=2, steps=3, rows=2, device=CPU)
    f.follow(0, torch.tensor([0, 0]), torch.tensor([5, 6]))
    f.follow(1, torch.tensor([1, 0]), torch.tensor([9, 10]))
    f.add(2, torch.tensor([0]), torch.tensor([[-1.0, -2.0]]), torch.tensor([[0, 1]]))
    assert f.hypotheses(0.0) == [[Hypothesis([6, 9], -1.0), Hypothesis([5, 10], -2.0)]]


def test_equal_scores_keep_the_order_they_finished_in():
    f = Finished(n=1, k=3, steps=2, rows=3, device=CPU)
    f.follow(0, torch.tensor([0, 0, 0]), torch.tensor([4, 5, 6]))
    f.add(1, torch.tensor([0]), torch.tensor([[-1.0, -1.0, -1.0]]), torch.tensor([[2, 0, 1]]))
    assert [h.tokens for h in f.hypotheses(0.0)[0]] == [[6], [4], [5]]


def test_nothing_is_filed_past_a_sentences_maximum_length_and_none_may_end():
    """Sentence 0 may write at most 0 tokens: its step-1 ending, from rows that decoded on
    after it was done, is not filed. A sentence with no finite ending has no hypotheses."""
    f = Finished(n=2, k=1, steps=2, rows=2, device=CPU, max_len=torch.tensor([0, 1]))
    sent = torch.tensor([0, 1])
    f.add(0, sent, torch.tensor([[-3.0], [-math.inf]]), torch.tensor([[0], [1]]))
    f.add(1, sent, torch.tensor([[-0.1], [NAN]]), torch.tensor([[0], [1]]))
    assert f.hypotheses(0.0) == [[Hypothesis([], -3.0)], []]
