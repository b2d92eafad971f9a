"""Fixtures the export tests share: the sample's tokenizer and the first 40 dev sources."""

import pytest

from transformer.data.corpus import read_lines

from helpers import SAMPLE, sample_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return sample_tokenizer()


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return read_lines(SAMPLE / "dev.it")[:40]
