"""The `mt-*` commands: Hydra entry points, and what they share.

One module per command (`train.py` is `mt-train`, `translate.py` `mt-translate`, and
`evaluate`, `prepare`, `average`, `export`, `masks`); `cli.py` is what every command
shares (a config to its dataclass, one-line user errors, logging), `overrides.py` the
command-line overrides Hydra would read otherwise than a user means them, `sweep.py`
`mt-train -m`'s Optuna study. Hydra is imported here and nowhere below.

May import: every other layer; nothing imports it.
"""
