"""Validation during training: per dev set, loss and perplexity (teacher forcing) and greedy
BLEU, chrF and name-copy rate (`transformer.metrics.name_copy`); and the one score that selects the
best checkpoint (BLEU only: the name-copy rate is reported, never selected on).

With several dev sets (a mix of corpora, `data=europarl_tatoeba`), each is scored on its
own and the selection score is the mean of their BLEU scores, so that no corpus wins
checkpoint selection by its size. With one dev set it is that set's BLEU.

The dev loss is computed as training computes its loss: the batches are collated once, at
construction (numpy, `batching.TokenIds`; pinned on a GPU), copied `non_blocking`, and the
sums stay on the device until one read per dev set.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import datasets
import numpy as np
import sacrebleu
import torch

from transformer.config import ConfigError, DecodeConfig
from transformer.data.batching import Batch, TokenBatchSampler, TokenIds
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.text import translate_lines
from transformer.device import give_back_free_heap
from transformer.metrics.name_copy import NameCopy, name_copy
from transformer.training.loss import batch_loss


def bleu_sample(n_dev: int, n: int | None) -> list[int]:
    """Indices of the dev sentences validation translates: n evenly spaced ones (all when n is
    None or >= n_dev), so a dev file sorted by length is sampled over all its lengths."""
    if n is None or n >= n_dev:
        return list(range(n_dev))
    if n < 1:
        raise ConfigError(f"trainer.val_bleu_sentences={n}: need at least 1 (or null for all)")
    return [i * n_dev // n for i in range(n)]


@dataclass
class DevResult:
    loss: float  # label-smoothed cross-entropy per target token
    nll: float
    ppl: float
    bleu: float
    chrf: float
    names: NameCopy  # on the same sample as BLEU
    examples: list[tuple[str, str, str]]  # (source, reference, hypothesis), the first five


class Validator:
    """Scores a model on every dev set. Batch plans are made at construction, so a dev
    pair that does not fit `val_max_tokens` or the model is refused before training."""

    def __init__(self, devs: dict[str, datasets.Dataset], tokenizer: Tokenizer, decode: DecodeConfig,
                 label_smoothing: float, precision: str, device: torch.device,
                 max_tokens: int, bleu_sentences: int | None, max_positions: int,
                 after_batch: Callable[[], object] | None = None) -> None:
        # dev BLEU decodes in the precision the model trains in (decode.precision auto; on a
        # CPU, auto alone would be fp32, as an export decodes, and slower than bf16:
        # docs/results/precision.md, "Decoding: bf16 against fp32")
        if decode.precision == "auto":
            decode = replace(decode, precision=precision)
        self.devs, self.tokenizer, self.decode = devs, tokenizer, decode
        self.after_batch = after_batch  # called after each batch (training: a HeapTrimmer)
        self.label_smoothing, self.precision, self.device = label_smoothing, precision, device
        self.batches: dict[str, list[Batch]] = {}  # collated once, reused at every validation
        for name, dev in devs.items():
            ids = TokenIds(dev, tokenizer.vocab_size)
            src_lens, tgt_lens = ids.lengths()
            longest = int(max(src_lens.max(), tgt_lens.max())) + 1  # with BOS/EOS
            if longest > max_positions:
                raise ConfigError(f"model.max_positions={max_positions}: the {name} dev set has a "
                                  f"pair of {longest} tokens with BOS/EOS; raise it")
            if longest > max_tokens:
                raise ConfigError(f"trainer.val_max_tokens={max_tokens}: the {name} dev set has a "
                                  f"pair of {longest} tokens with BOS/EOS; raise it")
            plan = TokenBatchSampler(src_lens, tgt_lens, max_tokens=max_tokens, seed=0, shuffle=False).batches(0)
            batches = [ids.collate_rows(plan.rows_of(i), tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
                       for i in range(len(plan))]
            self.batches[name] = [b.pin_memory() for b in batches] if device.type == "cuda" else batches
        self.bleu_index = {name: bleu_sample(len(dev), bleu_sentences) for name, dev in devs.items()}

    @torch.inference_mode()
    def __call__(self, model: torch.nn.Module) -> dict[str, DevResult]:
        """Every dev set's scores (model in eval mode during the call, restored after)."""
        was_training = model.training
        model.eval()
        try:
            return {name: self._score(model, name) for name in self.devs}
        finally:
            model.train(was_training)
            if self.device.type == "cpu":  # training goes on from its own floor, not ours
                give_back_free_heap()

    def _score(self, model: torch.nn.Module, name: str) -> DevResult:
        dev, tok = self.devs[name], self.tokenizer
        sums, n_tokens = torch.zeros(2, dtype=torch.float64, device=self.device), 0
        for batch in self.batches[name]:
            batch = batch.to(self.device, non_blocking=True)
            loss, nll = batch_loss(model, batch, self.label_smoothing, self.precision, self.device)
            sums += torch.stack([loss.double(), nll.double()])
            n_tokens += batch.n_tgt_tokens
            if self.after_batch is not None:
                self.after_batch()
        loss_sum, nll_sum = sums.tolist()  # the one read of the dev loss
        sample = dev.select(self.bleu_index[name])
        src, refs = list(sample["src"]), list(sample["tgt"])
        # resolved at each validation (`settings.decode_settings`): on CUDA the batch is sized
        # to the memory free then, which training's own use changes between validations
        hyps = translate_lines(model, tok, src, self.decode, self.device, after_batch=self.after_batch)
        return DevResult(
            loss=loss_sum / n_tokens, nll=nll_sum / n_tokens,
            ppl=math.exp(min(nll_sum / n_tokens, 50.0)),
            bleu=sacrebleu.corpus_bleu(hyps, [refs]).score,
            chrf=sacrebleu.corpus_chrf(hyps, [refs]).score,
            names=name_copy(src, hyps, refs),
            examples=list(zip(src, refs, hyps))[:5],
        )

    @staticmethod
    def selection_score(results: dict[str, DevResult]) -> float:
        """What picks the best checkpoint: the mean BLEU over the dev sets."""
        return float(np.mean([r.bleu for r in results.values()]))
