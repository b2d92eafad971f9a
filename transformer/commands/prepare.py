"""`mt-prepare`: load, clean, tokenize and encode a corpus ahead of training; print statistics.

    mt-prepare data=tatoeba
    mt-prepare data=sample data.spm_vocab_size=300
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hydra
from omegaconf import DictConfig

from transformer.commands import cli
from transformer.config import DataConfig
from transformer.data.pipeline import prepare_data


@dataclass
class PrepareConfig:
    """The settings of mt-prepare (configs/prepare.yaml)."""

    data: DataConfig = field(default_factory=DataConfig)
    """The corpus: the data group."""

    def validate(self) -> None:
        self.data.validate("data")


def prepare(cfg: PrepareConfig) -> None:
    prepared = prepare_data(cfg.data)
    source = "reused from" if prepared.from_cache else "saved to"
    print(f"{cfg.data.describe()}: prepared data {source} {prepared.path}")
    print(format_statistics(prepared.stats))


# An absolute path: with a relative one Hydra looks for a `configs` Python package whenever
# main is imported (the mt-prepare console script, scripts/data/prepare_data.py) and fails.
@hydra.main(config_path=cli.CONFIG_PATH, config_name="prepare", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    cli.run_command("mt-prepare", PrepareConfig, cfg, prepare)


def format_statistics(stats: dict) -> str:
    """The statistics of `prepare_data` as a small human-readable report."""
    lines = [f"vocabulary: {stats['vocab_size']} pieces"]
    for name, s in stats["splits"].items():
        raw = stats.get("raw_pairs", {}).get(name, "?")
        dropped = ", ".join(f"{k} {v}" for k, v in stats.get("dropped", {}).get(name, {}).items())
        lines.append(
            f"{name}: {s['pairs']} pairs (of {raw}; dropped: {dropped}) | tokens src {s['src_tokens']} "
            f"tgt {s['tgt_tokens']} | mean len {s['src_mean_len']}/{s['tgt_mean_len']} "
            f"| max len {s['src_max_len']}/{s['tgt_max_len']}"
        )
    b = stats["batching"]
    lines.append(
        f"batching at max_tokens={b['max_tokens']}: {b['batches_per_epoch']} batches/epoch, "
        f"{b['mean_pairs_per_batch']} pairs/batch, padding efficiency {b['padding_efficiency']:.1%}"
    )
    if sampled := stats.get("subword_sampling"):
        lines.append(f"subword sampling: {sampled['segmentations']} segmentations of each training pair, "
                     f"mean len {sampled['src_mean_len']:.2f}/{sampled['tgt_mean_len']:.2f}")
    seconds = stats.get("seconds", {})
    lines.append(
        "seconds: "
        + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items())
        + f" (total {sum(seconds.values()):.2f})"
    )
    return "\n".join(lines)



def main() -> None:
    """The `mt-prepare` console script."""
    cli.hydra_entry("mt-prepare", hydra_main, PrepareConfig)


if __name__ == "__main__":
    main()
