"""`mt-export`: a checkpoint as a CTranslate2 model directory, an Argos Translate package
or a Hugging Face transformers folder.

    mt-export checkpoint=runs/tatoeba_cpu/checkpoints/best output=exports/tatoeba_int8 quantization=int8
    mt-export checkpoint=runs/tatoeba_cpu/checkpoints/best output=exports/tatoeba.argosmodel format=argos
    mt-export checkpoint=runs/tatoeba_cpu/checkpoints/best output=exports/tatoeba_hf format=hf

The command only chooses the converter: `transformer/deploy/ct2_export.py` writes the
CTranslate2 directory, `transformer/deploy/argos.py` the Argos package built on it,
`transformer/deploy/hf_export.py` the transformers folder, whose model card quotes the
model's mt-evaluate reports (the `.json` files in its outputs/eval folder).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import hydra
from omegaconf import DictConfig

from transformer.checkpoint import EVAL_DIR, find_checkpoint, model_name
from transformer.commands import cli
from transformer.decoding.ct2_model import require_ctranslate2
from transformer.deploy.argos import export_argos, require_spacy
from transformer.deploy.ct2_export import ExportConfig, export_ct2
from transformer.deploy.hf_export import export_hf


def export(cfg: ExportConfig) -> Path:
    """Write the export `cfg.format` names (`ct2`, `argos` or `hf`) of `cfg.checkpoint` to `cfg.output`.

    Args:
        cfg: the `mt-export` settings (configs/export.yaml); `checkpoint` may name a run
            directory (`checkpoint.find_checkpoint`).

    Returns:
        The path written: the CTranslate2 directory, the `.argosmodel` file or the
        transformers folder.
    """
    if cfg.format == "hf":  # json, safetensors and the SentencePiece model: no extra needed
        cfg = dataclasses.replace(cfg, checkpoint=str(find_checkpoint(cfg.checkpoint)))
        reports = sorted((Path(EVAL_DIR) / model_name(cfg.checkpoint)).glob("*.json"))
        return export_hf(cfg, reports)
    require_ctranslate2("mt-export")  # a missing extra first: nothing else can be done without it
    if cfg.format == "argos":
        require_spacy()
    cfg = dataclasses.replace(cfg, checkpoint=str(find_checkpoint(cfg.checkpoint)))  # a run: its best
    return export_argos(cfg) if cfg.format == "argos" else export_ct2(cfg)


@hydra.main(config_path=cli.CONFIG_PATH, config_name="export", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    cli.run_command("mt-export", ExportConfig, cfg, export)


def main() -> None:
    """The `mt-export` console script."""
    cli.hydra_entry("mt-export", hydra_main, ExportConfig)


if __name__ == "__main__":
    main()
