"""mt-masks (inspection/mask_inspector.py, commands/masks.py): the manual's masks (docs/masks.md) are what the command
prints and what masks.py builds; recorded weights obey their masks; the three maskings and
the empty row behave as docs/masks.md says; PyTorch's masks are the opposite polarity; the
command runs with and without a checkpoint and refuses a mistake in one line.

Shapes: B batch, H heads, Q query len, K key len, S source len, T target len.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from transformer.checkpoint import load_model
from transformer.commands import masks as masks_command
from transformer.config import ConfigError, to_dataclass
from transformer.inspection.mask_inspector import (
    KINDS,
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
from transformer.model.attention import MultiHeadAttention
from transformer.model.masks import real_key_mask
from transformer.paths import PROJECT_ROOT

from helpers import compose_cfg, tiny_checkpoint

SAMPLE = PROJECT_ROOT / "data" / "sample"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Two pairs of different lengths on both sides, so the first one is padded.
SENTENCES = ["Mi chiamo Luke", "Luke, io sono tuo padre"]
TRANSLATIONS = ["My name is Luke", "Luke, I am your father"]
PAIRS = ["sentences=[Mi chiamo Luke, \"Luke, io sono tuo padre\"]",
         "translations=[My name is Luke, \"Luke, I am your father\"]"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A random tiny model (2 heads, 2+2 layers) with a vocabulary trained on data/sample."""
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "best", d_model=16, n_heads=2, d_ff=32)


@pytest.fixture(scope="module")
def recorded(checkpoint):
    """(model, inspected batch, attention maps) of the two pairs on the tiny model."""
    model, tokenizer = load_model(checkpoint)
    inspected = make_batch(tokenizer, SENTENCES, TRANSLATIONS, model.cfg.max_positions)
    return model, inspected, record_attention(model, inspected.batch)


def mt_masks(monkeypatch, capsys, *args: str) -> str:
    """Run the mt-masks console script in this process; returns what it printed."""
    monkeypatch.setattr(sys, "argv", ["mt-masks", *args])
    masks_command.main()
    return capsys.readouterr().out


# --- the manual -----------------------------------------------------------------------------


def readme_example() -> tuple[list[str], str]:
    """The mt-masks command of the manual's "Which mask goes where" (docs/masks.md) and the
    block after it."""
    text = (PROJECT_ROOT / "docs" / "masks.md").read_text(encoding="utf-8")
    section = text[text.index("## Which mask goes where"):]
    match = re.search(r"```bash\n(.*?)```\s*```\n(.*?)```", section, flags=re.DOTALL)
    args = shlex.split(match.group(1).replace("\\\n", " "))
    assert args[0] == "mt-masks"
    return args[1:], match.group(2)


def parse_drawn(block: str) -> dict[str, tuple[list[str], list[str], torch.Tensor]]:
    """docs/masks.md's side-by-side matrices ("Which mask goes where"): per kind, (query
    labels, key labels, (Q, K) bool)."""
    lines = block.splitlines()
    starts = [lines[0].index(title) for title in ("encoder", "decoder", "cross")]
    parsed = {}
    for kind, start, end in zip(KINDS, starts, [*starts[1:], None]):
        part = [line[start:end].split() for line in lines[2:]]
        keys, rows = part[0], [row for row in part[1:] if row]
        parsed[kind] = ([row[0] for row in rows], keys,
                        torch.tensor([[v == "1" for v in row[1:]] for row in rows]))
    return parsed


def test_the_readme_block_is_what_mt_masks_prints(monkeypatch, capsys, tmp_path):
    args, block = readme_example()
    monkeypatch.chdir(tmp_path)
    assert block in mt_masks(monkeypatch, capsys, *args, "output=null")


def test_the_readme_matrices_are_masks_py_masks_of_the_batch_the_model_sees():
    args, block = readme_example()
    cfg = to_dataclass(masks_command.MasksConfig, compose_cfg(*args, config="masks"))
    tokenizer = WhitespaceTokenizer([*cfg.sentences, *cfg.translations])
    inspected = make_batch(tokenizer, cfg.sentences, cfg.translations)
    masks = model_masks(inspected.batch)  # src_key_mask and tgt_self_mask of the ids
    for kind, (queries, keys, drawn) in parse_drawn(block).items():
        assert (queries, keys) == inspected.query_key_pieces(kind, 0), kind
        assert torch.equal(drawn, masks[kind][0]), kind
    src, tgt_in = inspected.pieces("src_ids", 0), inspected.pieces("tgt_in_ids", 0)
    assert "<s>" not in src and "</s>" not in src  # the model's source has neither
    assert tgt_in[0] == "<s>" and "</s>" not in tgt_in


# --- the attention the model records --------------------------------------------------------


def test_masked_weights_are_exactly_zero_and_rows_sum_to_one(recorded):
    model, inspected, maps = recorded
    assert len(maps) == model.cfg.n_encoder_layers + 2 * model.cfg.n_decoder_layers
    masks = model_masks(inspected.batch)
    for m in maps:
        assert torch.equal(m.mask, masks[m.kind]), "the model hands its modules masks.py's masks"
        allowed = m.mask[:, None].expand_as(m.weights)  # (B, H, Q, K)
        assert torch.all(m.weights[~allowed] == 0) and torch.all(m.weights[allowed] > 0)
        torch.testing.assert_close(m.weights.sum(-1), torch.ones(m.weights.shape[:3]))
        assert check_weights(m).ok and check_weights(m).max_masked == 0.0
        # The scores are the module's own: masking them gives its stored weights back.
        masked = m.scores.masked_fill(~allowed, float("-inf"))
        torch.testing.assert_close(masked.softmax(-1), m.weights, atol=1e-6, rtol=0)


def test_recording_leaves_the_model_as_it_was(recorded):
    model, inspected, _ = recorded
    model.train()
    record_attention(model, inspected.batch)
    assert model.training
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            assert not module.store_weights and module.weights is None
            assert not module._forward_pre_hooks


# --- the three maskings and the empty row ---------------------------------------------------


def test_the_three_maskings_of_a_real_row(recorded):
    _, _, maps = recorded
    m = find_map(maps, "decoder_self", -1)
    scores, mask = m.scores[0, 0, 1], m.mask[0, 1]  # the decoder at "My": the future is masked
    assert mask.sum() == 2 and not mask.all()
    methods = masking_methods(scores, mask)
    softmax = scores.softmax(-1)
    # (a) the masked keys had weight, and multiplying after the softmax does not give it back
    a = methods.softmax_then_multiply
    assert torch.equal(a[mask], softmax[mask]) and torch.all(a[~mask] == 0)
    torch.testing.assert_close(a.sum(), 1 - softmax[~mask].sum())
    assert a.sum() < 1 - 1e-3
    # (b) a zeroed score still counts e^0 = 1: every masked key gets the same positive weight
    b = methods.multiply_then_softmax
    torch.testing.assert_close(b.sum(), torch.tensor(1.0))
    assert torch.all(b[~mask] > 0)
    torch.testing.assert_close(b[~mask], torch.full_like(b[~mask], 1 / (scores * mask).exp().sum()))
    # (c) exactly the softmax over the real keys, and what the model computed
    c = methods.add_neg_inf
    assert torch.all(c[~mask] == 0)
    torch.testing.assert_close(c, methods.real_keys_only, atol=1e-7, rtol=0)
    torch.testing.assert_close(c, m.weights[0, 0, 1], atol=1e-6, rtol=0)


def test_the_printed_table_holds_each_method_and_its_sum(recorded):
    _, inspected, maps = recorded
    cfg = masks_command.MasksConfig(sentences=SENTENCES, translations=TRANSLATIONS, query=1)
    lines = masks_command.format_methods(cfg, inspected, maps)
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["key", "score"])
    m = find_map(maps, "decoder_self", -1)
    methods = masking_methods(m.scores[0, 0, 1], m.mask[0, 1])
    columns = [methods.softmax_then_multiply, methods.multiply_then_softmax, methods.add_neg_inf,
               m.weights[0, 0, 1]]
    keys = inspected.pieces("tgt_in_ids", 0)
    rows = [line.split() for line in lines[start + 1 : start + 2 + len(keys)]]
    for j, (key, row) in enumerate(zip(keys, rows)):
        assert row[0] == key and row[2] == ("1" if m.mask[0, 1, j] else "0")
        assert [float(v) for v in row[3:]] == pytest.approx([float(w[j]) for w in columns], abs=6e-5)
    assert rows[-1][0] == "sum"
    assert [float(v) for v in rows[-1][1:]] == pytest.approx([float(w.sum()) for w in columns], abs=6e-5)
    assert float(rows[-1][1]) < 0.999 and float(rows[-1][2]) == pytest.approx(1.0)


def test_an_empty_row_is_nan_naively_and_zeros_in_the_model(recorded):
    model, inspected, _ = recorded
    for case in (empty_row_case(inspected, model, layer=0, head=1), empty_row_case(inspected)):
        assert not case.mask.any()
        assert torch.isfinite(case.scores).all()
        assert torch.isnan(case.naive).all()
        assert torch.equal(case.model, torch.zeros_like(case.model))
    assert case.logits_finite is None
    assert empty_row_case(inspected, model).logits_finite


# --- PyTorch's masks -----------------------------------------------------------------------


def test_pytorchs_masks_are_the_opposite_polarity_and_allow_the_same_keys():
    inspected = make_batch(WhitespaceTokenizer(SENTENCES + TRANSLATIONS), SENTENCES, TRANSLATIONS)
    batch, theirs = inspected.batch, torch_equivalents(inspected.batch)
    ours = real_key_mask(batch.src_ids, batch.pad_id)[:, 0, 0]
    assert torch.equal(theirs.src_key_padding_mask, ~ours)
    assert torch.equal(theirs.float_tgt_mask, nn.Transformer.generate_square_subsequent_mask(6))
    for kind, mask in model_masks(batch).items():
        assert torch.equal(theirs.as_ours()[kind], mask), kind
    # nn.MultiheadAttention itself, given their masks, reads exactly the keys ours allow.
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    b, s, t = len(inspected.sentences), batch.src_ids.size(1), batch.tgt_in_ids.size(1)
    args = {"encoder_self": (s, s, theirs.src_key_padding_mask, None),
            "decoder_self": (t, t, theirs.tgt_key_padding_mask, theirs.tgt_mask),
            "cross": (t, s, theirs.src_key_padding_mask, None)}
    for kind, (q_len, k_len, padding, causal) in args.items():
        x, kv = torch.randn(b, q_len, 8), torch.randn(b, k_len, 8)
        _, w = attn(x, kv, kv, key_padding_mask=padding, attn_mask=causal, average_attn_weights=False)
        allowed = model_masks(batch)[kind][:, None].expand_as(w)
        assert torch.all(w[~allowed] == 0) and torch.all(w[allowed] > 0), kind
    # Ours handed over as their key_padding_mask: the real tokens are ignored, the pads read.
    _, w = attn(torch.randn(b, s, 8), torch.randn(b, s, 8), torch.randn(b, s, 8),
                key_padding_mask=ours, average_attn_weights=False)
    assert torch.all(w[0, ..., :3] == 0) and torch.all(w[0, ..., 3:] > 0)


# --- the command ---------------------------------------------------------------------------


def test_mt_masks_without_a_checkpoint_prints_the_masks_and_draws_them(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    out = mt_masks(monkeypatch, capsys, *PAIRS, "output=masks.png")
    assert "tokens: whitespace-separated words" in out
    assert "src_ids (2, 5), tgt_in_ids (2, 6), tgt_out_ids (2, 6)" in out
    assert "they equal masks.py's masks: yes" in out
    assert "3. Skipped" in out and "4. Skipped" in out
    assert "naive: NaN at all 5 keys: yes; the model: 0 at all 5 keys: yes" in out
    assert (tmp_path / "masks.png").read_bytes().startswith(PNG_MAGIC)


def test_mt_masks_with_a_checkpoint_translates_checks_and_draws(checkpoint, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    out = mt_masks(monkeypatch, capsys, f"checkpoint={checkpoint}", PAIRS[0], "output=grid.png",
                   "attention=cross", "query=0", "layer=0", "head=1")
    assert "translations: the model's own (greedy)" in out
    checks = [line for line in out.splitlines() if "masked weights" in line]
    assert len(checks) == 6 and all(line.endswith(": OK") for line in checks)
    assert "   cross, layer 0, head 1, sentence 0, query 0 (<s>)." in out
    assert "filler included, are finite: yes" in out
    assert (tmp_path / "grid.png").read_bytes().startswith(PNG_MAGIC)


def test_mt_masks_on_the_sample_tokenizer(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    out = mt_masks(monkeypatch, capsys, *PAIRS, "tokenizer=data", f"data.cache_dir={tmp_path / 'cache'}",
                   "output=masks.png")
    assert "tokens: the SentencePiece vocabulary of data=sample" in out
    assert "▁" in out.split("2. The masks")[0]  # SentencePiece pieces label the batch
    assert (tmp_path / "masks.png").read_bytes().startswith(PNG_MAGIC)


MISTAKES = [
    (["sentences=[]"], "sentences=[]: give one or more Italian sentences: "
                       "sentences='[Mi chiamo Luke, Ciao]'"),
    (["sentences=[Ciao]"], "translations=null: without a checkpoint there is no model to translate; "
                           "give translations='[...]' or checkpoint=DIR"),
    (["sentences=[Ciao]", "translations=[Hi, Hello]"], "translations=['Hi', 'Hello']: need one per sentence (1)"),
    (["sentences=[Ciao]", "checkpoint=no/such/checkpoint"], "checkpoint=no/such/checkpoint: no such directory"),
    (["sentences=[Ciao amico]", "translations=[Hi friend]", "query=5"],
     "query=5: decoder_self has 3 query rows in this batch (0 to 2)"),
    (["sentences=[Ciao amico]", "translations=[Hi friend]", "attention=encoder_self", "query=2"],
     "query=2: encoder_self has 2 query rows in this batch (0 to 1)"),
    (["sentences=[Ciao]", "translations=[Hi]", "tokenizer=bpe"],
     "tokenizer='bpe': choose one of auto, whitespace, data"),
]


@pytest.mark.parametrize(("args", "line"), MISTAKES)
def test_a_mistake_is_one_line_and_writes_nothing(args, line, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["mt-masks", *args])
    with pytest.raises(SystemExit) as info:
        masks_command.main()
    assert info.value.code == f"mt-masks: error: {line}"
    assert list(tmp_path.iterdir()) == []


def test_a_layer_or_head_the_checkpoint_lacks_is_one_line(checkpoint, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for arg, line in (("layer=2", "layer=2: the model has 2 encoder layers (0 to 1, or -1 for the last)"),
                      ("head=2", "head=2: the model has 2 heads (0 to 1)")):
        monkeypatch.setattr(sys, "argv", ["mt-masks", f"checkpoint={checkpoint}", *PAIRS, arg])
        with pytest.raises(SystemExit) as info:
            masks_command.main()
        assert info.value.code == f"mt-masks: error: {line}"
    assert list(tmp_path.iterdir()) == []


def test_configs_masks_yaml_mirrors_the_dataclass():
    cfg = compose_cfg(*PAIRS, config="masks")
    assert set(OmegaConf.to_container(cfg)) == {f.name for f in fields(masks_command.MasksConfig)}
    assert to_dataclass(masks_command.MasksConfig, cfg).sentences == SENTENCES
    with pytest.raises(ConfigError, match=r"^sentences=\[\]: give one or more"):
        to_dataclass(masks_command.MasksConfig, compose_cfg(config="masks"))


def test_a_cut_source_and_an_empty_translation_are_told(checkpoint, monkeypatch, tmp_path):
    """A 600-word sentence meets the positional table: the refusal says what happened."""
    monkeypatch.chdir(tmp_path)
    long = " ".join(["parola"] * 600)
    monkeypatch.setattr(sys, "argv", ["mt-masks", f"checkpoint={checkpoint}", f"sentences=[{long}]",
                                      "translations=['']", "query=1"])
    with pytest.raises(SystemExit) as info:
        masks_command.main()
    assert info.value.code == (
        "mt-masks: error: query=1: decoder_self has 1 query rows in this batch (0 to 0); "
        "sentence 0: its 3000 source tokens were cut to the first 64, the rows of the model's "
        "positional table (model.max_positions); sentence 0: the translation is empty, so the "
        "target is <s> alone")
