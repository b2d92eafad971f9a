"""`mt-train`: Hydra entry point of training (also `python -m transformer.train`).

    mt-train experiment=tatoeba_cpu
    mt-train model=base trainer.precision=bf16 optim.lr=7e-4
    torchrun --nproc_per_node=2 -m transformer.train experiment=iwslt2017_base
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from transformer import checkpoint as ckpt
from transformer.config import TrainConfig, to_dataclass
from transformer.corpus import PROJECT_ROOT
from transformer.data import prepare_data
from transformer.model import build_model, count_parameters
from transformer.runtime import (
    check_precision,
    enable_fast_cuda_math,
    keep_large_blocks_in_the_heap,
    seed_everything,
    setup_distributed,
    setup_logging,
)
from transformer.trainer import Trainer

log = logging.getLogger(__name__)


def find_resume_point(run_dir: Path, resume: str) -> Path | None:
    """`auto`: the newest complete step checkpoint of run_dir; `never`; or a path."""
    if resume == "never":
        return None
    if resume == "auto":
        found = ckpt.step_checkpoints(run_dir)
        return found[-1] if found else None
    return Path(resume)


def train(cfg: TrainConfig, run_config_yaml: str) -> Trainer:
    """Run training as described by cfg; returns the trainer (its model and final state)."""
    dist_info, device = setup_distributed(cfg.trainer.device)
    run_dir = Path(cfg.trainer.run_dir)
    setup_logging(run_dir / "train.log", dist_info.is_main)
    check_precision(cfg.trainer.precision, device)
    if device.type == "cuda":
        enable_fast_cuda_math()
    else:
        keep_large_blocks_in_the_heap()
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
    if dist_info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(run_config_yaml)
    # Rank 0 builds the vocabulary and encoded corpus first; the others then hit its cache.
    if not dist_info.is_main:
        dist.barrier()
    data = prepare_data(cfg.data)
    if dist_info.is_main and dist_info.world_size > 1:
        dist.barrier()
    tok = data.tokenizer
    model_cfg = dataclasses.replace(cfg.model, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                                    bos_id=tok.bos_id, eos_id=tok.eos_id)
    seed_everything(cfg.trainer.seed)  # the same initial weights on every rank
    model = build_model(model_cfg).to(device)
    log.info("model: %s parameters, %s", f"{count_parameters(model):,}", model_cfg)
    log.info("data: %d training pairs, %d dev pairs, vocabulary %d", len(data.train),
             len(data.dev), tok.vocab_size)
    trainer = Trainer(dataclasses.replace(cfg, model=model_cfg), run_config_yaml, data, model,
                      device, dist_info)
    resume_from = find_resume_point(run_dir, cfg.trainer.resume)
    if resume_from is not None:
        trainer.load_state(resume_from)
    state = trainer.fit()
    log.info("finished at step %d (epoch %d); best dev BLEU %.2f; %d skipped steps",
             state.step, state.epoch, state.best_bleu, state.skipped_steps)
    if dist.is_initialized():
        dist.destroy_process_group()
    return trainer


@hydra.main(config_path=str(PROJECT_ROOT / "configs"), config_name="train", version_base="1.3")
def main(hydra_cfg: DictConfig) -> None:
    cfg = to_dataclass(TrainConfig, hydra_cfg)
    train(cfg, OmegaConf.to_yaml(hydra_cfg, resolve=True))


if __name__ == "__main__":
    main()
