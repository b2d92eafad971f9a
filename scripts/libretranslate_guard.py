"""LibreTranslate's own command, with a check in front of POST /translate.

    <LibreTranslate's venv>/bin/python scripts/libretranslate_guard.py --host 127.0.0.1 ...

Run by scripts/serve_libretranslate.sh in LibreTranslate's venv (it imports nothing of
this project). LibreTranslate 1.9.6 answers most bad requests with 400 and a message, but
two malformed JSON bodies reach code outside its checks and end in HTTP 500:
`"alternatives": "x"` (int() before its try) and a `q` that is neither a string nor a list
of strings (a number, an object). This answers those with 400 and says which field is
wrong; everything else goes to LibreTranslate untouched (the body is read once and
handed on).
"""

from __future__ import annotations

import importlib
import io
import json

# the module: `libretranslate.main` as an attribute is the function it defines
lt_main = importlib.import_module("libretranslate.main")


def problem(data: dict) -> str | None:
    """What is wrong with a JSON /translate request that LibreTranslate would not catch."""
    q = data.get("q")
    if q is not None and not isinstance(q, str) and not (
            isinstance(q, list) and all(isinstance(t, str) for t in q)):
        return "q must be a string or a list of strings"
    for key in ("source", "target", "format", "api_key"):
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"{key} must be a string"
    alternatives = data.get("alternatives", 0)
    if isinstance(alternatives, bool) or not (
            isinstance(alternatives, int) or (isinstance(alternatives, str) and alternatives.isdigit())):
        return "alternatives must be a whole number"
    return None


def guard(app):
    """A WSGI app that answers the requests `problem` finds with 400, else runs `app`."""

    def guarded(environ, start_response):
        if (environ.get("PATH_INFO", "").endswith("/translate") and environ.get("REQUEST_METHOD") == "POST"
                and "json" in environ.get("CONTENT_TYPE", "")):
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            try:
                data = json.loads(body)
            except ValueError:  # not JSON: LibreTranslate answers 400 itself
                data = None
            why = problem(data) if isinstance(data, dict) else None
            if why:
                payload = json.dumps({"error": f"Invalid request: {why}"}).encode()
                start_response("400 BAD REQUEST", [("Content-Type", "application/json"),
                                                   ("Content-Length", str(len(payload)))])
                return [payload]
        return app(environ, start_response)

    return guarded


_create_app = lt_main.create_app
lt_main.create_app = lambda args: guard(_create_app(args))  # main() looks it up when it runs

if __name__ == "__main__":
    lt_main.main()
