"""Run by tests/training/test_distributed.py under torchrun: train, then dump this rank's parameters."""

import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import save_file

from transformer.commands import cli
from transformer.commands.train import train
from transformer.config import TrainConfig, to_dataclass
from transformer.paths import PROJECT_ROOT

if __name__ == "__main__":
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    cli.register_configs()  # the groups' schemas, as the mt-* commands have them
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=sys.argv[2:])
    trainer = train(to_dataclass(TrainConfig, cfg), OmegaConf.to_yaml(cfg))
    params = {k: v.detach().clone().contiguous() for k, v in trainer.model.named_parameters()}
    save_file(params, str(out / f"rank{trainer.dist.rank}.safetensors"))
