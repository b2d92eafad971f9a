"""Precision follows the hardware: `auto` resolves by the CPU's or GPU's bf16 support."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from transformer import device
from transformer.device import autocast, describe_cpu, resolve_precision
from transformer.paths import PROJECT_ROOT
from transformer.training import distributed

CPU, CUDA = torch.device("cpu"), torch.device("cuda:0")  # CUDA is never touched: mocked


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    monkeypatch.setattr(device, "cpu_bf16_support", lambda: (False, "AVX2 only, no AVX512-BF16 or AMX"))


@pytest.fixture
def cpu_with_bf16(monkeypatch):
    monkeypatch.setattr(device, "cpu_bf16_support", lambda: (True, "AVX512 with AVX512-BF16"))


def test_auto_is_fp32_on_a_cpu_without_native_bf16(cpu_without_bf16):
    precision, why = resolve_precision("auto", CPU)
    assert precision == "fp32"
    assert "no native bf16 (AVX2 only" in why


def test_auto_is_bf16_on_a_cpu_with_native_bf16(cpu_with_bf16):
    assert resolve_precision("auto", CPU) == ("bf16", "auto: the CPU has native bf16 (AVX512 with AVX512-BF16)")


@pytest.mark.parametrize(("bf16", "expected"), [(True, "bf16"), (False, "fp16")])
def test_auto_on_a_gpu_is_bf16_where_it_has_it_else_fp16(monkeypatch, bf16, expected):
    monkeypatch.setattr(device, "cuda_bf16_support", lambda device: (bf16, "a GPU"))
    assert resolve_precision("auto", CUDA)[0] == expected
    assert resolve_precision("fp32", CUDA)[0] == "fp32"  # an explicit choice stands


def test_explicit_bf16_on_a_cpu_without_it_warns_with_the_cost(cpu_without_bf16, caplog):
    with caplog.at_level(logging.WARNING):
        assert resolve_precision("bf16", CPU)[0] == "bf16"  # runs as asked ...
    assert "trainer.precision=bf16 on a CPU without native bf16" in caplog.text  # ... but says so
    assert "about 30x slower than fp32" in caplog.text


def test_explicit_bf16_on_a_cpu_with_it_is_silent(cpu_with_bf16, caplog):
    with caplog.at_level(logging.WARNING):
        assert resolve_precision("bf16", CPU)[0] == "bf16"
    assert not caplog.text


def test_fp16_needs_cuda_and_unknown_precisions_are_refused(cpu_with_bf16):
    with pytest.raises(ValueError, match=r"decode.precision=fp16 needs CUDA"):
        resolve_precision("fp16", CPU, key="decode.precision")
    with pytest.raises(ValueError, match=r"trainer.precision='fp8': choose one of auto"):
        resolve_precision("fp8", CPU)


def test_the_real_cpu_is_described(monkeypatch):
    monkeypatch.delenv(device.CPU_BF16_ENV)  # the suite pins the capability (conftest): ask the CPU
    native, features = device.cpu_bf16_support()
    assert isinstance(native, bool) and features
    assert ("no native bf16" in describe_cpu()) != native


AUTO_IN_A_CHILD = ("import torch; from transformer import device; "
                   "print(device.cpu_bf16_support()[0], device.resolve_precision('auto', torch.device('cpu'))[0])")


def _child(env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-c", AUTO_IN_A_CHILD], env={**env, "PYTHONPATH": str(PROJECT_ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_a_process_a_test_starts_resolves_auto_as_the_suite_does():
    """The torchrun workers, commands and sweeps the tests start inherit the pin: on a CPU
    with native bf16 they trained in bf16 while the in-process reference ran fp32 (the DDP
    test failed on a Zen 4 only). The child names the pin on every CPU kind."""
    assert os.environ[device.CPU_BF16_ENV] == "0"
    assert resolve_precision("auto", CPU)[0] == "fp32"
    assert _child(dict(os.environ)) == "False fp32"


def test_unpinned_a_child_detects_the_cpu_as_this_process_does(monkeypatch):
    """The real detection, in a subprocess and here: the same answer on any CPU kind."""
    monkeypatch.delenv(device.CPU_BF16_ENV)
    native = device.cpu_bf16_support()[0]
    env = {k: v for k, v in os.environ.items() if k != device.CPU_BF16_ENV}
    assert _child(env) == f"{native} {'bf16' if native else 'fp32'}"


def test_a_pin_other_than_0_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(device.CPU_BF16_ENV, "yes")
    with pytest.raises(ValueError, match=r"MT_CPU_BF16='yes': set it to 0"):
        resolve_precision("auto", CPU)


def test_autocast_takes_only_resolved_precisions():
    with autocast("fp32", CPU):
        pass
    with pytest.raises(ValueError, match="resolved precision"):
        autocast("auto", CPU)


@pytest.mark.skipif(device._glibc() is None, reason="malloc_trim is glibc's")
def test_the_heap_trimmer_gives_back_freed_memory_once_the_slack_is_used_up():
    trim = device.HeapTrimmer(slack_gb=0.05)
    trim.libc.malloc_trim(0)  # free memory earlier tests left would be reused unseen
    assert not trim()  # sets the floor
    blocks = [bytearray(64 * 1024) for _ in range(3200)]  # 200 MB of heap blocks
    del blocks[::2]  # 100 MB of holes between live blocks: glibc keeps them
    held = device.anonymous_memory()
    assert trim() and trim.trims == 1
    assert device.anonymous_memory() < held - 50 * 2**20
    assert not trim()  # the slack starts again from what is held now
    assert not device.HeapTrimmer(None)() and device.HeapTrimmer(None).libc is None


@pytest.mark.skipif(device._glibc() is None, reason="malloc_trim is glibc's")
def test_keeping_large_blocks_first_gives_back_the_free_heap_preparation_left():
    # in a process of its own: the large-block setting is for the rest of the process
    code = """if True:
        from transformer import device
        device.give_back_free_heap()
        blocks = [bytearray(64 * 1024) for _ in range(3200)]  # 200 MB of heap blocks
        del blocks[::2]  # 100 MB of holes between live blocks, as preparation leaves them
        held = device.anonymous_memory()
        assert device.keep_large_blocks_in_the_heap()
        print(held - device.anonymous_memory())"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert int(out.stdout) > 50 * 2**20


@pytest.mark.parametrize("env, launched", [
    ({}, False),
    ({"WORLD_SIZE": "2", "RANK": "1"}, True),
    ({"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, True),  # torchrun, one process
    ({"RANK": "0"}, False),  # a stray RANK alone is no launcher
])
def test_a_one_process_torchrun_counts_as_distributed(monkeypatch, env, launched):
    for key in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert distributed.launched_by_torchrun() is launched


def test_host_reads_counts_every_way_a_value_comes_back_and_nothing_else():
    from transformer.device import HostReads

    x = torch.arange(6.0)
    with HostReads() as reads:
        y = (x * 2 + 1).softmax(0).index_select(0, torch.tensor([0, 2]))  # device work only
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
    assert reads.total == 0
    with HostReads(sites=True) as reads:
        x[0].item()
        int(x.max())
        float(x.sum())
        if (x > 2).any():
            pass
        x.tolist()
        (x > 2).nonzero()
        x[x > 2]
        torch.repeat_interleave(torch.tensor([1, 2]))
    assert reads.by_op == {"_local_scalar_dense": 4, "tolist": 1, "nonzero": 1,
                           "index(bool mask)": 1, "repeat_interleave": 1}
    assert sum(reads.by_site.values()) == reads.total == 8
    assert all(site.startswith("test_device.py:") for site in reads.by_site)
    assert y.tolist() and torch.Tensor.tolist.__name__ == "tolist"  # unpatched on exit


def test_host_reads_counts_scalar_reads_under_inference_mode_too():
    """Searches run under torch.inference_mode, where `.item()`, `int()` and `float()`
    do not pass the dispatch mode: each must still count once, and once only outside it."""
    from transformer.device import HostReads

    x = torch.arange(6.0)
    for mode in (torch.inference_mode, torch.no_grad):
        with mode(), HostReads() as reads:
            x[0].item()
            int(x.max())
            float(x.sum())
            range(torch.tensor(3))  # __index__
            bool(x.any())
        assert reads.total == 5 and reads.by_op["_local_scalar_dense"] >= 4, (mode, reads.by_op)
    assert "__int__" not in vars(torch.Tensor) and int(torch.tensor(2)) == 2  # unpatched on exit
