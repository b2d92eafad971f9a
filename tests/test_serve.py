"""scripts/serve_libretranslate.sh: a trained model served by LibreTranslate, offline.

A tiny model is trained here (the debug preset on the sample corpus), packed with
`mt-export format=argos` (int8, as the script packs a checkpoint), and served on a free
port of 127.0.0.1 from LibreTranslate's own venv (built by the script if missing; CI
builds it first with `scripts/serve_libretranslate.sh --setup`). What comes back through
`libretranslatepy` is compared with CTranslate2 run directly on our own export (the same
weights, the same int8), with what Argos and LibreTranslate do around it spelled out in
`expected`: spaCy's sentence split, beam 4 and length penalty 0.2, "_" as a space, and
LibreTranslate's final touch to punctuation and case.

Marked `serve`: not in the fast suite (`pytest -m serve`, CI's own step). Every request
has a timeout, and the server is stopped (its whole process group) in a finally.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from transformer.argos import SPACY_DIR, argos_translate, sentencizer
from transformer.config import PROJECT_ROOT
from transformer.corpus import read_lines
from transformer.export import ExportConfig, export

from helpers import SAMPLE, run

pytestmark = pytest.mark.serve
ctranslate2 = pytest.importorskip("ctranslate2")
spacy = pytest.importorskip("spacy")
libretranslatepy = pytest.importorskip("libretranslatepy")

SCRIPT = PROJECT_ROOT / "scripts" / "serve_libretranslate.sh"
BOOT_SECONDS = 600  # includes building LibreTranslate's venv when it is missing
REQUEST_SECONDS = 60
CHAR_LIMIT = 5000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(checkpoint, the .argosmodel, our CTranslate2 export), all int8."""
    tmp = tmp_path_factory.mktemp("serve")
    run(tmp / "run")
    ckpt = tmp / "run" / "checkpoints" / "best"
    package = export(ExportConfig(checkpoint=str(ckpt), output=str(tmp / "sample.argosmodel"),
                                  format="argos", quantization="int8"))
    ct2 = export(ExportConfig(checkpoint=str(ckpt), output=str(tmp / "ct2"), quantization="int8"))
    return ckpt, package, ct2


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    """The script serving the package; yields its URL. Stopped, with its children, at the end."""
    _, package, _ = model
    home = tmp_path_factory.mktemp("serve-home")
    port = free_port()
    log = (home.parent / "server.log").open("w")
    env = {**os.environ, "MT_SERVE_HOME": str(home), "CHAR_LIMIT": str(CHAR_LIMIT), "THREADS": "2"}
    proc = subprocess.Popen(["nice", "-n", "19", str(SCRIPT), str(package), str(port)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + BOOT_SECONDS
        while True:
            assert proc.poll() is None, f"the server exited: {Path(log.name).read_text()[-3000:]}"
            try:
                urllib.request.urlopen(f"{url}/languages", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start in time"
                time.sleep(0.5)
        yield url
    finally:
        stop(proc)
        log.close()


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the script's process group (its trap stops LibreTranslate and waits for
    it), then SIGKILL to whatever is left of the group after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    """(status, JSON answer) of a POST /translate, errors included."""
    req = urllib.request.Request(f"{url}/translate", data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_SECONDS) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def libretranslate_formatting(source: str, translation: str) -> str:
    """LibreTranslate 1.9.6's `language.improve_translation_formatting` (defaults), then
    html.unescape, as its /translate applies them to Argos's output: the source's final
    punctuation mark, a one-word source's repeated words cut to one, the source's case."""
    source = source.strip()
    if not source:
        return ""
    if not translation:
        return source
    marks = ["!", "?", ".", ",", ";", "。"]
    if source[-1] in marks:
        if translation[-1] != source[-1]:
            if translation[-1] in marks:
                translation = translation[:-1]
            translation += source[-1]
    elif translation[-1] in marks:
        translation = translation[:-1]
    if len(source) < 20 and source.count(" ") == 0 and translation.count(" ") > 0:
        words = translation.split()
        counts = {w: words.count(w) for w in words}
        if any(c / len(counts) >= 2 for c in counts.values()):
            translation = words[0]
    if source.islower():
        translation = translation.lower()
    elif source.isupper():
        translation = translation.upper()
    elif translation and source[0].islower():
        translation = translation[0].lower() + translation[1:]
    elif translation and source[0].isupper():
        translation = translation[0].upper() + translation[1:]
    return html.unescape(translation or source)


@pytest.fixture(scope="module")
def expected(model):
    """What the server should answer for a text: Argos's pipeline around a direct
    CTranslate2 run of our own int8 export, then LibreTranslate's formatting."""
    import sentencepiece as spm

    _, _, ct2 = model
    translator = ctranslate2.Translator(str(ct2), device="cpu", compute_type="default")
    sp = spm.SentencePieceProcessor(model_file=str(ct2 / "tokenizer.model"))
    nlp = sentencizer()  # what the package holds (checked below) plus Argos's sentencizer

    def translate(text: str) -> str:
        text = "\n".join(text.splitlines())  # LibreTranslate normalises a form's line ends
        paragraphs = [argos_translate(translator, sp, [s.text for s in nlp(p).sents])
                      for p in text.split("\n")]
        return libretranslate_formatting(text, "\n".join(paragraphs).lstrip("\n"))

    return translate


def test_package_holds_a_blank_italian_pipeline_without_a_sentencizer(model, tmp_path):
    import zipfile

    _, package, _ = model
    with zipfile.ZipFile(package) as z:
        z.extractall(tmp_path)
    nlp = spacy.load(tmp_path / "sample" / SPACY_DIR, exclude=["parser"])
    assert nlp.lang == "it" and nlp.pipe_names == []  # Argos adds the sentencizer itself


def test_languages_lists_italian_to_english(server):
    languages = libretranslatepy.LibreTranslateAPI(server).languages(timeout=REQUEST_SECONDS)
    codes = {lang["code"]: lang["targets"] for lang in languages}
    assert "en" in codes["it"]


def test_translations_equal_ctranslate2_with_argos_settings(server, expected):
    api = libretranslatepy.LibreTranslateAPI(server)
    texts = [*read_lines(SAMPLE / "dev.it")[:12], "Ciao. Come stai? Bene!",
             "Prima riga.\nSeconda riga, più lunga della prima.", "il nome_del_file è lungo",
             "Il Sig. Rossi è qui, p. es. con il Dott. Bianchi. Entra!"]  # split once, not four times
    got = [api.translate(t, "it", "en", timeout=REQUEST_SECONDS) for t in texts]
    want = [expected(t) for t in texts]
    assert got == want
    assert len(set(got)) > 1


def test_bad_requests_get_a_4xx_that_says_why_and_the_server_lives_on(server):
    answers = {
        "empty": post(server, json.dumps({"q": "", "source": "it", "target": "en"}).encode()),
        "too long": post(server, json.dumps({"q": "a" * 20_000, "source": "it", "target": "en"}).encode()),
        "not JSON": post(server, b'{"q": "Ciao", "source": '),
        "a JSON list": post(server, b'["Ciao", "it", "en"]'),
        "no target": post(server, json.dumps({"q": "Ciao", "source": "it"}).encode()),
        "unknown language": post(server, json.dumps({"q": "Ciao", "source": "xx", "target": "en"}).encode()),
        # LibreTranslate alone answers these two with 500 (scripts/libretranslate_guard.py)
        "q a number": post(server, json.dumps({"q": 123, "source": "it", "target": "en"}).encode()),
        "alternatives not a number": post(server, json.dumps(
            {"q": "Ciao", "source": "it", "target": "en", "alternatives": "x"}).encode()),
        "too many alternatives": post(server, json.dumps(
            {"q": "Ciao", "source": "it", "target": "en", "alternatives": 50}).encode()),
    }
    for what, (status, answer) in answers.items():
        assert 400 <= status < 500 and answer.get("error"), (what, status, answer)
    assert "missing q" in answers["empty"][1]["error"]
    assert f"exceeds text limit ({CHAR_LIMIT})" in answers["too long"][1]["error"]
    assert "missing target" in answers["no target"][1]["error"]
    assert "xx is not supported" in answers["unknown language"][1]["error"]
    assert "q must be a string" in answers["q a number"][1]["error"]
    assert "alternatives must be a whole number" in answers["alternatives not a number"][1]["error"]
    assert "alternatives parameter must be <= 3" in answers["too many alternatives"][1]["error"]
    status, answer = post(server, json.dumps({"q": "Ciao!", "source": "it", "target": "en"}).encode())
    assert status == 200 and "translatedText" in answer


def test_a_sentence_longer_than_the_position_table_is_translated(server, model):
    """Argos lets CTranslate2 cut inputs at 1,024 pieces; the package's position table has
    that many rows, so a sentence past the model's own max_positions is no HTTP 500."""
    import sentencepiece as spm

    ckpt, _, ct2 = model
    max_positions = json.loads((ckpt / "model.json").read_text())["max_positions"]
    sp = spm.SentencePieceProcessor(model_file=str(ct2 / "tokenizer.model"))
    long_sentence = " ".join(["parola"] * 700)  # one sentence (no full stop), < the char limit
    assert len(long_sentence) < CHAR_LIMIT and len(sp.encode(long_sentence)) > 1024 > max_positions
    status, answer = post(server, json.dumps({"q": long_sentence, "source": "it", "target": "en"}).encode())
    assert status == 200 and isinstance(answer["translatedText"], str)
    status, _ = post(server, json.dumps({"q": "Ciao!", "source": "it", "target": "en"}).encode())
    assert status == 200
