"""The decode settings as they will run (transformer/decoding/settings.py): the device's
defaults filled in, settings the device cannot run refused by their key."""

from __future__ import annotations

import pytest
import torch

from transformer import device as device_module
from transformer.config import DecodeConfig
from transformer.decoding.settings import decode_settings


def test_decode_defaults_depend_on_the_device(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")  # no CUDA needed: capabilities mocked
    monkeypatch.setattr(device_module, "cpu_bf16_support", lambda: (False, "AVX2 only"))
    monkeypatch.setattr(device_module, "cuda_bf16_support", lambda device: (True, "a GPU"))
    settings = decode_settings
    assert settings(DecodeConfig(), cpu) == DecodeConfig(batch_tokens=2000, precision="fp32")
    assert settings(DecodeConfig(), cuda) == DecodeConfig(batch_tokens=8000, precision="bf16")
    monkeypatch.setattr(device_module, "cpu_bf16_support", lambda: (True, "AVX512-BF16"))
    assert settings(DecodeConfig(), cpu) == DecodeConfig(batch_tokens=2000, precision="bf16")
    monkeypatch.setattr(device_module, "cuda_bf16_support", lambda device: (False, "an old GPU"))
    assert settings(DecodeConfig(), cuda).precision == "fp16"
    given = DecodeConfig(batch_tokens=123, precision="fp32")
    assert settings(given, cuda) == given
    with pytest.raises(ValueError, match=r"decode.batch_tokens=0: must be >= 1 \(or null\)"):
        settings(DecodeConfig(batch_tokens=0), cpu)
    with pytest.raises(ValueError, match=r"decode.precision=fp16 needs CUDA"):
        settings(DecodeConfig(precision="fp16"), cpu)
