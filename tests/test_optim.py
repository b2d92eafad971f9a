"""The paper's learning-rate schedule: linear warm-up to the peak, then 1/sqrt(step) decay."""

from __future__ import annotations

import itertools

import pytest
import torch

from transformer.config import OptimConfig
from transformer.optim import build_optimizer, build_scheduler, inverse_sqrt_lr


def lrs(peak: float, warmup: int, updates: int) -> list[float]:
    """The learning rate each of the first `updates` optimizer updates runs with."""
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, OptimConfig(lr=peak, warmup_steps=warmup), torch.device("cpu"))
    sched = build_scheduler(opt, OptimConfig(lr=peak, warmup_steps=warmup))
    out = []
    for _ in range(updates):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warm_up_is_linear_and_peaks_at_warmup_steps():
    seen = lrs(1e-3, warmup=10, updates=40)
    assert seen[:10] == pytest.approx([1e-3 * (i + 1) / 10 for i in range(10)])
    assert max(seen) == pytest.approx(1e-3) and seen.index(max(seen)) == 9  # the 10th update


def test_after_warm_up_the_rate_decays_as_one_over_sqrt_step():
    seen = lrs(1e-3, warmup=10, updates=160)
    # update n (1-based) runs at peak * sqrt(warmup / n): 4x the steps, half the rate
    assert seen[39] == pytest.approx(seen[9] / 2)
    assert seen[159] == pytest.approx(seen[9] / 4)
    assert all(a > b for a, b in itertools.pairwise(seen[9:]))


@pytest.mark.parametrize(("d_model", "warmup"), [(512, 4000), (256, 1000)])
def test_it_is_the_papers_formula_with_the_peak_made_explicit(d_model, warmup):
    """Vaswani et al. 2017, eq. 3: d^-0.5 * min(n^-0.5, n * warmup^-1.5)."""
    peak = (d_model * warmup) ** -0.5
    for n in (1, 10, warmup // 2, warmup, 2 * warmup, 25 * warmup):
        paper = d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)
        assert inverse_sqrt_lr(n, peak, warmup) == pytest.approx(paper)
