"""LibreTranslate's own command, made fit to serve: checks in front, fair batching inside.

    <LibreTranslate's venv>/bin/python scripts/serving/libretranslate_guard.py --host 127.0.0.1 ...

Run by scripts/serving/serve_libretranslate.sh in LibreTranslate's venv, with LibreTranslate's own
arguments; this project's settings come from MT_SERVE_* variables (the script sets them).
Around LibreTranslate 1.9.6 it adds:
- checks that answer malformed requests with 400 where LibreTranslate would answer 500:
  `q` neither a string nor a list of strings, `alternatives` not a whole number, a lone
  surrogate escape (`"\\ud800"`, which spaCy cannot encode);
- fair, bounded translation (`transformer.deploy.serving`): a request's lines and sentences as
  one batch on a shared CTranslate2 translator, at most MT_SERVE_MAX_SENTENCES sentences
  and MT_SERVE_MAX_PIECES pieces a request (400 past them), MT_SERVE_SECONDS a request
  (503 past it), short requests first; long requests (more than one chunk) at most
  --threads - 2 at a time (503 past it), so two request threads are always free;
- privacy: Argos's INFO log (every request's text) is off unless MT_SERVE_DEBUG=1;
- nothing leaves the machine: onnxruntime (which phones home) never loaded, its telemetry
  off should anything load it (ORT_DISABLE_TELEMETRY), and any Python socket that would
  reach past loopback refused;
- hygiene: a busy port is one line before anything loads; the server gets SIGTERM when
  the script that started it dies (however), and deletes the scratch folder the script
  made (MT_SERVE_CLEANUP, marked as the script's) when it stops.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import importlib
import importlib.machinery
import io
import json
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import types
from pathlib import Path

PROG = "serve_libretranslate"
OWNER_MARK = ".mt-serve-owner"  # written by the script into the scratch folder it made


def fail(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(1)


# --- nothing leaves the machine -------------------------------------------------------
# onnxruntime, imported by argostranslate through minisbd (MiniSBD, a sentence splitter this
# server does not use: the package splits with spaCy), sends telemetry to
# mobile.events.data.microsoft.com when imported and writes a session file to $TMPDIR and
# state to ~/.cache. It is kept out of the process: minisbd imports it at the top but uses
# it only to split sentences, and then the stand-in below says why it cannot. The
# variable turns the telemetry off should anything load the real one.
os.environ["ORT_DISABLE_TELEMETRY"] = "1"


class SwitchedOff(types.ModuleType):
    """A module that cannot be used: any of its names is an ImportError saying why."""

    def __getattr__(self, name: str):
        if name.startswith("__"):  # probes such as hasattr(m, "__file__") get their usual answer
            raise AttributeError(name)
        raise ImportError(f"{self.__name__} is switched off in this server (it phones home); "
                          "MiniSBD sentence splitting needs it: keep ARGOS_CHUNK_TYPE=SPACY")


sys.modules["onnxruntime"] = SwitchedOff("onnxruntime")
sys.modules["onnxruntime"].__spec__ = importlib.machinery.ModuleSpec("onnxruntime", None)

# the project's serving modules: standard library only (this runs in LibreTranslate's venv)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from transformer.deploy.serve_checks import problem, refuse_outside  # noqa: E402

sys.addaudithook(refuse_outside)  # any Python socket past loopback: PermissionError


# --- process hygiene ------------------------------------------------------------------
def die_with_parent() -> None:
    """SIGTERM when the script that started us dies, even by SIGKILL (Linux prctl)."""
    parent = os.environ.get("MT_SERVE_PARENT")
    if not parent or not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # it died before prctl took effect
        raise SystemExit(0)


def remove_scratch() -> None:
    """Delete the scratch folder the script made, if it is marked as the script's."""
    folder = os.environ.get("MT_SERVE_CLEANUP")
    if folder and (Path(folder) / OWNER_MARK).is_file():
        shutil.rmtree(folder, ignore_errors=True)


def check_port(host: str, port: int) -> None:
    """One line, before anything loads, if the port is taken (waitress would fail later)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as waitress binds
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                fail(f"port {port} is in use (another server?): choose another with PORT=...")
            fail(f"cannot listen on {host}:{port}: {e.strerror}")


def option(name: str, default: str) -> str:
    """The value of LibreTranslate's --name argument in our command line."""
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return default


die_with_parent()
atexit.register(remove_scratch)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # atexit runs; so does the script's trap
check_port(option("host", "127.0.0.1"), int(option("port", "5000")))

from transformer.deploy.serving import Budget, FairTranslator, Refused, ServeLimits  # noqa: E402

# the module: `libretranslate.main` as an attribute is the function it defines
lt_main = importlib.import_module("libretranslate.main")
from argostranslate import settings as argos_settings  # noqa: E402
from argostranslate import translate as argos  # noqa: E402
from werkzeug.exceptions import HTTPException  # noqa: E402

DEBUG = os.environ.get("MT_SERVE_DEBUG", "0") not in ("", "0")
# Argos logs every request's text (lines, sentences, pieces, translations) at INFO
logging.getLogger("argostranslate.utils").setLevel(logging.DEBUG if DEBUG else logging.WARNING)


def limits_from_env(threads: int) -> ServeLimits:
    def number(name: str, kind, default):
        raw = os.environ.get(f"MT_SERVE_{name}", "")
        try:
            return kind(raw) if raw else default
        except ValueError:
            fail(f"MT_SERVE_{name}={raw!r}: not a number")

    limits = ServeLimits(
        max_sentences=number("MAX_SENTENCES", int, ServeLimits.max_sentences),
        max_pieces=number("MAX_PIECES", int, ServeLimits.max_pieces),
        chunk_pieces=number("CHUNK_PIECES", int, ServeLimits.chunk_pieces),
        seconds=number("SECONDS", float, ServeLimits.seconds),
        length_bucket=number("LENGTH_BUCKET", int, ServeLimits.length_bucket),
        workers=argos_settings.inter_threads)
    try:
        limits.check()
    except ValueError as e:
        fail(str(e))
    if threads < 3:
        fail(f"--threads {threads}: at least 3 (two are kept for short requests)")
    return limits


# --- requests -------------------------------------------------------------------------
def form_request(environ: dict, body: bytes) -> dict:
    """q, source and target of a form-encoded request, as LibreTranslate reads them."""
    from werkzeug.wrappers import Request

    env = {**environ, "wsgi.input": io.BytesIO(body)}
    values = Request(env).values
    q = values.get("q")
    return {"q": "\n".join(q.splitlines()) if q else q,  # LibreTranslate does the same
            "source": values.get("source"), "target": values.get("target")}


class Server:
    """The served packages' fair translators, and what each request may still spend."""

    def __init__(self, limits: ServeLimits, threads: int):
        self.limits = limits
        self.engines: dict[tuple[str, str], FairTranslator] = {}
        self.long_slots = threading.BoundedSemaphore(threads - 2)
        self.request = threading.local()

    def engine(self, pkg) -> FairTranslator:
        key = (pkg.from_code, pkg.to_code)
        if key not in self.engines:
            import ctranslate2

            params = {"device": argos_settings.device, "inter_threads": argos_settings.inter_threads,
                      "intra_threads": argos_settings.intra_threads}
            if argos_settings.compute_type != "auto":
                params["compute_type"] = argos_settings.compute_type
            translator = ctranslate2.Translator(str(pkg.package_path / "model"), **params)
            self.engines[key] = FairTranslator(translator, self.limits, argos_settings.beam_size)
        return self.engines[key]

    def budget(self) -> Budget:
        budget = getattr(self.request, "budget", None)
        if budget is None:  # called outside a request (start-up): a budget of its own
            budget = Budget(self.limits)
        return budget

    def prepare(self, translation, text: str, check: bool = True) -> list[tuple[list[str], list[list[str]]]]:
        """Each line of `text`: its sentences and their pieces. A text seen for the first
        time in this request is charged to its budget (and `check`ed: Refused past the
        limits)."""
        prepared = getattr(self.request, "prepared", None)
        if prepared is None:
            prepared = self.request.prepared = {}
        key = (id(translation), text)
        if key not in prepared:
            paragraphs = text.split("\n")
            nlp = getattr(translation.sentencizer, "nlp", None)
            if nlp is not None:  # spaCy: all lines in one pass
                split = [[s.text for s in doc.sents] for doc in nlp.pipe(paragraphs)]
            else:
                split = [translation.sentencizer.split_sentences(p) for p in paragraphs]
            encode = translation.pkg.tokenizer.encode
            prepared[key] = [(sentences, [encode(s) for s in sentences]) for sentences in split]
            self.charge(prepared[key], check)
        return prepared[key]

    def charge(self, lines: list[tuple[list[str], list[list[str]]]], check: bool = True) -> None:
        self.budget().charge(sum(len(s) for s, _ in lines),
                             sum(len(p) for _, ps in lines for p in ps), check)

    def hypotheses(self, translation, text: str, n: int) -> list:
        """Argos's PackageTranslation.hypotheses, every line and sentence in one batch."""
        pkg = translation.pkg
        lines = self.prepare(translation, text)
        prefix = [pkg.target_prefix] if pkg.target_prefix else None
        found = self.engine(pkg).translate([p for _, ps in lines for p in ps], n, self.budget(),
                                           prefix)
        result, start = [argos.Hypothesis("", 0) for _ in range(n)], 0
        for sentences, _ in lines:
            mine, start = found[start:start + len(sentences)], start + len(sentences)
            for i in range(n):
                value = pkg.tokenizer.decode([t for h in mine for t in h.pieces[i]])
                if pkg.target_prefix and value.startswith(pkg.target_prefix):
                    value = value[len(pkg.target_prefix):]
                value = value[1:] if value.startswith(" ") else value
                result[i] = argos.Hypothesis("\n".join([result[i].value, value]),
                                             result[i].score + sum(h.scores[i] for h in mine))
        for h in result:
            h.value = h.value.lstrip("\n")
        return result

    def begin(self, data: dict | None) -> str | None:
        """Start a request's budget; split and count its texts now if it names a served
        pair, so that one over the limits is refused before any work. Returns a reason
        to refuse it with 503 if it is long and the long-request slots are taken."""
        self.request.budget, self.request.prepared, self.request.slot = Budget(self.limits), {}, False
        if not data or not isinstance(data.get("q"), str | list):
            return None
        source, target = data.get("source"), data.get("target")
        # source=auto: LibreTranslate detects it later; counted with a package into `target`
        pair = next((t for t in translations() if t.pkg.to_code == target and
                     source in (t.pkg.from_code, "auto")), None)
        if pair is None:
            return None
        seen = set()
        for text in data["q"] if isinstance(data["q"], list) else [data["q"]]:
            if isinstance(text, str):
                lines = self.prepare(pair, text, check=False)  # charged the first time
                if text in seen:  # each repeat is translated again: charged again
                    self.charge(lines, check=False)
                seen.add(text)
        self.request.budget.check()  # all counted: the error says the whole request's size
        if self.request.budget.pieces > self.limits.chunk_pieces:
            if not self.long_slots.acquire(blocking=False):
                return ("Server busy: too many long requests are being translated at once; "
                        "try again shortly, or send shorter texts")
            self.request.slot = True
        return None

    def end(self) -> None:
        if getattr(self.request, "slot", False):
            self.long_slots.release()
        self.request.budget = self.request.prepared = None
        self.request.slot = False


def translations() -> list:
    """The installed packages' translations (Argos's PackageTranslation objects)."""
    return [t.underlying for lang in argos.get_installed_languages() for t in lang.translations_from
            if isinstance(getattr(t, "underlying", None), argos.PackageTranslation)]


SERVER: Server | None = None


def cached_hypotheses(self, input_text: str, num_hypotheses: int = 4):
    """CachedTranslation.hypotheses through the fair translator (no cache: it held the last
    request's text, unlocked between threads)."""
    if isinstance(self.underlying, argos.PackageTranslation):
        return SERVER.hypotheses(self.underlying, input_text, num_hypotheses)
    return _cached_hypotheses(self, input_text, num_hypotheses)


_cached_hypotheses = argos.CachedTranslation.hypotheses
argos.CachedTranslation.hypotheses = cached_hypotheses


def answer(start_response, status: int, message: str) -> list[bytes]:
    payload = json.dumps({"error": message}).encode()
    reason = {400: "BAD REQUEST", 503: "SERVICE UNAVAILABLE"}.get(status, "ERROR")
    start_response(f"{status} {reason}", [("Content-Type", "application/json"),
                                          ("Content-Length", str(len(payload)))])
    return [payload]


def guard(app, server: Server):
    """A WSGI app: malformed requests answered with 400, the rest run by `app` within
    their budget; the server's token on every answer (the script's readiness check)."""
    token = os.environ.get("MT_SERVE_TOKEN", "")

    def guarded(environ, start_response):
        def respond(status, headers, exc_info=None):
            return start_response(status, [*headers, ("X-MT-Serve", token)], exc_info)

        if environ.get("REQUEST_METHOD") != "POST":
            return app(environ, respond)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        data = None
        if "json" in environ.get("CONTENT_TYPE", ""):
            try:
                data = json.loads(body)
            except ValueError:  # not JSON: LibreTranslate answers 400 itself
                data = None
            why = problem(data) if isinstance(data, dict) else None
            if why:
                return answer(respond, 400, f"Invalid request: {why}")
        elif environ.get("PATH_INFO", "").endswith("/translate"):
            try:
                data = form_request(environ, body)
            except HTTPException:  # a form werkzeug cannot read: LibreTranslate answers it (4xx)
                data = None
        try:
            if environ.get("PATH_INFO", "").endswith("/translate") and isinstance(data, dict):
                busy = server.begin(data)
                if busy:
                    return answer(respond, 503, busy)
            return app(environ, respond)
        except Refused as e:
            return answer(respond, e.status, e.message)
        finally:
            server.end()

    return guarded


def create_app(args):
    global SERVER
    app = _create_app(args)  # loads the languages (Argos's packages)
    SERVER = Server(limits_from_env(args.threads), args.threads)
    app.register_error_handler(Refused, lambda e: (json.dumps({"error": e.message}), e.status,
                                                   {"Content-Type": "application/json"}))
    for translation in translations():  # load and warm up now, not on the first request
        SERVER.hypotheses(translation, "Ciao.", 1)
    return guard(app, SERVER)


_create_app = lt_main.create_app
lt_main.create_app = create_app  # main() looks it up when it runs

if __name__ == "__main__":
    lt_main.main()
