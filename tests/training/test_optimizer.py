"""The paper's learning-rate schedule: linear warm-up to the peak, then 1/sqrt(step) decay."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from transformer.config import OptimConfig
from transformer.training.optimizer import build_optimizer, build_scheduler, inverse_sqrt_lr


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


def test_the_fused_cpu_adam_takes_the_same_steps_as_pytorchs_loop_and_reads_its_state():
    """optim.fused=true runs one fused kernel on CPU too: the same updates as the per-tensor
    loop (fp32 rounding aside), and a state saved by either resumes in the other."""
    def setup(fused: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        opt = build_optimizer(model, OptimConfig(lr=1e-2, fused=fused), torch.device("cpu"))
        return model, opt

    def steps(model, opt, n, seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(n):
            loss = model(torch.randn(32, 8, generator=g)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    (fused, fused_opt), (loop, loop_opt) = setup(True), setup(False)
    assert fused_opt.defaults["fused"] and not loop_opt.defaults["fused"]
    steps(fused, fused_opt, 5, seed=1)
    steps(loop, loop_opt, 5, seed=1)
    for a, b in zip(fused.parameters(), loop.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # resume across the two: the loop's state into a fused optimizer, and on
    resumed, resumed_opt = setup(True)
    resumed.load_state_dict(copy.deepcopy(loop.state_dict()))  # as from a file: no shared tensors
    resumed_opt.load_state_dict(copy.deepcopy(loop_opt.state_dict()))
    steps(resumed, resumed_opt, 3, seed=2)
    steps(loop, loop_opt, 3, seed=2)
    for a, b in zip(resumed.parameters(), loop.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
