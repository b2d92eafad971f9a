"""Where the work runs: the device, the precision and its autocast, the CPU's features, the heap.

Training and decoding share it: `resolve_device` and `resolve_precision` turn the `device`
and `precision` settings (`auto` included) into a torch device and a precision this
machine computes fast, `autocast` applies it, and on CPU `keep_large_blocks_in_the_heap`,
`give_back_free_heap` and `HeapTrimmer` keep the glibc heap from holding freed batches. Distributed training's
process group and the RNG states of an exact resume are training's
(`transformer/training/distributed.py`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import sys
from pathlib import Path

import torch

from transformer.config import ConfigError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
log = logging.getLogger(__name__)


def resolve_device(pref: str, local_rank: int = 0, key: str = "trainer.device") -> torch.device:
    """The torch device of a `device` setting; `key` is the setting's name in the command
    (`trainer.device` in mt-train, `device` in mt-translate), for the message."""
    if pref == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    device = torch.device(pref)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{key}={pref}, but CUDA is not available on this machine: use {key}=cpu "
                          f"or {key}=auto")
    if device.type == "cuda" and device.index is None:
        device = torch.device(f"cuda:{local_rank}")
    return device


def keep_large_blocks_in_the_heap() -> bool:
    """Let glibc's malloc reuse large freed blocks instead of returning them to the OS.

    By default glibc maps every block over 32 MiB afresh and unmaps it when freed, so each
    (tokens, vocabulary) tensor of a CPU training step (4k tokens x 8k pieces x 4 bytes =
    131 MB) page-faults its memory in again, which slows `log_softmax` on such a tensor and
    the training step on a CPU (docs/results/training-speed.md, "Why the step is built so", has both timed).
    The price is that the process keeps what
    it freed: training pairs this with a `HeapTrimmer`. Used on CPU only, after the data is
    prepared; returns whether it applied (glibc's `mallopt`).

    It first gives back the free heap the process holds (`give_back_free_heap`): from then
    on glibc returns nothing by itself, so what preparation freed (SentencePiece's trainer,
    the encoding's buffers) would otherwise stay under every later peak (0.15 GB above a
    warm-cache start after the Europarl recipe's cold preparation, 0.07 GB with it; AMD
    EPYC Zen 3, docs/results/memory.md "The Europarl recipe's peak").
    """
    libc = _glibc()
    if libc is None:
        return False
    give_back_free_heap()
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


def _glibc():
    """glibc through ctypes, or None (another libc, another OS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018  (absent from musl)
        return libc
    except (OSError, AttributeError):
        return None


def give_back_free_heap() -> bool:
    """Return the free memory of glibc's heap to the OS now (`malloc_trim(0)`: every
    arena, free pages in the middle of the heap too); False where there is no glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def anonymous_memory() -> int:
    """Bytes of anonymous memory this process holds (RssAnon; 0 where /proc has none)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class HeapTrimmer:
    """Gives the heap's free memory back to the OS when it has grown by `slack_gb` since
    the last time (glibc's `malloc_trim`); call it between training updates.

    Why: a CPU step allocates and frees tensors whose sizes follow each batch's shape, and
    glibc cannot reuse all the holes that leaves. In bf16 on an AMD EPYC Zen 4 (small
    model, 2 threads) the training process grew from 1.1 GB after the first update to 4.5
    GB after 150 with varied shapes, and stayed at 1.4 GB with one fixed shape; a
    `malloc_trim` brought it back to 0.9 GB at any point, so the growth is free memory,
    not data (docs/results/memory.md, "The heap slack and memory"). Trimming every update costs a
    page fault for every page the next step touches again; with a slack above one step's
    working set it trims rarely. `slack_gb=None` never trims.
    """

    def __init__(self, slack_gb: float | None) -> None:
        self.libc = _glibc() if slack_gb is not None else None
        self.slack = int((slack_gb or 0) * 2**30)
        self.floor: int | None = None
        self.trims = 0

    def __call__(self) -> bool:
        """Trim if the slack is used up; True if it trimmed."""
        if self.libc is None:
            return False
        held = anonymous_memory()
        if self.floor is None or held < self.floor:
            self.floor = held
        if held - self.floor < self.slack:
            return False
        self.libc.malloc_trim(0)
        self.floor = anonymous_memory()
        self.trims += 1
        return True


def _cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, Arm
            return set(value.split())
    return set()


def _cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


# Set to 0, the CPU counts as one without native bf16, so `precision=auto` is fp32 on every
# CPU kind: the test suite sets it, and every process it starts inherits it.
CPU_BF16_ENV = "MT_CPU_BF16"


def cpu_bf16_support() -> tuple[bool, str]:
    """(whether this CPU computes bf16 natively, the features that decide it).

    Native: AMX or AVX512-BF16 on x86 (Intel Sapphire Rapids and later, AMD Zen 4 and
    later), the BF16 extension on Arm. Without them torch's CPU autocast emulates bf16,
    which is not faster than fp32 but far slower (docs/precision.md, "Mixed precision").
    `MT_CPU_BF16=0` in the environment answers "not native" on any CPU, so that `auto`
    means fp32 everywhere (reproducible runs across CPU kinds; the test suite sets it).
    """
    pinned = os.environ.get(CPU_BF16_ENV)
    if pinned is not None:
        if pinned.strip() != "0":
            raise ConfigError(f"{CPU_BF16_ENV}={pinned!r}: set it to 0 (treat this CPU as one "
                              f"without native bf16) or unset it")
        return False, f"{CPU_BF16_ENV}=0 treats the CPU as without native bf16"
    flags = _cpu_flags()
    try:
        amx = bool(torch.cpu._is_amx_tile_supported()) or "amx_bf16" in flags
        avx512_bf16 = bool(torch.cpu._is_avx512_bf16_supported()) or "avx512_bf16" in flags
    except AttributeError:  # older torch: the flags alone
        amx, avx512_bf16 = "amx_bf16" in flags, "avx512_bf16" in flags
    arm_bf16 = platform.machine() in ("aarch64", "arm64") and "bf16" in flags
    capability = torch.backends.cpu.get_cpu_capability()
    if amx:
        return True, f"{capability} with AMX"
    if avx512_bf16:
        return True, f"{capability} with AVX512-BF16"
    if arm_bf16:
        return True, "Arm with BF16"
    return False, f"{capability} only, no AVX512-BF16 or AMX"


def cuda_bf16_support(device: torch.device) -> tuple[bool, str]:
    """(whether the GPU computes bf16, its name): Ampere and later do."""
    return torch.cuda.is_bf16_supported(), torch.cuda.get_device_name(device)


def describe_cpu() -> str:
    """One line naming the CPU and whether it has native bf16 (benchmarks print it)."""
    native, features = cpu_bf16_support()
    return f"{_cpu_model_name()}, {features} ({'native' if native else 'no native'} bf16)"


# The message's figures and their machine: docs/results/training-precision.md, "Emulated bf16".
_EMULATED_BF16_COST = "about 30x slower than fp32 (65 s against 2.0 s per update of the " \
                      "tatoeba_cpu recipe on an AVX2-only AMD EPYC)"


def resolve_precision(precision: str, device: torch.device, key: str = "trainer.precision",
                      ) -> tuple[str, str]:
    """(the precision to run, why): `auto` follows the hardware; explicit values are checked.

    auto: on CUDA bf16 where the GPU supports it, else fp16 (with loss scaling in
    training); on a CPU bf16 only where it is native (`cpu_bf16_support`), else fp32.
    bf16 asked for on a CPU without native bf16 runs, with a warning of its cost; fp16
    needs CUDA.
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"{key}={precision!r}: choose one of {', '.join(PRECISIONS)}")
    if device.type == "cuda":
        if precision != "auto":
            return precision, "as configured"
        bf16_ok, name = cuda_bf16_support(device)
        return ("bf16", f"auto: {name} supports bf16") if bf16_ok else \
            ("fp16", f"auto: {name} has no bf16, so fp16 with loss scaling")
    if device.type != "cpu":  # mps and others: what the user asked for, auto = fp32
        return ("fp32" if precision == "auto" else precision), f"{device.type} device"
    native, features = cpu_bf16_support()
    if precision == "auto":
        if native:
            return "bf16", f"auto: the CPU has native bf16 ({features})"
        return "fp32", f"auto: the CPU has no native bf16 ({features}), so fp32"
    if precision == "fp16":
        raise ConfigError(f"{key}=fp16 needs CUDA (loss scaling on CPU is not supported); "
                         f"use {key}=auto, or bf16 on a CPU with native bf16")
    if precision == "bf16" and not native:
        log.warning("%s=bf16 on a CPU without native bf16 (%s): autocast emulates it, %s; "
                    "use %s=auto or fp32", key, features, _EMULATED_BF16_COST, key)
        return "bf16", f"as configured, emulated ({features})"
    return precision, "as configured"


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed-precision context: bf16 on CPU or CUDA, fp16 on CUDA, nothing for fp32.

    `precision` is a resolved one (`resolve_precision`), never `auto`.
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision not in ("bf16", "fp16"):
        raise ValueError(f"autocast needs a resolved precision (fp32, bf16, fp16), got {precision!r}")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def enable_fast_cuda_math() -> None:
    """TF32 matmuls and convolutions on Ampere and later (fp32 runs only pay for it)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


# Operations that make the host wait for the device: a value read back (`.item()`, `int()`,
# `float()`, `bool()`, `if t:`), or an output whose size depends on the values (`nonzero`,
# boolean indexing, `masked_select`, `repeat_interleave` without output_size, `unique`).
_HOST_READ_OPS = frozenset({
    "aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
    "aten.repeat_interleave.Tensor", "aten.equal.default", "aten.is_nonzero.default",
    "aten._unique2.default", "aten.unique_dim.default", "aten.unique_consecutive.default",
})


class HostReads:
    """Counts the host's reads of tensor values inside a `with` block: on a GPU each one
    stops the host until the device has caught up, so the counts hold a loop to "the host
    never waits" on a CPU-only machine (the tests, `scripts/gpu_check.sh --cpu`).

    Counted: `aten._local_scalar_dense` (what `.item()`, `int(t)`, `float(t)`, `bool(t)`
    and `if t:` call), ops whose output size depends on the values (`nonzero`, indexing
    with a bool mask, `masked_select`, `repeat_interleave` without `output_size`, `unique`),
    and `Tensor.tolist()` and `Tensor.numpy()`, which bypass the dispatcher. `.cpu()` is
    not counted: on a CPU it copies nothing, and the code it would catch copies results
    already read another way.

    Example:
        with HostReads() as reads:
            trainer.train_step(batches)
        reads.total, reads.by_op   # 0, Counter()

    Args:
        sites: also record where each read came from (file:line of the first frame
            outside torch), in `by_site`: slower, for finding them.
    """

    def __init__(self, sites: bool = False) -> None:
        from collections import Counter

        self.by_op: Counter[str] = Counter()
        self.by_site: Counter[str] = Counter()
        self._sites = sites
        self._mode = None
        self._patched: dict[str, object] = {}
        self._scalar_patched: dict[str, tuple[object, bool]] = {}

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def _count(self, op: str) -> None:
        self.by_op[op] += 1
        if self._sites:
            import traceback

            for frame in reversed(traceback.extract_stack()[:-2]):
                if "/torch/" not in frame.filename and frame.filename != __file__:
                    self.by_site[f"{Path(frame.filename).name}:{frame.lineno}"] += 1
                    break

    def __enter__(self) -> HostReads:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func)
                if name in _HOST_READ_OPS:
                    if name != "aten.repeat_interleave.Tensor" or not (kwargs or {}).get("output_size"):
                        counter._count(name.split(".")[1])
                elif name == "aten.index.Tensor" and any(
                        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
                    counter._count("index(bool mask)")
                return func(*args, **(kwargs or {}))

        for method in ("tolist", "numpy"):
            original = getattr(torch.Tensor, method)
            self._patched[method] = original

            def wrapped(t, *a, _original=original, _method=method, **kw):
                counter._count(_method)
                return _original(t, *a, **kw)

            setattr(torch.Tensor, method, wrapped)
        # Under torch.inference_mode (where searches run) `.item()`, `int(t)`, `float(t)`
        # reach `_local_scalar_dense` without passing the dispatch mode (torch 2.13, CPU):
        # counted here, in that mode only, so that nothing counts twice.
        for method in ("item", "__int__", "__float__", "__index__"):
            original = getattr(torch.Tensor, method)
            self._scalar_patched[method] = (original, method in vars(torch.Tensor))

            def scalar(t, *a, _original=original, **kw):
                if torch.is_inference_mode_enabled():
                    counter._count("_local_scalar_dense")
                return _original(t, *a, **kw)

            setattr(torch.Tensor, method, scalar)
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for method, original in self._patched.items():
            setattr(torch.Tensor, method, original)
        self._patched.clear()
        for method, (original, own) in self._scalar_patched.items():
            if own:
                setattr(torch.Tensor, method, original)
            else:
                delattr(torch.Tensor, method)  # the inherited one again
        self._scalar_patched.clear()
