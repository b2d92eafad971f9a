"""Attention heatmaps: where the decoder looked in the source for each output piece
(`cross_attention`, `plot_alignment`), and the masks and attention of a batch, one layer
at a time (`plot_masks`, `plot_attention_grid`: the pictures of `mt-masks`).

Shapes: H heads, S source pieces, T target pieces (the output tokens plus EOS).

`cross_attention` translates the sentence greedily, then re-runs the decoder once over
BOS + the translation with the chosen layer's cross-attention weights kept (equal to what
the cached search saw, step by step, as the search tests check cached = full decoding).
Row t of the picture is the attention while predicting output piece t. The `mt-masks`
pictures draw a batch as `mask_inspector` collects it: masked cells grey and hatched.
Matplotlib's object API with the Agg canvas: no display, no global pyplot state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from transformer.config import ConfigError
from transformer.data.sentences import encode_sources
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.search import greedy_search
from transformer.inspection.mask_inspector import (
    KIND_NAMES,
    KINDS,
    MASK_FUNCTIONS,
    AttentionMap,
    InspectedBatch,
    find_map,
    model_masks,
)


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
        raise ConfigError(f"layer={layer}, but the model has {n_layers} decoder layers")
    layer %= n_layers
    device = next(model.parameters()).device
    src = encode_sources(tokenizer, [sentence], model.cfg.max_positions)[0]
    if not src:
        raise ConfigError("nothing to translate: the sentence is empty")
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
    return _save(fig, path)


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _panel(ax, values: np.ndarray, allowed: np.ndarray, rows: list[str], cols: list[str],
           title: str, row_labels: bool = True):
    """One (Q, K) matrix: values on a 0-1 scale, masked cells grey and hatched."""
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="#d4d4d4")
    image = ax.imshow(np.ma.masked_array(values, mask=~allowed), cmap=cmap, vmin=0.0, vmax=1.0)
    runs = []  # one rectangle per run of masked cells in a row: a patch per cell draws slowly
    for i, row in enumerate(~allowed):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(int), [0]])))
        runs += [Rectangle((start - 0.5, i - 0.5), stop - start, 1)
                 for start, stop in zip(edges[::2], edges[1::2])]
    ax.add_collection(PatchCollection(runs, facecolor="none", edgecolor="#7a7a7a", hatch="////",
                                      linewidth=0))
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), rows if row_labels else [], fontsize=7)
    ax.set_title(title, fontsize=8)
    return image


def _figure(inspected: InspectedBatch, n_rows: int, n_cols: int) -> Figure:
    side = 1.0 + 0.15 * max(inspected.batch.src_ids.size(1), inspected.batch.tgt_in_ids.size(1))
    return Figure(figsize=(n_cols * side + 1.0, n_rows * side + 0.6), dpi=110, layout="constrained")


def plot_masks(inspected: InspectedBatch, b: int, path: str | Path) -> Path:
    """Sentence b's three masks (no model: no weights), 1 = may attend, masked cells hatched."""
    fig = _figure(inspected, 1, 3)
    masks = model_masks(inspected.batch)
    for ax, kind in zip(fig.subplots(1, 3), KINDS):
        allowed = masks[kind][b].numpy()
        _panel(ax, allowed.astype(float), allowed, *inspected.query_key_pieces(kind, b),
               f"{KIND_NAMES[kind]}: {MASK_FUNCTIONS[kind]}")
    fig.suptitle(f"{inspected.sentences[b]} -> {inspected.translations[b]}\n"
                 "masks (blue: may attend, hatched: masked)", fontsize=9)
    return _save(fig, path)


def plot_attention_grid(
    inspected: InspectedBatch, maps: list[AttentionMap], b: int, layer: int, path: str | Path
) -> Path:
    """One layer's attention for sentence b: a row per kind, a column per head and their mean."""
    n_heads = maps[0].weights.size(1)
    fig = _figure(inspected, 3, n_heads + 1)
    axes = fig.subplots(3, n_heads + 1, squeeze=False)
    for r, kind in enumerate(KINDS):
        m = find_map(maps, kind, layer)
        allowed = m.mask[b].numpy()
        for c in range(n_heads + 1):
            w = m.weights[b, c] if c < n_heads else m.weights[b].mean(0)
            title = (f"head {c}" if c < n_heads else "mean over heads") if r == 0 else ""
            image = _panel(axes[r, c], w.numpy(), allowed, *inspected.query_key_pieces(kind, b),
                           title, row_labels=c == 0)
        axes[r, 0].set_ylabel(KIND_NAMES[kind], fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.5, pad=0.01, label="attention weight")
    fig.suptitle(f"{inspected.sentences[b]} -> {inspected.translations[b]}: layer {m.layer}, "
                 "rows are queries, columns keys (hatched: masked, weight exactly 0)", fontsize=9)
    return _save(fig, path)
