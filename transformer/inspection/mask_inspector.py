"""Mask inspector: the batch, masks and attention of real sentence pairs, as the model sees them.

The library behind `mt-masks` (`transformer/commands/masks.py`). Nothing here re-implements the model: the
batch comes from `batching.collate`, the masks from `masks.py`'s functions, the weights
from the model's own `MultiHeadAttention` modules (`store_weights`). This module collects
them and derives what a learner asks about masks:

    inspected = make_batch(tokenizer, ["Mi chiamo Luke"], ["My name is Luke"])
    masks = model_masks(inspected.batch)             # what encode/decode build, per kind
    theirs = torch_equivalents(inspected.batch)      # nn.MultiheadAttention's, True = ignore
    maps = record_attention(model, inspected.batch)  # weights, scores and mask of every module
    checks = [check_weights(m) for m in maps]        # masked weights 0, rows sum to 1
    methods = masking_methods(scores, mask)          # one query row masked three ways
    case = empty_row_case(inspected, model)          # an all-padding row: NaN naively, zeros here

Shapes: B batch, S source len, T target len, H heads, Q query len, K key len
(encoder self-attention: Q = K = S; decoder self-attention: Q = K = T; cross: Q = T, K = S).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from transformer.config import ConfigError
from transformer.data.batching import Batch, collate
from transformer.data.corpus import normalize
from transformer.data.sentences import encode_sources
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer.model.attention import MultiHeadAttention, attention_weights
from transformer.model.masks import src_key_mask, tgt_self_mask

KINDS = ("encoder_self", "decoder_self", "cross")
KIND_NAMES = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
              "cross": "cross-attention"}
MASK_FUNCTIONS = {"encoder_self": "src_key_mask", "decoder_self": "tgt_self_mask",
                  "cross": "src_key_mask"}  # the masks.py function that builds each
ROW_SUM_TOLERANCE = 1e-5  # fp32 sums of a few hundred weights


class WhitespaceTokenizer:
    """Whitespace-separated words as tokens, with the SentencePiece special ids (pad 0, unk 1,
    bos 2, eos 3): a vocabulary made of the given texts, to look at masks without a model."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")

    def __init__(self, texts: Sequence[str]) -> None:
        words = dict.fromkeys(w for text in texts for w in normalize(text).split())
        self._pieces = [*self.SPECIALS, *(w for w in words if w not in self.SPECIALS)]
        self._ids = {piece: i for i, piece in enumerate(self._pieces)}

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[self._ids.get(w, UNK_ID) for w in text.split()] for text in texts]

    def id_to_piece(self, i: int) -> str:
        return self._pieces[int(i)]


@dataclass
class InspectedBatch:
    """Sentence pairs collated into one batch, with the pieces that label its positions."""

    tokenizer: object  # Tokenizer or WhitespaceTokenizer
    sentences: list[str]
    translations: list[str]
    src: list[list[int]]  # ids of each sentence, no BOS/EOS: what collate takes
    tgt: list[list[int]]
    notes: list[str] = field(default_factory=list)  # what was cut or is empty, for the reader
    batch: Batch = field(init=False)  # src_ids (B, S), tgt_in_ids (B, T), tgt_out_ids (B, T)

    def __post_init__(self) -> None:
        tok = self.tokenizer
        examples = [{"src_ids": s, "tgt_ids": t} for s, t in zip(self.src, self.tgt, strict=True)]
        self.batch = collate(examples, tok.pad_id, tok.bos_id, tok.eos_id)

    def pieces(self, name: str, b: int) -> list[str]:
        """Row b of `src_ids`, `tgt_in_ids` or `tgt_out_ids` as pieces, padding included."""
        return [self.tokenizer.id_to_piece(i) for i in getattr(self.batch, name)[b].tolist()]

    def query_key_pieces(self, kind: str, b: int) -> tuple[list[str], list[str]]:
        """The (query, key) labels of one attention's matrix for sentence b."""
        src, tgt = self.pieces("src_ids", b), self.pieces("tgt_in_ids", b)
        return {"encoder_self": (src, src), "decoder_self": (tgt, tgt), "cross": (tgt, src)}[kind]


def make_batch(
    tokenizer, sentences: list[str], translations: list[str], max_positions: int | None = None
) -> InspectedBatch:
    """Encode the pairs as the data pipeline does and collate them into one padded batch.

    max_positions: the model's positional limit; sources are cut to it, targets to max_positions - 1
    (BOS takes a position). Raises ValueError for a sentence without tokens.
    """
    limit = sys.maxsize if max_positions is None else max_positions
    full_src = encode_sources(tokenizer, sentences, sys.maxsize)
    full_tgt = encode_sources(tokenizer, translations, sys.maxsize)
    notes = []
    for i, (s, t) in enumerate(zip(full_src, full_tgt, strict=True)):
        if not s:
            raise ConfigError(f"sentences[{i}]={sentences[i]!r} has no tokens")
        if len(s) > limit:
            notes.append(f"sentence {i}: its {len(s)} source tokens were cut to the first {limit}, "
                         f"the rows of the model's positional table (model.max_positions)")
        if len(t) > limit - 1:
            notes.append(f"sentence {i}: its {len(t)} target tokens were cut to the first {limit - 1} "
                         "(<s> takes a position)")
        if not t:
            notes.append(f"sentence {i}: the translation is empty, so the target is <s> alone")
    return InspectedBatch(tokenizer, list(sentences), list(translations),
                          [s[:limit] for s in full_src], [t[: limit - 1] for t in full_tgt], notes)


def with_filler_pair(inspected: InspectedBatch) -> InspectedBatch:
    """The same batch plus a last pair with an empty source and target, as a filler row: its
    source row is all padding, so no query of its encoder self-attention has a key."""
    return InspectedBatch(inspected.tokenizer, [*inspected.sentences, ""],
                          [*inspected.translations, ""], [*inspected.src, []], [*inspected.tgt, []],
                          inspected.notes)


def model_masks(batch: Batch) -> dict[str, torch.Tensor]:
    """The three masks `Transformer.encode`/`decode` build for this batch, by masks.py's own
    functions, broadcast to the (B, Q, K) matrices one head sees (True = may attend)."""
    b, s = batch.src_ids.shape
    t = batch.tgt_in_ids.size(1)
    src_mask = src_key_mask(batch.src_ids, batch.pad_id)  # (B, 1, 1, S)
    return {
        "encoder_self": src_mask.expand(b, 1, s, s)[:, 0],
        "decoder_self": tgt_self_mask(batch.tgt_in_ids, batch.pad_id)[:, 0],  # (B, T, T)
        "cross": src_mask.expand(b, 1, t, s)[:, 0],  # the source key mask again: no triangle
    }


@dataclass
class TorchMasks:
    """What `nn.Transformer` / `nn.MultiheadAttention` take for the same batch: bool masks
    whose True means IGNORE this key, the opposite of ours (and of the bool `attn_mask` of
    `F.scaled_dot_product_attention`, which is ours). One type per call: PyTorch deprecates
    a bool key padding mask beside a float attn_mask."""

    src_key_padding_mask: torch.Tensor  # (B, S) bool; memory_key_padding_mask is the same
    tgt_key_padding_mask: torch.Tensor  # (B, T) bool
    tgt_mask: torch.Tensor  # (T, T) bool: the causal part, True above the diagonal

    @property
    def float_tgt_mask(self) -> torch.Tensor:
        """The causal part as a float mask added to the scores, (T, T): 0 or -inf, what
        `nn.Transformer.generate_square_subsequent_mask` returns."""
        return torch.zeros(self.tgt_mask.shape).masked_fill(self.tgt_mask, float("-inf"))

    def as_ours(self) -> dict[str, torch.Tensor]:
        """Their masks turned into ours, (B, Q, K) True = may attend, per kind: what
        `nn.MultiheadAttention` lets each query read, given these arguments."""
        b, s = self.src_key_padding_mask.shape
        t = self.tgt_key_padding_mask.size(1)
        src_keys = ~self.src_key_padding_mask[:, None, :]  # (B, 1, S)
        return {
            "encoder_self": src_keys.expand(b, s, s),
            "decoder_self": ~self.tgt_mask & ~self.tgt_key_padding_mask[:, None, :],
            "cross": src_keys.expand(b, t, s),
        }


def torch_equivalents(batch: Batch) -> TorchMasks:
    """PyTorch's masks for the batch: padding where the ids are pad_id, the future above
    the diagonal."""
    t = batch.tgt_in_ids.size(1)
    return TorchMasks(
        src_key_padding_mask=batch.src_ids == batch.pad_id,
        tgt_key_padding_mask=batch.tgt_in_ids == batch.pad_id,
        tgt_mask=torch.ones(t, t, dtype=torch.bool).triu(1),
    )


@dataclass
class AttentionMap:
    """One attention module's view of a batch, from one teacher-forced forward pass."""

    kind: str  # encoder_self | decoder_self | cross
    layer: int  # counted from 0
    weights: torch.Tensor  # (B, H, Q, K): the module's own softmax (store_weights)
    scores: torch.Tensor  # (B, H, Q, K): q k^T / sqrt(Dh), before masking
    mask: torch.Tensor  # (B, Q, K) bool: the mask the model handed the module, broadcast


def attention_modules(model) -> list[tuple[str, int, MultiHeadAttention]]:
    """(kind, layer, module) for every attention module, encoder first."""
    found = [("encoder_self", i, layer.self_attn) for i, layer in enumerate(model.encoder_layers)]
    for i, layer in enumerate(model.decoder_layers):
        found += [("decoder_self", i, layer.self_attn), ("cross", i, layer.cross_attn)]
    return found


def _scores(module: MultiHeadAttention, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """The module's scores for queries x (B, Q, D) and keys kv (B, K, D) -> (B, H, Q, K):
    its own projections and head split, the product of `attention.attention_weights`."""
    q, k = module._heads(module.q_proj(x)), module._heads(module.k_proj(kv))
    return q @ k.transpose(-2, -1) / q.size(-1) ** 0.5


@torch.no_grad()
def record_attention(model, batch: Batch) -> list[AttentionMap]:
    """Run the model once on the batch (teacher forcing, eval mode, no autocast) and keep,
    for every attention module, its weights, its scores and the mask it was given."""
    modules = attention_modules(model)
    inputs: dict[int, tuple] = {}

    def keep_inputs(index: int):
        def hook(module, args):  # args: x, kv, mask
            inputs[index] = args[:3]
        return hook

    hooks = [module.register_forward_pre_hook(keep_inputs(i)) for i, (*_, module) in enumerate(modules)]
    was_training = model.training
    device = next(model.parameters()).device
    try:
        model.eval()
        for *_, module in modules:
            module.store_weights = True
        model(batch.src_ids.to(device), batch.tgt_in_ids.to(device))
        maps = []
        for i, (kind, layer, module) in enumerate(modules):
            x, kv, mask = inputs[i]
            w = module.weights
            maps.append(AttentionMap(kind, layer, w.float().cpu(), _scores(module, x, kv).float().cpu(),
                                     mask.expand(w.size(0), 1, w.size(2), w.size(3))[:, 0].cpu()))
    finally:
        for hook in hooks:
            hook.remove()
        for *_, module in modules:
            module.store_weights, module.weights = False, None
        model.train(was_training)
    return maps


@torch.no_grad()
def _logits(model, batch: Batch) -> torch.Tensor:
    """The model's (B, T, V) logits for the batch, in eval mode."""
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    try:
        return model(batch.src_ids.to(device), batch.tgt_in_ids.to(device))
    finally:
        model.train(was_training)


def find_map(maps: list[AttentionMap], kind: str, layer: int) -> AttentionMap:
    """The map of `kind` at `layer` (negative: from the last layer of that stack)."""
    of_kind = [m for m in maps if m.kind == kind]
    if not -len(of_kind) <= layer < len(of_kind):
        raise ConfigError(f"layer={layer}: the model has {len(of_kind)} layers with {kind} attention")
    return of_kind[layer]


@dataclass
class WeightCheck:
    """Are the weights of one module what the mask says? Over all heads and rows."""

    kind: str
    layer: int
    masked: int  # masked (query, key) cells
    max_masked: float  # the largest weight on a masked key: must be exactly 0
    rows: int  # rows with a key to attend to (pad queries included: they attend normally)
    max_row_error: float  # max |sum of a row - 1| over those rows

    @property
    def ok(self) -> bool:
        return self.max_masked == 0.0 and self.max_row_error <= ROW_SUM_TOLERANCE


def check_weights(m: AttentionMap) -> WeightCheck:
    allowed = m.mask[:, None].expand_as(m.weights)  # (B, H, Q, K)
    has_key = allowed.any(-1)  # (B, H, Q)
    masked = m.weights[~allowed]
    row_error = (m.weights.sum(-1)[has_key] - 1).abs()
    return WeightCheck(m.kind, m.layer, masked.numel(),
                       float(masked.abs().max()) if masked.numel() else 0.0,
                       int(has_key.sum()), float(row_error.max()) if row_error.numel() else 0.0)


@dataclass
class MaskingMethods:
    """One query row masked the three ways one meets (docs/masks.md, "Why add −∞ to the
    scores"): weights (K,)."""

    scores: torch.Tensor  # (K,)
    mask: torch.Tensor  # (K,) bool, True = may attend
    softmax_then_multiply: torch.Tensor  # softmax(scores) * mask: the masked keys took their share
    multiply_then_softmax: torch.Tensor  # softmax(scores * mask): a zeroed score still gets e^0
    add_neg_inf: torch.Tensor  # softmax(scores + -inf where masked): the model's way

    @property
    def real_keys_only(self) -> torch.Tensor:
        """The softmax over the real keys alone, zeros elsewhere: what masking should give."""
        out = torch.zeros_like(self.scores)
        out[self.mask] = self.scores[self.mask].softmax(-1)
        return out


def masking_methods(scores: torch.Tensor, mask: torch.Tensor) -> MaskingMethods:
    """scores (K,), mask (K,) bool -> the three maskings of that row."""
    keep = mask.to(scores.dtype)
    return MaskingMethods(
        scores, mask,
        softmax_then_multiply=scores.softmax(-1) * keep,
        multiply_then_softmax=(scores * keep).softmax(-1),
        add_neg_inf=scores.masked_fill(~mask, float("-inf")).softmax(-1),
    )


@dataclass
class EmptyRowCase:
    """Query 0 of the encoder self-attention of an all-padding source row: no key at all."""

    mask: torch.Tensor  # (S,) bool, all False
    scores: torch.Tensor  # (S,) the model's scores, or zeros without a model
    naive: torch.Tensor  # (S,) softmax(scores + -inf where masked): 0/0 = NaN
    model: torch.Tensor  # (S,) what attention.py gives: zeros
    layer: int | None  # the encoder layer of the model's weights; None: attention_weights on zeros
    logits_finite: bool | None  # the model's logits for the whole batch, filler included


def empty_row_case(
    inspected: InspectedBatch, model=None, layer: int = -1, head: int = 0
) -> EmptyRowCase:
    """Append a filler pair with an empty source and compare a naive softmax with the model.

    Without a model, `attention.attention_weights` is applied to the filler's mask with
    zero scores: an empty row's result does not depend on the scores.
    """
    filled = with_filler_pair(inspected)
    b = len(filled.sentences) - 1
    mask = model_masks(filled.batch)["encoder_self"][b, 0]  # (S,)
    logits_finite, found_layer = None, None
    if model is None:
        s = mask.numel()
        scores = torch.zeros(s)
        got = attention_weights(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, s, 1), mask.view(1, 1, 1, s))[0, 0, 0]
    else:
        m = find_map(record_attention(model, filled.batch), "encoder_self", layer)
        scores, got, found_layer = m.scores[b, head, 0], m.weights[b, head, 0], m.layer
        logits_finite = bool(torch.isfinite(_logits(model, filled.batch)).all())
    naive = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return EmptyRowCase(mask, scores, naive, got, found_layer, logits_finite)
