"""Deployment: a checkpoint as a CTranslate2 model or an Argos package, and fair serving.

`ct2_export.py` converts a checkpoint into a CTranslate2 model directory; `argos.py`
wraps that export as an Argos Translate package for LibreTranslate; `serving.py` (fair,
bounded batching of requests) and `serve_checks.py` (what the server refuses) run inside
LibreTranslate's own virtual environment, through `scripts/serving/libretranslate_guard.py`, and
therefore import nothing but the standard library.

May import: the top-level modules, `transformer.model`, `transformer.data`,
`transformer.decoding`; never training or the commands.
"""
