"""transformer/deploy/serve_checks.py: what the LibreTranslate server refuses before LibreTranslate
sees it (malformed requests it would answer with HTTP 500), and its loopback-only rule for
Python sockets. The server itself is tests/deploy/test_serve.py (marked `serve`)."""

from __future__ import annotations

import pytest

from transformer.deploy.serve_checks import is_loopback, problem, refuse_outside


def test_a_well_formed_request_has_no_problem():
    assert problem({"q": "Ciao, come stai? 😀", "source": "it", "target": "en"}) is None
    assert problem({"q": ["Uno.", "Due."], "source": "it", "target": "en", "alternatives": "3",
                    "format": "html"}) is None


@pytest.mark.parametrize(("data", "why"), [
    ({"q": 123}, "q must be a string or a list of strings"),
    ({"q": ["a", 1]}, "q must be a string or a list of strings"),
    ({"q": "a", "target": ["en"]}, "target must be a string"),
    ({"q": "a", "alternatives": "x"}, "alternatives must be a whole number"),
    ({"q": "a", "alternatives": "²"}, "alternatives must be a whole number"),  # isdigit, int() fails
    ({"q": "a", "alternatives": True}, "alternatives must be a whole number"),
    ({"q": "a", "alternatives": 2.5}, "alternatives must be a whole number"),
    ({"q": "Ciao \ud800"}, "q holds a lone surrogate (\\ud800 at character 5)"),
    ({"q": ["ok", "\udfffx"]}, "q holds a lone surrogate (\\udfff at character 0)"),
    ({"q": "a", "source": "i\ud83dt"}, "source holds a lone surrogate"),
])
def test_malformed_requests_are_named(data, why):
    assert why in problem(data)


def test_only_loopback_may_be_reached():
    for host in ("127.0.0.1", "127.5.5.5", "::1", "localhost", None, ""):
        assert is_loopback(host)
        refuse_outside("socket.connect", (object(), (host, 80)))
    for host in ("10.0.0.1", "1.2.3.4", "example.com", "fd00::1", "mobile.events.data.microsoft.com"):
        assert not is_loopback(host)
    with pytest.raises(PermissionError, match=r"socket\.connect to 1\.2\.3\.4"):
        refuse_outside("socket.connect", (object(), ("1.2.3.4", 443)))
    with pytest.raises(PermissionError, match=r"socket\.getaddrinfo to example\.com"):
        refuse_outside("socket.getaddrinfo", (b"example.com", 443, 0, 0, 0, 0))
    with pytest.raises(PermissionError, match=r"socket\.sendto to 10\.255\.255\.53"):
        refuse_outside("socket.sendto", (object(), ("10.255.255.53", 53)))
    refuse_outside("socket.connect", (object(), "/run/some.sock"))  # a Unix socket
    refuse_outside("open", ("/etc/hosts", "r", 0))  # other events pass
