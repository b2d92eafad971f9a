"""Settings that could exhaust the machine are bounded (transformer/bounds.py): refused in
one line naming the key, before any work; the memory free is what the device can give.
(A decoding batch's memory estimate and its refusal: tests/decoding/test_batch_memory.py.)"""

from __future__ import annotations

import pytest
import torch

from transformer import bounds
from transformer.commands.evaluate import EvaluateConfig
from transformer.commands.translate import TranslateConfig
from transformer.config import ConfigError, TrainConfig, to_dataclass

from helpers import compose_cfg


@pytest.mark.parametrize(("schema", "config", "override", "message"), [
    (TranslateConfig, "translate", "decode.beam_size=100000", "decode.beam_size=100000: must be <= 128"),
    (EvaluateConfig, "evaluate", "decode.beam_size=129", "decode.beam_size=129: must be <= 128"),
    (TranslateConfig, "translate", "threads=1000", "threads=1000: must be <= "),
    (TrainConfig, "train", "data.num_proc=1000", "data.num_proc=1000: must be <= "),
    (TrainConfig, "train", "trainer.num_threads=1000", "trainer.num_threads=1000: must be <= "),
    (TrainConfig, "train", "model.max_positions=100000", "model.max_positions=100000: must be <= 16384"),
    (TrainConfig, "train", "data.max_len=20000", "data.max_len=20000: must be <= 16384"),
    (TrainConfig, "train", "data.max_tokens=4096000", "data.max_tokens=4096000: must be <= 131072"),
    (TrainConfig, "train", "trainer.val_max_tokens=6000000", "trainer.val_max_tokens=6000000: must be <= 131072"),
])
def test_a_setting_past_its_bound_is_refused_naming_it(schema, config, override, message):
    cfg = compose_cfg("checkpoint=x", override, config=config) if config != "train" else compose_cfg(override)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        to_dataclass(schema, cfg)


def test_workers_are_bounded_by_the_cores_and_at_least_two(monkeypatch):
    monkeypatch.setattr(bounds, "cpu_cores", lambda: 1)
    assert bounds.worker_limit() == 2  # the shipped configs' num_proc=2 runs on one core
    to_dataclass(TrainConfig, compose_cfg("data.num_proc=2"))
    monkeypatch.setattr(bounds, "cpu_cores", lambda: 64)
    to_dataclass(TrainConfig, compose_cfg("data.num_proc=64"))
    with pytest.raises(ConfigError, match=r"data.num_proc=65: must be <= 64, the CPU cores"):
        to_dataclass(TrainConfig, compose_cfg("data.num_proc=65"))


def test_cuda_memory_the_allocator_holds_unused_counts_as_free(monkeypatch):
    """After training steps PyTorch's allocator keeps most of the card reserved; decoding
    reuses that pool, so a validation must not be refused for memory it already has."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 60 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 10 * 2**30)
    assert bounds.available_memory(torch.device("cuda:0")) == (1 + 50) * 2**30


def test_no_shipped_batch_size_comes_near_the_bound():
    """MAX_BATCH_TOKENS refuses a typo, never a recipe: every data.max_tokens in configs/
    (presets, experiments, the search's choices) and scripts/ is far below it."""
    import re

    from transformer.paths import PROJECT_ROOT

    texts = [p.read_text() for d in ("configs", "scripts") for p in (PROJECT_ROOT / d).rglob("*")
             if p.suffix in (".yaml", ".py", ".sh")]
    found = [int(n) for t in texts for m in re.finditer(r"max_tokens\W+(?:choice\()?([\d, ]+)", t)
             for n in m[1].replace(" ", "").split(",") if n]
    assert found and max(found) * 8 <= bounds.MAX_BATCH_TOKENS, sorted(found)
