"""The decode settings as they will run (transformer/decoding/settings.py): the device's
defaults filled in, settings the device cannot run refused by their key."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer import device as device_module
from transformer.config import ConfigError, DecodeConfig, ModelConfig
from transformer.decoding import settings as settings_module
from transformer.decoding.settings import decode_settings


def test_decode_defaults_depend_on_the_device(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")  # no CUDA needed: capabilities mocked
    monkeypatch.setattr(device_module, "cpu_bf16_support", lambda: (False, "AVX2 only"))
    monkeypatch.setattr(device_module, "cuda_bf16_support", lambda device: (True, "a GPU"))
    settings = decode_settings
    assert settings(DecodeConfig(), cpu) == DecodeConfig(batch_tokens=2000, precision="fp32")
    assert settings(DecodeConfig(), cuda) == DecodeConfig(batch_tokens=8000, precision="bf16")
    monkeypatch.setattr(device_module, "cpu_bf16_support", lambda: (True, "AVX512-BF16"))
    # fp32 on a CPU even with native bf16 (training's auto is bf16 there): as an export computes
    assert settings(DecodeConfig(), cpu) == DecodeConfig(batch_tokens=2000, precision="fp32")
    assert settings(DecodeConfig(precision="bf16"), cpu).precision == "bf16"
    monkeypatch.setattr(device_module, "cuda_bf16_support", lambda device: (False, "an old GPU"))
    assert settings(DecodeConfig(), cuda).precision == "fp16"
    given = DecodeConfig(batch_tokens=123, precision="fp32")
    assert settings(given, cuda) == given
    with pytest.raises(ValueError, match=r"decode.batch_tokens=0: must be >= 1 \(or null\)"):
        settings(DecodeConfig(batch_tokens=0), cpu)
    with pytest.raises(ValueError, match=r"decode.precision=fp16 needs CUDA"):
        settings(DecodeConfig(precision="fp16"), cpu)


def test_a_resolved_config_comes_back_as_it_is_until_it_or_its_target_changes(monkeypatch):
    """Resolved once: what decode_settings gave is given back without a second check
    (resolve_precision counted) for the same device and model; a new or changed config,
    another device or another model's shape is resolved again."""
    calls = []
    real = settings_module.resolve_precision
    monkeypatch.setattr(settings_module, "resolve_precision",
                        lambda *args, **kwargs: calls.append(args) or real(*args, **kwargs))

    class Model:  # what decode_settings reads of our model: its config
        def __init__(self, **shape):
            self.cfg = ModelConfig(vocab_size=100, **shape)

    cpu = torch.device("cpu")
    once = decode_settings(DecodeConfig(precision="fp32"), cpu, Model())
    for _ in range(3):  # every batch and window after
        assert decode_settings(once, cpu, Model()) is once
    assert decode_settings(once, "cpu", Model()) is once  # the device named as a str
    assert len(calls) == 1
    assert decode_settings(dataclasses.replace(once, beam_size=2), cpu, Model()).beam_size == 2
    assert decode_settings(once, cpu, Model(d_model=64)) is not once  # another model's shape
    assert len(calls) == 3
    once.beam_size = 0  # changed in place: checked again, and refused
    with pytest.raises(ConfigError, match=r"^decode.beam_size=0: must be >= 1"):
        decode_settings(once, cpu, Model())
