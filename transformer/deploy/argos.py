"""Argos Translate packages (`mt-export format=argos`): a checkpoint as LibreTranslate serves it.

    mt-export checkpoint=runs/sample/checkpoints/best output=exports/sample.argosmodel format=argos
    scripts/serving/serve_libretranslate.sh exports/sample.argosmodel      # http://127.0.0.1:5000

An `.argosmodel` is a zip of one directory: argostranslate's `install_from_path` extracts
it into its packages folder, where every directory is a package. What argostranslate 1.11
and LibreTranslate's fork of it (argos-translate-lt 1.12) read there (`package.Package`,
`sbd.SpacySentencizerSmall`, `translate.apply_packaged_translation` in their source):
- metadata.json: package_version, argos_version, from/to codes and names, type translate.
- model/: a CTranslate2 model, `ctranslate2.Translator(<package>/model)`: our converter's
  files, with the position table extended (below).
- sentencepiece.model: the tokenizer; Argos encodes a sentence to pieces (strings) as it
  is, without our `corpus.normalize` (NFC, collapsed whitespace), and decodes with
  `decode_pieces`, then replaces every "▁" and "_" with a space and drops one leading space.
- spacy/: the sentence splitter, used with ARGOS_CHUNK_TYPE=SPACY. Argos loads it with
  `spacy.load(<package>/spacy, exclude=["parser"])` and then adds spaCy's rule-based
  "sentencizer" itself, so the package holds a blank Italian pipeline (spaCy's Italian
  tokenizer rules: no statistical model, nothing to download) and not a sentencizer (a
  second one would fail with spaCy's E007). Its default splitters (MiniSBD, Stanza)
  download models on first use. The tokenizer holds mt-translate's non-breaking prefixes
  (`sentences.prefixes`) as special cases, so both split at the same places but for the
  cases docs/decoding.md lists ("Documents: sentence splitting").
- README.md: the model's settings and scores, the run config, how to serve it.

Argos translates each line ("\n") of a request on its own: spaCy splits it into sentences,
CTranslate2 translates them as one batch with beam 4 (ARGOS_BEAM_SIZE) and its own length
penalty 0.2 (|y| ** 0.2, not our GNMT penalty), `replace_unknowns=True`, and the pieces of
all its sentences are decoded together. `argos_translate` does that with CTranslate2 directly.

Positions: Argos passes neither max_input_length nor max_decoding_length, so CTranslate2
cuts inputs at 1,024 tokens and writes at most 256; a position past the stored table is an
error (LibreTranslate answers HTTP 500). So the package's table has max(max_positions,
1,024) rows of the same sinusoids: rows below max_positions are the model's own, and a
sentence longer than the model was trained on gets positions it never saw (a poor
translation of its end instead of an error; mt-translate translates it in pieces instead).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from transformer import outputs
from transformer.checkpoint import META, RUN_CFG, load_model
from transformer.config import ConfigError
from transformer.data import sentences
from transformer.decoding.ct2_model import require_ctranslate2
from transformer.deploy.ct2_export import CheckpointConverter, ExportConfig, ExportError
from transformer.errors import writing
from transformer.model.layers import sinusoid_table

log = logging.getLogger(__name__)

SUFFIX = ".argosmodel"
FROM, TO = ("it", "Italian"), ("en", "English")
PACKAGE_VERSION = "1.0"
ARGOS_VERSION = "1.11"  # the argostranslate whose package layout this follows
METADATA, MODEL_DIR, SPM, SPACY_DIR, README = (
    "metadata.json", "model", "sentencepiece.model", "spacy", "README.md")
# What Argos asks of CTranslate2 (translate.apply_packaged_translation; settings.beam_size).
BEAM_SIZE, LENGTH_PENALTY = 4, 0.2
CT2_MAX_INPUT = 1024  # translate_batch's default max_input_length (its max_decoding_length: 256)
# Lines the export translates to check the package, split as spaCy splits them.
CHECK_LINES = [["Ciao, come stai?"], ["Il gatto dorme sul divano.", "Domani piove."]]


class ArgosConverter(CheckpointConverter):
    """The CTranslate2 converter with the position table Argos can reach: at least
    CT2_MAX_INPUT rows (our model's own rows first, the same function beyond)."""

    def positions(self) -> np.ndarray:
        rows = max(self.cfg.max_positions, CT2_MAX_INPUT)
        return sinusoid_table(rows, self.cfg.d_model).numpy()


def require_spacy():
    """The spacy module, or a one-line error saying how to install it."""
    try:
        import spacy
    except ImportError:
        raise ConfigError("mt-export format=argos needs spacy (the package's sentence splitter): "
                          "pip install -e \".[argos]\"") from None
    return spacy


def is_package(path: Path) -> bool:
    """Whether `path` is a zip holding <dir>/metadata.json (an Argos package)."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(n.count("/") == 1 and n.endswith(f"/{METADATA}") for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def earlier_package(path: Path) -> bool:
    """Whether `path` is a package mt-export wrote before outputs carried markers
    (`outputs.FILE_MARKERS`): an Argos package whose README says it was exported by us.
    A package from the Argos index or built elsewhere is not, and is never replaced."""
    try:
        with zipfile.ZipFile(path) as z:
            readmes = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(f"/{README}")]
            return bool(readmes) and "exported by `mt-export" in z.read(readmes[0]).decode("utf-8", "replace")
    except (OSError, zipfile.BadZipFile):
        return False


def metadata() -> dict:
    return {"package_version": PACKAGE_VERSION, "argos_version": ARGOS_VERSION,
            "from_code": FROM[0], "from_name": FROM[1], "to_code": TO[0], "to_name": TO[1],
            "type": "translate", "links": []}


def readme(checkpoint: Path, model_cfg: dict, quantization: str, ct2_version: str) -> str:
    """The package's README: what it is, the scores the checkpoint recorded, its settings."""
    meta = json.loads((checkpoint / META).read_text()) if (checkpoint / META).is_file() else {}
    run_cfg = (checkpoint / RUN_CFG).read_text() if (checkpoint / RUN_CFG).is_file() else ""
    scores = "\n".join(f"| {k} | {v} |" for k, v in meta.items())
    settings = "\n".join(f"| {k} | {v} |" for k, v in model_cfg.items())
    return f"""# Italian → English (transformer-mt)

An encoder-decoder Transformer trained with transformer-mt, exported by `mt-export
format=argos` from `{checkpoint.resolve()}` (CTranslate2 {ct2_version}, weights
{quantization if quantization != "none" else "float32"}).

Sentence splitting: a blank spaCy Italian pipeline (`spacy/`) with spaCy's rule-based
sentencizer, its tokenizer keeping mt-translate's Italian abbreviations (`Sig.`, `ecc.`,
`p. es.`) whole: set ARGOS_CHUNK_TYPE=SPACY, and ARGOS_COMPUTE_TYPE=default to compute in the
weights' own type. Argos searches with beam {BEAM_SIZE} and length penalty
{LENGTH_PENALTY}; `mt-translate` with beam 5 and GNMT's penalty, so outputs can differ.
The position table holds {max(model_cfg["max_positions"], CT2_MAX_INPUT)} rows, the
model's own max_positions {model_cfg["max_positions"]} (longer sentences get positions it
never saw).

## Scores and state recorded in the checkpoint (meta.json)

Dev scores from training; test scores are not kept in a checkpoint: `mt-evaluate
checkpoint=<checkpoint> test_set=...` gives them.

| key | value |
|---|---|
{scores}

## Model

| setting | value |
|---|---|
{settings}

## Training config (config.yaml)

```yaml
{run_cfg.rstrip()}
```
"""


def blank_pipeline(prefixes: bool = True):
    """A blank Italian spaCy pipeline whose tokenizer keeps each of mt-translate's
    non-breaking prefixes with its full stop as one token (`Sig.`, `ecc.`, `art.`), so that
    the sentencizer Argos adds does not end a sentence there (its rule: a sentence ends at
    a `.` `!` `?` token). Special cases are data in the tokenizer's file: no code."""
    nlp = require_spacy().blank(FROM[0])
    if prefixes:
        for line in sentences.prefixes():
            word = line.split("#")[0].strip()
            if word not in sentences.WORDS:  # spaCy cannot look at the next word: keep "Io no."
                nlp.tokenizer.add_special_case(f"{word}.", [{"ORTH": f"{word}."}])
    return nlp


def sentencizer(prefixes: bool = True):
    """The package's splitter as Argos loads it: `blank_pipeline` plus spaCy's sentencizer."""
    nlp = blank_pipeline(prefixes)
    nlp.add_pipe("sentencizer")
    return nlp


def write_sentencizer(path: Path) -> None:
    """`blank_pipeline` at `path` (Argos adds the sentencizer when loading)."""
    blank_pipeline().to_disk(path)


def export_argos(cfg: ExportConfig) -> Path:
    """Write the Argos package of `cfg.checkpoint` to `cfg.output` (a .argosmodel file)."""
    ct2 = require_ctranslate2("mt-export")
    require_spacy()
    output = Path(cfg.output)
    out = outputs.Output.of(output, "output", "mt-export", force=cfg.force, owned_before=earlier_package)
    outputs.check(out, [cfg.checkpoint])  # the one output rule (outputs.py), before any work
    model, tokenizer = load_model(cfg.checkpoint)
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    converter = ArgosConverter.from_model(model, pieces)
    name = output.name[: -len(SUFFIX)]
    output.parent.mkdir(parents=True, exist_ok=True)
    with writing(output, "output"), tempfile.TemporaryDirectory(prefix="argos-", dir=output.parent) as tmp:
        root = Path(tmp) / name
        root.mkdir()
        quantization = None if cfg.quantization == "none" else cfg.quantization
        converter.convert(str(root / MODEL_DIR), quantization=quantization)
        (root / SPM).write_bytes(tokenizer.proto)
        write_sentencizer(root / SPACY_DIR)
        (root / METADATA).write_text(json.dumps(metadata(), indent=2) + "\n")
        model_cfg = asdict(model.cfg)
        (root / README).write_text(readme(Path(cfg.checkpoint), model_cfg, cfg.quantization,
                                          ct2.__version__))
        check_translates(root, [s for line in CHECK_LINES for s in line])
        packed = Path(tmp) / f"{name}{SUFFIX}"
        with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as z:
            for f in sorted(root.rglob("*")):
                z.write(f, f.relative_to(root.parent).as_posix())
        if importlib.util.find_spec("argostranslate") is not None:
            check_with_argostranslate(packed, root)
        with outputs.write_file(out) as tmp_out:  # checked again, swapped in, recorded as ours
            os.replace(packed, tmp_out)
    log.info("wrote %s (%s, %.1f MB)", output, cfg.quantization, output.stat().st_size / 1e6)
    return output


def argos_translate(translator, sp, sentences: list[str], beam_size: int = BEAM_SIZE) -> str:
    """What Argos makes of one line already split into `sentences`: one CTranslate2 batch
    with Argos's settings, the pieces of all sentences decoded together, "▁" and "_" as
    spaces, one leading space dropped (translate.apply_packaged_translation,
    tokenizer.SentencePieceTokenizer). translator: a ctranslate2.Translator; sp: a
    sentencepiece.SentencePieceProcessor."""
    tokens = [sp.encode(s, out_type=str) for s in sentences]
    found = translator.translate_batch(tokens, replace_unknowns=True, max_batch_size=32,
                                       batch_type="tokens", beam_size=beam_size,
                                       num_hypotheses=1, length_penalty=LENGTH_PENALTY)
    pieces = [p for r in found for p in r.hypotheses[0]]
    text = sp.decode_pieces(pieces).replace("▁", " ").replace("_", " ")
    return text[1:] if text.startswith(" ") else text


def _load(root: Path):
    import sentencepiece as spm

    ct2 = require_ctranslate2("mt-export")
    translator = ct2.Translator(str(root / MODEL_DIR), device="cpu", compute_type="default",
                                inter_threads=1, intra_threads=1)
    return translator, spm.SentencePieceProcessor(model_file=str(root / SPM))


def check_translates(root: Path, lines: list[str]) -> list[str]:
    """Load the unpacked package's model and tokenizer and translate `lines` (one sentence
    each) as Argos would."""
    translator, sp = _load(root)
    out = [argos_translate(translator, sp, [line]) for line in lines]
    log.info("the package translates %r as %r", lines[0], out[0])
    return out


# Run in a fresh interpreter: argostranslate reads its settings (folders, chunk type) from
# the environment when imported, and must not touch the user's own Argos folders.
_ARGOS_SCRIPT = """
import json, sys
from argostranslate import package, translate
package.install_from_path(sys.argv[1])
it, en = (next(l for l in translate.get_installed_languages() if l.code == c) for c in ("it", "en"))
print(json.dumps([it.get_translation(en).translate(s) for s in json.loads(sys.argv[2])]))
"""


def offline_argos_env(home: Path) -> dict[str, str]:
    """An environment in which argostranslate keeps to `home` and fetches nothing."""
    index = home / "index"
    index.mkdir(parents=True, exist_ok=True)
    (index / "index.json").write_text("[]\n")
    # argostranslate downloads spaCy's xx_sent_ud_sm at import unless this folder exists
    (home / "cache" / "argos-translate" / "spacy" / "senter" / "model").mkdir(parents=True, exist_ok=True)
    return {**os.environ, "XDG_DATA_HOME": str(home / "data"), "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_CACHE_HOME": str(home / "cache"), "ARGOS_PACKAGES_DIR": str(home / "packages"),
            "ARGOS_PACKAGE_INDEX": index.as_uri() + "/", "ARGOS_CHUNK_TYPE": "SPACY",
            "ARGOS_COMPUTE_TYPE": "default", "ARGOS_DEVICE_TYPE": "cpu",
            "STANZA_RESOURCES_DIR": str(home / "stanza"), "HF_HUB_OFFLINE": "1",
            # onnxruntime, imported through minisbd (a sentence splitter the package does not
            # use), sends telemetry to mobile.events.data.microsoft.com unless this is set, and
            # writes a session file to $TMPDIR
            "ORT_DISABLE_TELEMETRY": "1", "TMPDIR": str(home)}


def check_with_argostranslate(packed: Path, root: Path) -> None:
    """Install the package with this environment's argostranslate (in a scratch folder)
    and check that it translates CHECK_LINES as `argos_translate` does."""
    lines = [" ".join(sentences) for sentences in CHECK_LINES]
    with tempfile.TemporaryDirectory(prefix="argos-home-") as home:
        run = subprocess.run([sys.executable, "-c", _ARGOS_SCRIPT, str(packed), json.dumps(lines)],
                             env=offline_argos_env(Path(home)), capture_output=True, text=True,
                             timeout=300)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExportError(f"argostranslate could not install or run the package: {last}")
    got = json.loads(run.stdout.strip().splitlines()[-1])
    translator, sp = _load(root)
    want = [argos_translate(translator, sp, sentences) for sentences in CHECK_LINES]
    if got != want:
        raise ExportError(f"argostranslate translated {lines!r} to {got!r}, CTranslate2 with "
                          f"Argos's settings to {want!r}")
    log.info("checked: argostranslate installs the package and translates as CTranslate2 does")
