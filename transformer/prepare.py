"""mt-prepare: load, clean, tokenize and encode a corpus ahead of training; print statistics.

mt-prepare data=tatoeba
mt-prepare data=sample data.vocab_size=300
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer.config import DataConfig, to_dataclass
from transformer.corpus import PROJECT_ROOT
from transformer.data import format_statistics, prepare_data


# An absolute path: with a relative one Hydra looks for a `configs` Python package whenever
# main is imported (the mt-prepare console script, scripts/prepare_data.py) and fails.
@hydra.main(config_path=str(PROJECT_ROOT / "configs"), config_name="prepare", version_base="1.3")
def main(cfg: DictConfig) -> None:
    data_cfg = to_dataclass(DataConfig, cfg.data)
    prepared = prepare_data(data_cfg)
    source = "reused from" if prepared.from_cache else "saved to"
    print(f"{data_cfg.name}: prepared data {source} {prepared.path}")
    print(format_statistics(prepared.stats))


if __name__ == "__main__":
    main()
