"""Italian→English neural machine translation with the Transformer of Vaswani et al. (2017)."""

__version__ = "0.1.0"
