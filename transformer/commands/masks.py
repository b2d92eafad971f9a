"""`mt-masks`: the batch, masks and attention of your own sentence pairs, as the model sees
them (also `python -m transformer.commands.masks`).

    mt-masks sentences='[Mi chiamo Luke, "Luke, io sono tuo padre"]' \\
             translations='[My name is Luke, "Luke, I am your father"]'
    mt-masks checkpoint=runs/tatoeba_cpu/checkpoints/best sentences='[Mi chiamo Luke]'
    mt-masks sentences='[Mi chiamo Luke]' translations='[My name is Luke]' tokenizer=data

Prints (1) the batch `collate` makes, (2) the three masks built by masks.py with what
PyTorch's `nn.MultiheadAttention` would need instead, (3) with a checkpoint, a check of
every attention weight against its mask, (4) one query row masked three ways from the
model's real scores, (5) an all-padding row: NaN from a naive softmax, zeros from the
model. Writes a PNG: the attention of one layer (every head and their mean) with masked
cells hatched, or, without a checkpoint, the masks themselves. The library behind it is
`transformer.inspection.mask_inspector`; the text and the picture are made here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from itertools import zip_longest

import hydra
import torch
from omegaconf import DictConfig

from transformer import outputs
from transformer.checkpoint import find_checkpoint
from transformer.commands import cli
from transformer.config import ConfigError, DataConfig, DecodeConfig, check_device, require
from transformer.data.pipeline import prepare_data
from transformer.decoding.ct2_model import is_export, load_export_info
from transformer.decoding.loading import load_for_inference
from transformer.decoding.text import translate_lines
from transformer.inspection.attention_plots import plot_attention_grid, plot_masks
from transformer.inspection.mask_inspector import (
    KIND_NAMES,
    KINDS,
    MASK_FUNCTIONS,
    InspectedBatch,
    WhitespaceTokenizer,
    check_weights,
    empty_row_case,
    find_map,
    make_batch,
    masking_methods,
    model_masks,
    record_attention,
    torch_equivalents,
)
from transformer.model.masks import real_key_mask

TOKENIZERS = ("auto", "whitespace", "data")
MAX_WIDTH = 120  # wider side-by-side matrices are printed one under another


@dataclass
class MasksConfig:
    """The settings of mt-masks (configs/masks.yaml)."""

    sentences: list[str] = field(default_factory=list)
    """Required: Italian sentences, e.g. '[Mi chiamo Luke, Ciao]'."""
    translations: list[str] | None = None
    """Their English translations; null: the checkpoint's model translates them (greedy)."""
    checkpoint: str | None = None
    """A checkpoint directory, or a run directory (its best checkpoint, else its newest);
    null: the batch and masks only, no attention weights."""
    tokenizer: str = "auto"
    """auto (the checkpoint's, else whitespace) | whitespace | data (the data group's
    SentencePiece vocabulary)."""
    output: str | None = "outputs/masks.png"
    """The PNG: the attention grid, or the masks without a checkpoint; null: none."""
    force: bool = False
    """Replace output if an earlier mt-masks wrote it (an existing file is refused otherwise)."""
    sentence: int = 0
    """The pair the picture and parts 4-5 show (from 0)."""
    attention: str = "decoder_self"
    """Part 4's attention: encoder_self | decoder_self | cross."""
    query: int = 1
    """Part 4's query row, a position of the padded batch (from 0)."""
    layer: int = -1
    """The layer of the picture and parts 4-5 (-1: the last)."""
    head: int = 0
    """The head of parts 4-5."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    data: DataConfig = field(default_factory=DataConfig)
    """The data group: the vocabulary of tokenizer=data."""

    def validate(self) -> None:
        require(bool(self.sentences), "sentences", self.sentences,
                "give one or more Italian sentences: sentences='[Mi chiamo Luke, Ciao]'")
        for i, text in enumerate(self.sentences):
            require(bool(text.strip()), f"sentences[{i}]", text, "is empty")
        if self.translations is not None:
            require(len(self.translations) == len(self.sentences), "translations",
                    self.translations, f"need one per sentence ({len(self.sentences)})")
        elif not self.checkpoint:
            raise ConfigError("translations=null: without a checkpoint there is no model to "
                              "translate; give translations='[...]' or checkpoint=DIR")
        require(self.tokenizer in TOKENIZERS, "tokenizer", self.tokenizer,
                f"choose one of {', '.join(TOKENIZERS)}")
        require(not (self.checkpoint and self.tokenizer != "auto"), "tokenizer", self.tokenizer,
                "a checkpoint brings its own tokenizer: leave tokenizer=auto")
        require(self.attention in KINDS, "attention", self.attention,
                f"choose one of {', '.join(KINDS)}")
        require(0 <= self.sentence < len(self.sentences), "sentence", self.sentence,
                f"must index the {len(self.sentences)} sentence(s) (from 0)")
        for name in ("query", "head"):
            require(getattr(self, name) >= 0, name, getattr(self, name), "must be >= 0")
        check_device("device", self.device)
        if self.tokenizer == "data":
            self.data.validate("data")


# --- text --------------------------------------------------------------------------------


def table(corner: str, cols: list[str], rows: list[tuple[str, list[str]]], label_width: int = 0,
          align: str = ">") -> list[str]:
    """Aligned lines: a header of column labels, then one line per (label, cells); cells
    right-aligned (align=">") or centred ("^") under their column labels."""
    width = max(label_width, len(corner), *(len(label) for label, _ in rows))
    widths = [max(len(c), *(len(cells[j]) for _, cells in rows)) for j, c in enumerate(cols)]

    def line(first: str, cells: list[str], how: str) -> str:
        return " ".join([first.ljust(width), *(f"{c:{how}{w}}" for c, w in zip(cells, widths))]).rstrip()

    return [line(corner, cols, ">"), *(line(label, cells, align) for label, cells in rows)]


def side_by_side(blocks: list[list[str]], gap: int = 4) -> list[str]:
    """Blocks of lines next to each other, or one under another if that is too wide."""
    widths = [max(map(len, block)) for block in blocks]
    if sum(widths) + gap * (len(blocks) - 1) > MAX_WIDTH:
        return [line for block in blocks for line in [*block, ""]][:-1]
    rows = zip_longest(*blocks, fillvalue="")
    return [(" " * gap).join(line.ljust(w) for line, w in zip(row, widths)).rstrip() for row in rows]


def ones_and_zeros(mask: torch.Tensor) -> list[str]:
    return ["1" if m else "0" for m in mask.tolist()]


def numbers(values: torch.Tensor, digits: int = 4) -> list[str]:
    return [f"{v:.{digits}f}" for v in values.tolist()]


def format_batch(inspected: InspectedBatch) -> list[str]:
    batch = inspected.batch
    lines = ["1. The batch as the model sees it (batching.collate): the source gets no <s>/</s>;",
             "   tgt_in = <s> + translation, tgt_out = translation + </s> (what the loss predicts);",
             f"   every row is padded to the longest with <pad> (id {batch.pad_id}).",
             f"   src_ids {tuple(batch.src_ids.shape)}, tgt_in_ids {tuple(batch.tgt_in_ids.shape)}, "
             f"tgt_out_ids {tuple(batch.tgt_out_ids.shape)}"]
    lines += [f"   Note: {note}." for note in inspected.notes]
    for b, (src, tgt) in enumerate(zip(inspected.sentences, inspected.translations)):
        lines += ["", f"sentence {b}: {src} -> {tgt}"]
        for name in ("src_ids", "tgt_in_ids", "tgt_out_ids"):
            ids = [str(i) for i in getattr(batch, name)[b].tolist()]
            lines += table(name.removesuffix("_ids"), inspected.pieces(name, b), [(name, ids)], 11)
    return lines


def format_masks(inspected: InspectedBatch, b: int) -> list[str]:
    """The three masks of sentence b as labelled 0/1 matrices (rows queries, columns keys)."""
    masks = model_masks(inspected.batch)
    blocks = []
    for kind in KINDS:
        queries, keys = inspected.query_key_pieces(kind, b)
        title, function = KIND_NAMES[kind], MASK_FUNCTIONS[kind]
        rows = [(q, ones_and_zeros(row)) for q, row in zip(queries, masks[kind][b])]
        blocks.append([title, f"{function} ({len(queries)}x{len(keys)})", *table("", keys, rows, align="^")])
    return side_by_side(blocks)


def format_torch(inspected: InspectedBatch) -> list[str]:
    """PyTorch's masks for the batch beside ours: the opposite polarity."""
    batch, theirs = inspected.batch, torch_equivalents(inspected.batch)
    agree = all(torch.equal(theirs.as_ours()[k], m) for k, m in model_masks(batch).items())
    lines = ["PyTorch's nn.Transformer / nn.MultiheadAttention want, for the same batch, bool masks",
             "whose True means IGNORE (ours, like F.scaled_dot_product_attention's: True = may attend).",
             "Give both masks of a call one type: a bool key padding mask with a float attn_mask is",
             "deprecated."]
    ours_src = real_key_mask(batch.src_ids, batch.pad_id)[:, 0, 0]
    ours_tgt = real_key_mask(batch.tgt_in_ids, batch.pad_id)[:, 0, 0]
    for b in range(len(inspected.sentences)):
        lines += ["", f"sentence {b}"]
        lines += table("", inspected.pieces("src_ids", b), [
            ("ours: real_key_mask(src_ids)", ones_and_zeros(ours_src[b])),
            ("src_key_padding_mask", ones_and_zeros(theirs.src_key_padding_mask[b]))], 34, "^")
        lines += table("", inspected.pieces("tgt_in_ids", b), [
            ("ours: real_key_mask(tgt_in_ids)", ones_and_zeros(ours_tgt[b])),
            ("tgt_key_padding_mask", ones_and_zeros(theirs.tgt_key_padding_mask[b]))], 34, "^")
    t = batch.tgt_in_ids.size(1)
    rows = [(str(i), ones_and_zeros(row)) for i, row in enumerate(theirs.tgt_mask)]
    lines += ["", "tgt_mask, the causal part (query rows, key columns; 1 = ignore):",
              *table("", [str(j) for j in range(t)], rows, align="^"),
              f"As a float mask added to the scores: nn.Transformer.generate_square_subsequent_mask({t}),",
              "-inf where this is 1. Cross-attention takes memory_key_padding_mask = "
              "src_key_padding_mask",
              "and no causal mask.",
              f"Turned into True = may attend, they equal masks.py's masks: {yes(agree)}."]
    return lines


def yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def format_checks(maps) -> list[str]:
    lines = ["3. Attention weights of the model (one teacher-forced pass), every layer and head:"]
    for c in sorted(map(check_weights, maps), key=lambda c: (KINDS.index(c.kind), c.layer)):
        lines.append(f"   {c.kind:<12} layer {c.layer}: {c.masked} masked weights, largest "
                     f"{c.max_masked:g} (exactly 0: {yes(c.max_masked == 0)}); {c.rows} rows sum "
                     f"to 1 (largest error {c.max_row_error:.1e}): {'OK' if c.ok else 'FAILED'}")
    return lines


def format_methods(cfg: MasksConfig, inspected: InspectedBatch, maps) -> list[str]:
    """Part 4: one row of the model's scores masked three ways; a line per key."""
    m = find_map(maps, cfg.attention, cfg.layer)
    queries, keys = inspected.query_key_pieces(cfg.attention, cfg.sentence)
    scores, mask = m.scores[cfg.sentence, cfg.head, cfg.query], m.mask[cfg.sentence, cfg.query]
    methods, model_row = masking_methods(scores, mask), m.weights[cfg.sentence, cfg.head, cfg.query]
    columns = [methods.softmax_then_multiply, methods.multiply_then_softmax, methods.add_neg_inf, model_row]
    rows = [(key, [f"{float(scores[j]):.2f}", "1" if mask[j] else "0", *(f"{float(w[j]):.4f}" for w in columns)])
            for j, key in enumerate(keys)]
    rows.append(("sum", ["", "", *(f"{float(w.sum()):.4f}" for w in columns)]))
    lines = ["4. One query row masked three ways, from the model's real scores (q.k/sqrt(Dh)):",
             f"   {cfg.attention}, layer {m.layer}, head {cfg.head}, sentence {cfg.sentence}, "
             f"query {cfg.query} ({queries[cfg.query]}).",
             "   (a) softmax, then x mask; (b) scores x mask, then softmax;",
             "   (c) scores + -inf where masked, then softmax: the model's way.",
             *table("key", ["score", "mask", "(a)", "(b)", "(c)", "model"], rows)]
    if mask.all():
        return [*lines, "   This row has no masked key, so the three agree: choose another query= to see them differ."]
    kept = float(methods.softmax_then_multiply.sum())
    c_vs_real = float((methods.add_neg_inf - methods.real_keys_only).abs().max())
    c_vs_model = float((methods.add_neg_inf - model_row).abs().max())
    return [*lines,
            f"   (a) sums to {kept:.4f}: the masked keys took {1 - kept:.4f} of the softmax,",
            "       and the real keys keep their unrescaled shares.",
            f"   (b) gives the masked keys {float(methods.multiply_then_softmax[~mask].sum()):.4f}:",
            "       a zeroed score still counts e^0 = 1.",
            f"   (c) is the softmax over the real keys alone (largest difference {c_vs_real:.1e})",
            f"       and the model's own weights (largest difference {c_vs_model:.1e})."]


def format_empty_row(cfg: MasksConfig, inspected: InspectedBatch, model) -> list[str]:
    """Part 5: a naive softmax and the model on a row with no key (the first 6 keys shown)."""
    case = empty_row_case(inspected, model, cfg.layer, cfg.head)
    n, shown = case.mask.numel(), min(case.mask.numel(), 6)
    more = ["..."] if n > shown else []
    if case.layer is not None:
        where = f"layer {case.layer}, head {cfg.head}: the model's own scores and stored weights"
    else:
        where = "no checkpoint: attention.attention_weights on zero scores; any scores give the same"
    lines = ["5. An all-padding row: the batch plus a filler pair with an empty source. Query 0 of its",
             f"   encoder self-attention has none of its {n} keys to attend to",
             f"   ({where}).",
             *table("", ["<pad>"] * shown + more, [
                 ("may attend (mask)", ones_and_zeros(case.mask[:shown]) + more),
                 ("scores", numbers(case.scores[:shown], 2) + more),
                 ("naive softmax(scores + -inf)", numbers(case.naive[:shown]) + more),
                 ("the model (attention.py)", numbers(case.model[:shown]) + more)]),
             f"   naive: NaN at all {n} keys: {yes(bool(case.naive.isnan().all()))}; the model: 0 at all "
             f"{n} keys: {yes(bool((case.model == 0).all()))}.",
             "   A softmax over nothing is 0/0 = NaN, and one NaN poisons the batch (0 x NaN = NaN):",
             "   attention.py opens such a row to every key for the computation, then sets its output",
             "   to exactly zero."]
    if case.logits_finite is not None:
        lines.append(f"   The model's logits for the whole batch, filler included, are finite: "
                     f"{yes(case.logits_finite)}.")
    return lines


# --- the command -------------------------------------------------------------------------


def load_inputs(cfg: MasksConfig):
    """(model or None, tokenizer): the checkpoint's, the data group's, or whitespace words."""
    if cfg.checkpoint and is_export(cfg.checkpoint):
        source = load_export_info(cfg.checkpoint).get("checkpoint", "the checkpoint it was exported from")
        raise ConfigError(f"checkpoint={cfg.checkpoint} is an mt-export (CTranslate2) directory: "
                          "mt-masks reads the attention weights of a PyTorch checkpoint "
                          f"directory; give the one it was exported from ({source})")
    if cfg.checkpoint:
        model, tokenizer, _ = load_for_inference(cfg.checkpoint, cfg.device)
        return model, tokenizer
    if cfg.tokenizer == "data":
        return None, prepare_data(cfg.data).tokenizer
    return None, WhitespaceTokenizer([*cfg.sentences, *cfg.translations])


def check_choices(cfg: MasksConfig, inspected: InspectedBatch, model) -> None:
    """query, head and layer against this batch and this model."""
    batch = inspected.batch
    n = batch.src_ids.size(1) if cfg.attention == "encoder_self" else batch.tgt_in_ids.size(1)
    why = "".join(f"; {note}" for note in inspected.notes)
    require(cfg.query < n, "query", cfg.query,
            f"{cfg.attention} has {n} query rows in this batch (0 to {n - 1}){why}")
    if model is None:
        return
    require(cfg.head < model.cfg.n_heads, "head", cfg.head,
            f"the model has {model.cfg.n_heads} heads (0 to {model.cfg.n_heads - 1})")
    for stack in ("encoder", "decoder"):
        layers = getattr(model.cfg, f"n_{stack}_layers")
        require(-layers <= cfg.layer < layers, "layer", cfg.layer,
                f"the model has {layers} {stack} layers (0 to {layers - 1}, or -1 for the last)")


def describe(cfg: MasksConfig, tokenizer) -> str:
    if cfg.checkpoint:
        tokens = f"the tokenizer of checkpoint {cfg.checkpoint}"
    elif cfg.tokenizer == "data":
        tokens = f"the SentencePiece vocabulary of data={cfg.data.name} ({tokenizer.vocab_size} pieces)"
    else:
        tokens = "whitespace-separated words"
    given = "given" if cfg.translations is not None else "the model's own (greedy)"
    return f"mt-masks: {len(cfg.sentences)} pair(s); tokens: {tokens}; translations: {given}"


def inspect_masks(cfg: MasksConfig) -> None:
    if cfg.checkpoint:  # a run directory: its best checkpoint, else its newest
        cfg = dataclasses.replace(cfg, checkpoint=str(find_checkpoint(cfg.checkpoint)))
    outputs.check_input(cfg.checkpoint, "checkpoint", is_dir=True)
    picture = None
    if cfg.output:  # checked before any work (transformer/outputs.py)
        picture = outputs.Output.of(cfg.output, "output", "mt-masks", force=cfg.force)
        outputs.check(picture, inputs=[cfg.checkpoint])
    model, tokenizer = load_inputs(cfg)
    translations = cfg.translations
    if translations is None:
        translations = translate_lines(model, tokenizer, cfg.sentences,
                                       DecodeConfig(method="greedy", precision="fp32"))
    inspected = make_batch(tokenizer, cfg.sentences, translations,
                           model.cfg.max_positions if model is not None else None)
    check_choices(cfg, inspected, model)
    lines = [describe(cfg, tokenizer), "", *format_batch(inspected), "",
             "2. The masks the model builds (masks.py): rows are queries, columns keys, 1 = may attend.",
             "   Pad query rows stay open: nothing reads their outputs, and every pad is masked as a key."]
    for b in range(len(inspected.sentences)):
        lines += ["", f"sentence {b}", *format_masks(inspected, b)]
    lines += ["", *format_torch(inspected), ""]
    maps = record_attention(model, inspected.batch) if model is not None else None
    if maps is None:
        lines += ["3. Skipped: attention weights need a model (checkpoint=DIR).", "",
                  "4. Skipped: the three masking methods need the model's scores (checkpoint=DIR).", ""]
    else:
        lines += [*format_checks(maps), "", *format_methods(cfg, inspected, maps), ""]
    lines += format_empty_row(cfg, inspected, model)
    if picture is not None:
        with outputs.write_file(picture) as tmp:
            if maps is None:
                plot_masks(inspected, cfg.sentence, tmp)
            else:
                plot_attention_grid(inspected, maps, cfg.sentence, cfg.layer, tmp)
        lines += ["", f"picture of sentence {cfg.sentence}: {picture.path}"]
    print("\n".join(lines), flush=True)


@hydra.main(config_path=cli.CONFIG_PATH, config_name="masks", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    cli.run_command("mt-masks", MasksConfig, cfg, inspect_masks)


def main() -> None:
    """The `mt-masks` console script."""
    cli.hydra_entry("mt-masks", hydra_main, MasksConfig)


if __name__ == "__main__":
    main()
