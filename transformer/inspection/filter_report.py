"""What each corpus filter (`data.filters`) would remove from a corpus, with examples.

`filter_report` reads a corpus's training split as preparation does (cleaned, in chunks),
and runs each rule on every pair by itself (`alone`: what that rule removes if it is the
only one on) and all of them in preparation's order (`chain`: what each removes after the
earlier ones, as preparation logs it), drawing a seeded sample of the pairs each rule
removes alone, with why. scripts/data/filter_report.py prints it; docs/results/filters.md
holds its figures for Europarl and Tatoeba.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from transformer.config import DataConfig, FilterConfig
from transformer.data import corpus, filters
from transformer.data.clean_split import write_clean
from transformer.data.langid import language_id
from transformer.data.workers import Workers

Rule = Callable[[list[str], list[str]], np.ndarray]


@dataclass
class RuleReport:
    """One rule run alone: the pairs it removed, the CPU seconds it took (this process's),
    a sample of its removals."""

    removed: int = 0
    alike: int = 0  # removed pairs whose two sides are the same text (a code, an untranslated line)
    seconds: float = 0.0
    examples: list[tuple[str, str, str]] = field(default_factory=list)  # (source, target, why)
    _seen: int = 0  # removals offered to the sample so far


@dataclass
class Report:
    corpus: str
    pairs: int  # after cleaning
    alone: dict[str, RuleReport]
    chain: dict[str, int]  # rule -> pairs it removed after the earlier rules
    kept: int  # pairs left after the chain


def _why_numbers(s: str, t: str) -> str:
    a, b = filters.numbers(s), filters.numbers(t)
    return f"numbers {sorted(a)} vs {sorted(b)}"


def _why_script(s: str, t: str) -> str:
    return f"non-Latin letters {filters.non_latin_share(s):.0%} / {filters.non_latin_share(t):.0%}"


def _why_langid(s: str, t: str, langs: tuple[str, str]) -> str:
    model = language_id()
    parts = []
    for text, lang in zip((s, t), langs, strict=True):
        probs, _ = model.probabilities([text])
        best = int(probs[0].argmax())
        parts.append(f"P({lang}) {float(probs[0, model.languages.index(lang)]):.3f}, "
                     f"best {model.languages[best]} {float(probs[0, best]):.2f}")
    return "; ".join(parts)


def _rules(cfg: FilterConfig, langs: tuple[str, str]) -> dict[str, tuple[Rule | None, Callable[[str, str], str]]]:
    """Each rule that is on, by its name in the report: (keep mask of a chunk, or None for
    a dedup mode, and why a pair was removed)."""
    rules: dict[str, tuple[Rule | None, Callable[[str, str], str]]] = {}
    if cfg.char_ratio is not None:
        rules[f"char_ratio={cfg.char_ratio:g}"] = (lambda s, t: filters.char_ratio_ok(s, t, cfg.char_ratio),
                                                   lambda s, t: f"{len(s)} vs {len(t)} characters")
    if cfg.numbers:
        rules["numbers"] = (filters.numbers_ok, _why_numbers)
    if cfg.script is not None:
        rules[f"script={cfg.script:g}"] = (lambda s, t: filters.script_ok(s, t, cfg.script), _why_script)
    if cfg.langid is not None:
        rules[f"langid={cfg.langid:g}"] = (lambda s, t: filters.langid_ok(s, t, langs, cfg.langid),
                                           lambda s, t: _why_langid(s, t, langs))
    for mode in _dedup_modes(cfg):
        rules[f"dedup={mode}"] = (None, lambda s, t: "seen before")
    return rules


def _dedup_modes(cfg: FilterConfig) -> list[str]:
    """The dedup modes a report runs: both when dedup is on (the report compares them)."""
    return ["pairs", "target"] if cfg.dedup else []


def filter_report(data: DataConfig, cfg: FilterConfig, examples: int = 10, seed: int = 0) -> Report:
    """Every rule of `cfg` that is on, alone and in preparation's order, over the training
    split of the corpus `data` names (cleaned as preparation cleans it)."""
    langs = (data.src_lang, data.tgt_lang)
    rules = _rules(cfg, langs)
    alone = {name: RuleReport() for name in rules}
    dedups = {name: filters.Dedup(name.split("=")[1], name) for name, (rule, _) in rules.items() if rule is None}
    chain_dedup = filters.Dedup(cfg.dedup, "chain") if cfg.dedup else None
    chain = dict.fromkeys(filters.RULES, 0)
    rng = random.Random(seed)
    stream, _ = corpus.iter_split(data, "train")
    pairs = kept = 0
    while chunk := list(itertools.islice(stream, 50_000)):
        src, tgt = corpus.clean([s for s, _ in chunk], [t for _, t in chunk])
        pairs += len(src)
        for name, (rule, why) in rules.items():
            start = time.process_time()  # CPU seconds: what a busy machine's other work leaves alone
            ok = rule(src, tgt) if rule is not None else dedups[name].keep(src, tgt)
            alone[name].seconds += time.process_time() - start
            _sample(alone[name], np.flatnonzero(~ok), src, tgt, why, examples, rng)
        rows, counts = filters.chunk_filter(src, tgt, dataclasses.replace(cfg, dedup=None), langs)
        for rule, n in counts.items():
            chain[rule] += n
        if chain_dedup is not None:
            ok = chain_dedup.keep([src[i] for i in rows], [tgt[i] for i in rows])
            chain["dedup"] += int(len(ok) - ok.sum())
            rows = rows[ok]
        kept += len(rows)
    return Report(data.name, pairs, alone, {r: n for r, n in chain.items() if n or _on(cfg, r)}, kept)


def _on(cfg: FilterConfig, rule: str) -> bool:
    value = getattr(cfg, rule)
    return value is not None and value is not False


def _sample(report: RuleReport, removed: np.ndarray, src: list[str], tgt: list[str],
            why: Callable[[str, str], str], k: int, rng: random.Random) -> None:
    """Count a chunk's removals and keep a uniform sample of `k` of all removals so far
    (reservoir sampling), each with why it was removed."""
    report.removed += len(removed)
    report.alike += sum(src[i] == tgt[i] for i in removed)
    for i in removed:
        report._seen += 1
        slot = len(report.examples) if len(report.examples) < k else rng.randrange(report._seen)
        if slot < k:
            pair = (src[i], tgt[i], why(src[i], tgt[i]))
            if slot == len(report.examples):
                report.examples.append(pair)
            else:
                report.examples[slot] = pair


def format_report(report: Report) -> str:
    """The report as Markdown: counts (alone and in order), then each rule's examples."""
    share = lambda n: f"{n:,} ({n / max(1, report.pairs):.2%})"  # noqa: E731
    lines = [f"## {report.corpus}: {report.pairs:,} training pairs after cleaning", "",
             "| rule | removes alone | of which both sides alike | CPU seconds alone (one process) |",
             "|---|---|---|---|"]
    lines += [f"| {name} | {share(r.removed)} | {r.alike:,} | {r.seconds:.1f} |" for name, r in report.alone.items()]
    lines += ["", "In preparation's order (each counts what the earlier ones left):", ""]
    lines += [f"- {rule}: {share(n)}" for rule, n in report.chain.items()]
    lines += [f"- kept: {share(report.kept)}", ""]
    for name, r in report.alone.items():
        lines += [f"### {report.corpus}, {name}: {len(r.examples)} of its {r.removed:,} removals", ""]
        lines += [f"- `{_code(s)}` → `{_code(t)}` ({why})" for s, t, why in r.examples]
        lines.append("")
    return "\n".join(lines)


def _code(text: str, limit: int = 160) -> str:
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.replace("`", "'")


def preparation_seconds(data: DataConfig, cfg: FilterConfig) -> dict[str, tuple[float, float]]:
    """Wall and CPU seconds (this process's and its workers') of preparation's cleaning pass
    over the training split, without filters and with `cfg`'s, in `data.num_proc` worker
    processes (into a temporary folder)."""
    seconds = {}
    for label, chosen in (("cleaning", None), ("cleaning and filters", cfg)):
        stream, origin = corpus.iter_split(data, "train")
        start, cpu = time.perf_counter(), _cpu_seconds()
        with tempfile.TemporaryDirectory() as tmp, Workers(data.num_proc) as workers:
            write_clean(stream, Path(tmp) / "train.arrow", origin, "train", workers, chosen,
                        (data.src_lang, data.tgt_lang))
        seconds[label] = (round(time.perf_counter() - start, 1), round(_cpu_seconds() - cpu, 1))
    return seconds


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (the workers, once
    the pool is shut)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
