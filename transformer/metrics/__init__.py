"""Scoring translations against references: what validation and mt-evaluate report.

BLEU, chrF and TER are sacrebleu's (its defaults, so its own command line prints the same
scores); `name_copy.py` is the project's own: how many of the names a reference copied
from its source the hypothesis copies too. Validation (`training/validation.py`) and the
evaluation command (`commands/evaluate.py`) report both.

May import: the top-level modules; never the model, the data, decoding, training,
deployment or the commands.
"""
