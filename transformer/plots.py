"""Cross-attention heatmaps: where the decoder looked in the source for each output piece.

Shapes: H heads, S source pieces, T target pieces (the output tokens plus EOS).

The sentence is translated greedily, then the decoder is re-run once over BOS + the
translation with the chosen layer's cross-attention weights kept (equal to what the
cached search saw, step by step, as the search tests check cached = full decoding).
Row t of the picture is the attention while predicting output piece t.
Matplotlib's object API with the Agg canvas: no display, no global pyplot state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.figure import Figure

from transformer.decoding import encode_sources
from transformer.search import greedy_search
from transformer.tokenizer import Tokenizer


@dataclass
class Alignment:
    src_pieces: list[str]  # S
    tgt_pieces: list[str]  # T (the last one is EOS)
    weights: torch.Tensor  # (T, S), rows sum to 1
    translation: str
    layer: int  # the decoder layer, counted from 0


@torch.inference_mode()
def cross_attention(
    model, tokenizer: Tokenizer, sentence: str, layer: int = -1,
    max_len_a: float = 1.2, max_len_b: int = 10,
) -> Alignment:
    """Greedy translation of `sentence` and the head-averaged cross-attention of `layer`."""
    model.eval()
    n_layers = len(model.decoder_layers)
    if not -n_layers <= layer < n_layers:
        raise ValueError(f"layer={layer}, but the model has {n_layers} decoder layers")
    layer %= n_layers
    device = next(model.parameters()).device
    src = encode_sources(tokenizer, [sentence], model.cfg.max_len)[0]
    if not src:
        raise ValueError("nothing to translate: the sentence is empty")
    src_ids = torch.tensor([src], device=device)  # (1, S)
    hyp = greedy_search(model, src_ids, max_len_a, max_len_b)[0]
    tgt_in_ids = torch.tensor([[model.cfg.bos_id, *hyp.tokens]], device=device)  # (1, T)
    attn = model.decoder_layers[layer].cross_attn
    attn.store_weights = True
    try:
        model.decode(tgt_in_ids, model.encode(src_ids), src_ids)
        weights = attn.weights[0].float().mean(dim=0).cpu()  # (H, T, S) -> (T, S)
    finally:
        attn.store_weights, attn.weights = False, None
    return Alignment(
        src_pieces=[tokenizer.id_to_piece(i) for i in src],
        tgt_pieces=[tokenizer.id_to_piece(i) for i in [*hyp.tokens, model.cfg.eos_id]],
        weights=weights,
        translation=tokenizer.decode([hyp.tokens])[0],
        layer=layer,
    )


def plot_alignment(alignment: Alignment, path: str | Path, title: str | None = None) -> Path:
    """Write the heatmap (source pieces across, target pieces down) as a PNG."""
    n_tgt, n_src = alignment.weights.shape
    fig = Figure(figsize=(min(2.5 + 0.42 * n_src, 30), min(1.8 + 0.38 * n_tgt, 30)), dpi=120)
    ax = fig.add_subplot()
    image = ax.imshow(alignment.weights.numpy(), cmap="Blues", vmin=0.0, aspect="auto")
    ax.set_xticks(range(n_src), alignment.src_pieces, rotation=60, ha="right",
                  rotation_mode="anchor")
    ax.set_yticks(range(n_tgt), alignment.tgt_pieces)
    ax.set_xlabel("source pieces")
    ax.set_ylabel("output pieces")
    ax.set_title(title or f"cross-attention, decoder layer {alignment.layer}, mean over heads",
                 fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
