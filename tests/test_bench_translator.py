"""scripts/bench/bench_translator.py: a bad `--with KEY=VALUE` is a one-line usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench" / "bench_translator.py"


@pytest.mark.parametrize("item", ["method", "lenpen=abc", "lenpen=(", "1x=2"])
def test_a_bad_keyword_is_a_one_line_error(item):
    proc = subprocess.run([sys.executable, str(SCRIPT), "ckpt", "--with", item],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1].endswith(f"argument --with: {item!r}: give KEY=VALUE, "
                                                 "VALUE a Python literal (return_scores=True, method='beam')")
