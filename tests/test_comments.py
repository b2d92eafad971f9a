"""The package's comments and docstrings state what is true now: no history ("used to",
"before #50", "the old pipeline") and no single machine's timings (milliseconds, "3x
faster"), which belong in docs/results/ with their machine. Messages the code prints are
not comments: a warning may quote a figure."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "transformer"

HISTORY = re.compile(r"\bused to\b|\b[Bb]efore(,| this (guard|change|fix)\b)|\b(before|since|after|until) #\d|(?<![\w&])#\d+\b"
                     r"|\bpreviously\b|\bformerly\b|\bthe old ([\w-]+ )?(pipeline|code|loop|version|search|way|path)\b|\balways did\b|\bwas changed\b")
TIMING = re.compile(r"\b\d+(\.\d+)?\s?(ms|µs)\b|\b\d+(\.\d+)?x (faster|slower)\b"
                    r"|\b\d[\d,.]* (sentences|sent|tokens|tok)/s\b")


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module."""
    source = path.read_text(encoding="utf-8")
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                first = node.body[0].lineno
                found += [(first + i, line) for i, line in enumerate(doc.splitlines())]
        if isinstance(node, ast.ClassDef):  # a field's docstring: the string under it (its help)
            found += [(expr.lineno + i, line) for expr in node.body[1:] if isinstance(expr, ast.Expr)
                      and isinstance(expr.value, ast.Constant) and isinstance(expr.value.value, str)
                      for i, line in enumerate(expr.value.value.splitlines())]
    return found


def offending(pattern: re.Pattern) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)}:{line}: {text.strip()}"
            for path in sorted(PACKAGE.rglob("*.py"))
            for line, text in comments_and_docstrings(path) if pattern.search(text)]


def test_no_comment_or_docstring_narrates_history():
    assert offending(HISTORY) == []


def test_no_comment_or_docstring_quotes_a_machines_timing():
    assert offending(TIMING) == []


def test_the_patterns_catch_what_they_are_for():
    for text in ("the loop used to collate", "Before, the forward copied", "as before #50",
                 "(since #49)", "the old in-memory pipeline", "as the searches always did", "before this guard"):
        assert HISTORY.search(text), text
    for text in ("34 -> 5 ms per call", "about 2.5x faster", "326 sentences/s", "1.9 ms"):
        assert TIMING.search(text), text
    for text in ("EOS is forbidden before this many tokens", "what was cut, for the reader",
                 "a hatch of #7a7a7a", "`max_len` for `max_positions`", "the 10 s grace",
                 "the report's time and sentences/s"):
        assert not HISTORY.search(text) and not TIMING.search(text), text
