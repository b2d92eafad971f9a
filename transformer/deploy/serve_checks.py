"""What the LibreTranslate server refuses: malformed requests, and sockets past loopback.

Used by `scripts/serving/libretranslate_guard.py` inside LibreTranslate's own venv: standard
library only.
"""

from __future__ import annotations

import ipaddress
import re

SURROGATE = re.compile("[\ud800-\udfff]")


def problem(data: dict) -> str | None:
    """What is wrong with a JSON request that LibreTranslate 1.9.6 would answer with HTTP
    500 (or not catch at all): None if nothing."""
    q = data.get("q")
    if q is not None and not isinstance(q, str) and not (
            isinstance(q, list) and all(isinstance(t, str) for t in q)):
        return "q must be a string or a list of strings"
    for key in ("source", "target", "format", "api_key"):
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"{key} must be a string"
    alternatives = data.get("alternatives", 0)
    if isinstance(alternatives, bool) or not (isinstance(alternatives, int) or (
            isinstance(alternatives, str) and alternatives.isascii() and alternatives.isdigit())):
        return "alternatives must be a whole number"
    for key, value in data.items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and (m := SURROGATE.search(text)):
                return (f"{key} holds a lone surrogate (\\u{ord(m.group()):04x} at character "
                        f"{m.start()}), which is not Unicode text")
    return None


def is_loopback(host) -> bool:
    if host in (None, "", "localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def refuse_outside(event: str, args: tuple) -> None:
    """An audit hook: a Python socket may reach loopback only (a name lookup included)."""
    if event == "socket.getaddrinfo":
        host = args[0].decode() if isinstance(args[0], bytes) else args[0]
    elif event in ("socket.connect", "socket.sendto") and isinstance(args[1], tuple):
        host = args[1][0]
    else:
        return
    if not is_loopback(host):
        raise PermissionError(f"{event} to {host}: this server sends nothing off the machine")
