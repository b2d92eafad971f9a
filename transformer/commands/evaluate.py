"""`mt-evaluate`: translate a test set and score it with sacrebleu (BLEU, chrF, TER) and
the name-copy rate (`transformer.metrics.name_copy`).

    mt-evaluate checkpoint=runs/tatoeba_cpu/checkpoints/best test_set=tatoeba-test
    mt-evaluate checkpoint=CKPT test_set=flores200-devtest decode=greedy
    mt-evaluate checkpoint=CKPT test_set=dev data=tatoeba
    mt-evaluate checkpoint=CKPT test_set=test data=iwslt2017          # the hub test split
    mt-evaluate checkpoint=CKPT test_set=path/to/src.it,path/to/ref.en
    mt-evaluate checkpoint=EXPORT_DIR test_set=tatoeba-test       # a CTranslate2 export (mt-export)
    mt-evaluate checkpoint=CKPT test_set=tatoeba-test perturb=upper   # sources as people type them

Writes `{output_dir}/{name}.{method}.hyp` (one line per test sentence), the references
it scored against (`.ref`) and a JSON report (`.json`: scores, sacrebleu signatures,
checkpoint, decode settings, engine, time, sentences/s). The scores are sacrebleu's defaults, so
`sacrebleu {name}.ref -i {name}.{method}.hyp -m bleu` prints the same BLEU; `BLEU-lc` is
its case-insensitive BLEU (`-lc`). With `perturb=upper|title|nopunct|typos` the sources
are changed as people type them, with the transforms training's data.augment uses
(`transformer/data/perturb.py`), the references upper- or title-cased to match, and
`{name}` is `{test_set}.{perturb}` (`tatoeba-test.upper`, `tatoeba-test.typos-seed1`), so
a perturbed report never replaces the clean one; the report says which. The name-copy
rate is in percent beside them (`names`; null when the references copy no name), with its
counts under `name_copy`. `output_dir` defaults to a folder per model,
`outputs/eval/<run>-<checkpoint>` (`outputs/eval/sample-best`) or `outputs/eval/<export>`,
so a second model's scores on the same test set go beside the first's. The three files
are checked before the test set is read
(`transformer/outputs.py`): one that exists is replaced only with force=true, and only if
an earlier evaluation wrote it; an output_dir that is a file is refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from sacrebleu.metrics import BLEU, CHRF, TER

from transformer import outputs
from transformer.checkpoint import EVAL_DIR, RUN_CFG, find_checkpoint, model_name
from transformer.commands import cli
from transformer.config import (
    ConfigError,
    DataConfig,
    DecodeConfig,
    at_most_workers,
    check_device,
    positive,
    require,
)
from transformer.data import perturb
from transformer.data.corpus import DataError
from transformer.data.pipeline import load_test_set
from transformer.decoding.loading import in_decode_dtype, load_for_inference
from transformer.decoding.settings import decode_settings
from transformer.decoding.text import translate_lines
from transformer.metrics.name_copy import SIGNATURE, name_copy

log = logging.getLogger(__name__)

@dataclass
class EvaluateConfig:
    """The settings of mt-evaluate (configs/evaluate.yaml)."""

    checkpoint: str | None = None
    """Required: a checkpoint directory, a run directory (its best checkpoint, else its
    newest), or an mt-export directory."""
    test_set: str = "tatoeba-test"
    """tatoeba-test | flores200-devtest | europarl-test | dev | test (of the data group's
    corpus) | src_path,ref_path."""
    output_dir: str | None = None
    """Where {test_set}.{method}.hyp, {test_set}.ref and {test_set}.{method}.json go;
    null: outputs/eval/<model>, named after the checkpoint (<run>-<checkpoint>, e.g.
    sample-best) or the export."""
    force: bool = False
    """Replace those files if an earlier mt-evaluate wrote them (never a file it did not write)."""
    max_sentences: int | None = None
    """Score only the first N sentences (quick checks); null: all."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    threads: int | None = None
    """CPU threads; null: torch's default for a checkpoint, 2 for an export (2
    single-threaded CTranslate2 workers)."""
    progress: bool = True
    """A progress bar on stderr."""
    perturb: str | None = None
    """Score the test set with its sources as people type them: upper | title | nopunct |
    typos (data.augment's transforms; upper and title case the references too); null: as
    it is. The files' names get it: {test_set}.{perturb}.{method}.hyp."""
    perturb_seed: int = 1
    """perturb=typos: the seed its typos are drawn from (with each line's number)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The data group: where test sets live ({data.root}/eval) and which corpus `dev` and
    `test` mean; their sides are the checkpoint's languages (an export: data.src_lang and
    data.tgt_lang)."""
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    """The search: the decode group."""

    def validate(self) -> None:
        require(bool(self.checkpoint), "checkpoint", self.checkpoint,
                "required: add checkpoint=path/to/checkpoint_dir")
        require(bool(self.test_set), "test_set", self.test_set, "name a test set")
        positive("max_sentences", self.max_sentences, optional=True)
        require(self.perturb in (None, *perturb.PERTURBATIONS), "perturb", self.perturb,
                f"choose one of {', '.join(perturb.PERTURBATIONS)} (or null)")
        check_device("device", self.device)
        positive("threads", self.threads, optional=True)
        at_most_workers("threads", self.threads)
        self.data.validate("data")
        self.decode.validate("decode")


def score(hyps: list[str], refs: list[str], src: list[str] | None = None) -> dict:
    """sacrebleu's corpus BLEU, chrF and TER with their signatures (default settings); given
    the sources, also the name-copy rate (`names`, percent, None without names)."""
    report: dict = {"scores": {}, "signatures": {}, "verbose": {}}
    for metric in (BLEU(), BLEU(lowercase=True), CHRF(), TER()):
        result = metric.corpus_score(hyps, [refs])
        name = f"{result.name}-lc" if getattr(metric, "lowercase", False) else result.name
        report["scores"][name] = round(result.score, 4)
        report["signatures"][name] = str(metric.get_signature())
        report["verbose"][name] = str(result).replace(result.name, name, 1)  # BLEU-lc = ...
    if src is not None:
        names = name_copy(src, hyps, refs)
        rate = None if names.rate is None else round(100 * names.rate, 4)
        report["scores"]["names"] = rate
        report["signatures"]["names"] = SIGNATURE
        report["verbose"]["names"] = names.verbose()
        report["name_copy"] = asdict(names)
    return report


def file_stem(test_set: str, perturbation: str | None = None, seed: int = 1) -> str:
    """A file-name-safe name: the set's name, or the source file's name for a src,ref pair;
    and its perturbation (`perturb.tag`) after a dot."""
    stem = Path(test_set.split(",")[0]).name if "," in test_set else test_set
    return stem if perturbation is None else f"{stem}.{perturb.tag(perturbation, seed)}"


def output_files(cfg: EvaluateConfig) -> dict[str, outputs.Output]:
    """The hypotheses, references and report files under output_dir (null: the model's
    folder under outputs/eval), checked before any work (`outputs.check`), and never one
    of the inputs (the checkpoint, a src,ref pair)."""
    folder = cfg.output_dir if cfg.output_dir is not None else f"{EVAL_DIR}/{model_name(cfg.checkpoint)}"
    out, stem, method = Path(folder), file_stem(cfg.test_set, cfg.perturb, cfg.perturb_seed), cfg.decode.method
    names = {"hyp": f"{stem}.{method}.hyp", "ref": f"{stem}.ref", "report": f"{stem}.{method}.json"}
    files = {kind: outputs.Output(out / name, "output_dir", folder, "mt-evaluate", force=cfg.force)
             for kind, name in names.items()}
    outputs.check_input(cfg.checkpoint, "checkpoint", is_dir=True)
    for path in _inputs(cfg)[1:]:
        outputs.check_input(path, "test_set")
    for kind in ("hyp", "report"):
        outputs.check(files[kind], _inputs(cfg))
    return files


def _inputs(cfg: EvaluateConfig) -> list[str | None]:
    pair = [p.strip() for p in cfg.test_set.split(",", 1)] if "," in cfg.test_set else []
    return [cfg.checkpoint, *pair]


def trained_direction(checkpoint: str | Path) -> tuple[str, str] | None:
    """(src_lang, tgt_lang) of the run a checkpoint comes from (its config.yaml); None for
    an export or a checkpoint saved without a run config."""
    path = Path(checkpoint) / RUN_CFG
    try:
        data = OmegaConf.load(path).get("data") if path.is_file() else None
    except (OSError, ValueError, OmegaConfBaseException):  # unreadable: the data group's sides
        return None
    if not data or "src_lang" not in data or "tgt_lang" not in data:
        return None
    return str(data.src_lang), str(data.tgt_lang)


def with_direction(cfg: EvaluateConfig) -> EvaluateConfig:
    """cfg with the test set's sides the checkpoint's: an en→it model is scored on the
    English sources and Italian references of a named set, `dev` or `test`. A direction set
    in data.src_lang/tgt_lang that is not the default and not the model's is refused."""
    trained = trained_direction(cfg.checkpoint)
    given = (cfg.data.src_lang, cfg.data.tgt_lang)
    if trained is None or trained == given:
        return cfg
    if given != (DataConfig.src_lang, DataConfig.tgt_lang):
        raise ConfigError(f"data.src_lang={given[0]} data.tgt_lang={given[1]}: the checkpoint "
                          f"translates {trained[0]}→{trained[1]}; leave them out to score it so")
    log.info("the checkpoint translates %s→%s: the test set's sources are .%s, its references .%s",
             *trained, *trained)
    return dataclasses.replace(cfg, data=dataclasses.replace(
        cfg.data, src_lang=trained[0], tgt_lang=trained[1]))


def evaluate(cfg: EvaluateConfig) -> dict:
    """Translate and score `cfg.test_set`; write hypotheses, references and the report."""
    cfg = dataclasses.replace(cfg, checkpoint=str(find_checkpoint(cfg.checkpoint)))  # a run: its best
    cfg = with_direction(cfg)  # the model's sides of the test set
    files = output_files(cfg)
    src, refs = load_test_set(cfg.test_set, cfg.data)  # before the model: a bad set costs nothing
    if cfg.max_sentences is not None:
        src, refs = src[: cfg.max_sentences], refs[: cfg.max_sentences]
    if not src:
        raise DataError(f"test set {cfg.test_set!r} has no sentence pairs to score")
    if cfg.perturb is not None:
        src, refs = perturb.test_set(cfg.perturb, src, refs, cfg.perturb_seed)
    # the same references for every method: an earlier evaluation's identical file is fine
    outputs.check(files["ref"], _inputs(cfg), same_as="".join(f"{r}\n" for r in refs))
    model, tokenizer, device = load_for_inference(cfg.checkpoint, cfg.device, cfg.threads)
    start = time.perf_counter()
    decode = decode_settings(cfg.decode, device, model)  # once: what runs is what the report says
    model = in_decode_dtype(model, decode)  # the weights cast once: no batch casts them again
    counts: dict[str, int] = {}
    hyps = translate_lines(model, tokenizer, src, decode, device, progress=cfg.progress,
                           counts=counts)
    seconds = time.perf_counter() - start
    report = {
        "test_set": cfg.test_set,
        "perturb": None if cfg.perturb is None else {
            "name": cfg.perturb, "seed": cfg.perturb_seed if cfg.perturb == "typos" else None,
            "references": "cased as the sources" if cfg.perturb in ("upper", "title") else "as they are"},
        "sentences": len(src),
        "split_sentences": counts["sentences"],  # what the splitter found in those lines
        **score(hyps, refs, src),
        "checkpoint": str(Path(cfg.checkpoint).resolve()),
        "decode": {k: v for k, v in asdict(decode).items() if k != "max_tokens"},  # not the old name
        "device": str(device),
        "engine": getattr(model, "engine", f"pytorch {torch.__version__}"),
        "seconds": round(seconds, 2),
        "sentences_per_second": round(len(src) / max(seconds, 1e-9), 2),
    }
    outputs.write_text(files["hyp"], "".join(f"{h}\n" for h in hyps))
    outputs.write_text(files["ref"], "".join(f"{r}\n" for r in refs))
    report["files"] = {k: str(v.path) for k, v in files.items()}
    outputs.write_text(files["report"], json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    for name in ("BLEU", "BLEU-lc", "chrF2", "TER", "names"):
        print(f"{report['verbose'][name]}  ({report['signatures'][name]})")
    split = f"{counts['sentences']} after splitting" if decode.split_sentences else "not split"
    print(f"{len(src)} sentences ({split}) in {seconds:.1f} s "
          f"({report['sentences_per_second']} sent/s); "
          f"report: {files['report'].path}")
    return report


@hydra.main(config_path=cli.CONFIG_PATH, config_name="evaluate", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    cli.run_command("mt-evaluate", EvaluateConfig, cfg, evaluate)



def main() -> None:
    """The `mt-evaluate` console script."""
    cli.hydra_entry("mt-evaluate", hydra_main, EvaluateConfig)


if __name__ == "__main__":
    main()
