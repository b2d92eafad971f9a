"""A checkpoint as a Hugging Face transformers model folder (`mt-export format=hf`).

    mt-export checkpoint=runs/tatoeba_cpu/checkpoints/best output=exports/tatoeba_hf format=hf

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    model = AutoModelForSeq2SeqLM.from_pretrained("exports/tatoeba_hf")
    tokenizer = AutoTokenizer.from_pretrained("exports/tatoeba_hf")

The folder is written with json, safetensors and the checkpoint's SentencePiece model;
transformers is needed only to load it (`pip install -e ".[hf]"`). Two classes of
transformers hold our layers exactly, both with sinusoidal positions (a table of
max_positions rows, stored in the folder and loaded) and sqrt(D)-scaled, shared or
separate embeddings:
- post-norm -> `MarianMTModel` (post-norm layers, no extra LayerNorm);
- pre-norm -> `PegasusForConditionalGeneration` (pre-norm layers, a final LayerNorm per
  stack, Marian's positions).
Their sinusoids use our frequencies but put the sines in the first half of the hidden
dimension and the cosines in the second, where ours interleave them (`layers.sinusoid_table`).
A fixed permutation of the hidden dimension, applied to every weight that reads or writes
it (embeddings, LayerNorms, the projections in and out of each sublayer), makes the
models compute the same function: LayerNorm and the residual sums do not mind the order
of the hidden units, and the attention heads and FFN units are not permuted.

What else makes it exact (tests/deploy/test_hf_export.py checks each):
- the vocabulary projection is our (tied) output matrix with a zero `final_logits_bias`;
- decoding starts from our BOS (`decoder_start_token_id`); padding and BOS are never
  chosen (`suppress_tokens`), EOS not before one token (`min_new_tokens=1`), as in
  `search.py`;
- the source gets no `</s>`: the tokenizer is `BertGenerationTokenizer`, transformers'
  plain SentencePiece tokenizer that adds no special tokens (MarianTokenizer would append
  `</s>`, which our sources never had), on the checkpoint's own SentencePiece model;
- beam search scores by the sum of log-probabilities (`length_penalty=0`, fairseq's
  stopping rule `early_stopping=true`): ours with `decode.lenpen=0`. Our GNMT penalty has
  no equivalent in transformers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from transformer import outputs
from transformer.checkpoint import META, load_model
from transformer.config import DecodeConfig, ModelConfig
from transformer.data.tokenizer import PAD_ID, UNK_ID, Tokenizer
from transformer.deploy.hf_card import model_card
from transformer.errors import UserError
from transformer.model.layers import sinusoid_table
from transformer.model.transformer import Transformer

log = logging.getLogger(__name__)

# Where the export notes its source: not CTranslate2's export.json, by which mt-translate
# and the other commands recognise a CTranslate2 export.
INFO = "mt_export.json"
# The files of an export, beside the `.mt-output` marker.
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "spiece.model",
            "tokenizer_config.json", "special_tokens_map.json", "README.md", INFO)
CLASSES = {False: ("marian", "MarianMTModel"), True: ("pegasus", "PegasusForConditionalGeneration")}


class HFExportError(UserError, ValueError):
    """A checkpoint transformers cannot hold exactly."""


def hidden_permutation(d_model: int) -> torch.Tensor:
    """(D,) the order of our hidden units in transformers': the even units (our sines),
    then the odd ones (our cosines). transformers' unit k is our unit `perm[k]`."""
    if d_model % 2:
        raise HFExportError(f"d_model={d_model} is odd: transformers' sinusoids need an even one")
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under transformers' names, the hidden dimension permuted, in fp32.

    Tied embeddings are stored once (`model.shared.weight`), as transformers saves them;
    transformers ties the others to it on load."""
    cfg, state = model.cfg, model.state_dict()
    perm = hidden_permutation(cfg.d_model)
    out: dict[str, torch.Tensor] = {}

    def put(name: str, ours: str, rows: bool = False, cols: bool = False) -> None:
        t = state[ours].detach().to("cpu", torch.float32)
        t = t[perm] if rows else t
        out[name] = (t[:, perm] if cols else t).contiguous()

    def linear(name: str, ours: str, reads: bool) -> None:  # reads the hidden, else writes it
        put(f"{name}.weight", f"{ours}.weight", rows=not reads, cols=reads)
        put(f"{name}.bias", f"{ours}.bias", rows=not reads)

    def norm(name: str, ours: str) -> None:
        put(f"{name}.weight", f"{ours}.weight", rows=True)
        put(f"{name}.bias", f"{ours}.bias", rows=True)

    def sublayer(name: str, ours: str, attn: str, hf_attn: str) -> None:
        for x in "qkv":
            linear(f"{name}.{hf_attn}.{x}_proj", f"{ours}.{attn}.{x}_proj", reads=True)
        linear(f"{name}.{hf_attn}.out_proj", f"{ours}.{attn}.out_proj", reads=False)
        norm(f"{name}.{hf_attn}_layer_norm", f"{ours}.{attn}_res.norm")

    for stack, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            name, ours = f"model.{stack}.layers.{i}", f"{stack}_layers.{i}"
            sublayer(name, ours, "self_attn", "self_attn")
            if stack == "decoder":
                sublayer(name, ours, "cross_attn", "encoder_attn")
            linear(f"{name}.fc1", f"{ours}.ffn.linear1", reads=True)
            linear(f"{name}.fc2", f"{ours}.ffn.linear2", reads=False)
            norm(f"{name}.final_layer_norm", f"{ours}.ffn_res.norm")
        if cfg.pre_norm:
            norm(f"model.{stack}.layer_norm", f"{stack}_norm")
    _embeddings(put, cfg)
    positions = sinusoid_table(cfg.max_positions, cfg.d_model)[:, perm].contiguous()
    for stack in ("encoder", "decoder"):  # what transformers computes: stored, so none is missing
        out[f"model.{stack}.embed_positions.weight"] = positions.clone()
    out["final_logits_bias"] = torch.zeros(1, cfg.vocab_size)
    return out


def _embeddings(put, cfg: ModelConfig) -> None:
    """The token embeddings and the output matrix: one shared matrix when tied. Untied,
    Marian has no shared matrix; Pegasus has one that nothing reads (the source's here)."""
    if cfg.tie_embeddings or cfg.pre_norm:
        put("model.shared.weight", "src_embed.weight", cols=True)
    if not cfg.tie_embeddings:
        put("model.encoder.embed_tokens.weight", "src_embed.weight", cols=True)
        put("model.decoder.embed_tokens.weight", "tgt_embed.weight", cols=True)
        put("lm_head.weight", "out_proj.weight", cols=True)


def hf_config(cfg: ModelConfig) -> dict:
    """config.json: the class that holds our layers (`CLASSES`), our sizes and ids."""
    model_type, architecture = CLASSES[cfg.pre_norm]
    config = {
        "architectures": [architecture], "model_type": model_type,
        "vocab_size": cfg.vocab_size, "d_model": cfg.d_model,
        "encoder_layers": cfg.n_encoder_layers, "decoder_layers": cfg.n_decoder_layers,
        "encoder_attention_heads": cfg.n_heads, "decoder_attention_heads": cfg.n_heads,
        "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
        "activation_function": "relu", "max_position_embeddings": cfg.max_positions,
        "scale_embedding": True, "dropout": cfg.dropout, "attention_dropout": cfg.attn_dropout,
        "activation_dropout": cfg.ffn_dropout, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
        "pad_token_id": cfg.pad_id, "bos_token_id": cfg.bos_id, "eos_token_id": cfg.eos_id,
        "decoder_start_token_id": cfg.bos_id, "forced_eos_token_id": cfg.eos_id,
        "tie_word_embeddings": cfg.tie_embeddings, "is_encoder_decoder": True,
        "dtype": "float32",
    }
    if model_type == "marian":
        config |= {"share_encoder_decoder_embeddings": cfg.tie_embeddings,
                   "decoder_vocab_size": cfg.vocab_size}
    return config


def generation_config(cfg: ModelConfig, decode: DecodeConfig) -> dict:
    """generation_config.json: our decoding defaults as far as `generate()` holds them.

    The beam size; lengths up to the positional table (BOS, max_positions - 1 tokens,
    then a forced EOS): our a * |x| + b limit depends on the source, which a generation
    config cannot say; the sum of log-probabilities as the score (`length_penalty=0`,
    ours with decode.lenpen=0) and fairseq's stopping rule."""
    return {
        "decoder_start_token_id": cfg.bos_id, "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id, "forced_eos_token_id": cfg.eos_id,
        "num_beams": decode.beam_size, "length_penalty": 0.0, "early_stopping": True,
        "max_length": cfg.max_positions + 1, "min_new_tokens": decode.min_len,
        "suppress_tokens": [cfg.pad_id, cfg.bos_id], "do_sample": False,
    }


def tokenizer_files(tokenizer: Tokenizer, cfg: ModelConfig) -> dict[str, bytes]:
    """The SentencePiece model and the configs AutoTokenizer reads: BertGenerationTokenizer,
    which adds no BOS or EOS to what it encodes."""
    special = {"bos_token": tokenizer.id_to_piece(cfg.bos_id), "eos_token": tokenizer.id_to_piece(cfg.eos_id),
               "unk_token": tokenizer.id_to_piece(UNK_ID), "pad_token": tokenizer.id_to_piece(PAD_ID)}
    config = {"tokenizer_class": "BertGenerationTokenizer", **special, "sep_token": None,
              "model_max_length": cfg.max_positions, "clean_up_tokenization_spaces": False,
              "padding_side": "right", "model_input_names": ["input_ids", "attention_mask"]}
    return {"spiece.model": tokenizer.proto,
            "tokenizer_config.json": _json(config),
            "special_tokens_map.json": _json(special)}


def export_hf(cfg, reports: list[Path] = ()) -> Path:
    """Write the transformers folder of `cfg.checkpoint` to `cfg.output`.

    Args:
        cfg: `ExportConfig`: the checkpoint, the output folder (replaced only with
            `force=true`, and only if mt-export wrote it), the licence for the card.
        reports: mt-evaluate reports (.json) whose scores go into the model card.

    Returns:
        The output folder.
    """
    outputs.check_input(cfg.checkpoint, "checkpoint", is_dir=True)
    out = outputs.Output.of(cfg.output, "output", "mt-export", is_dir=True, force=cfg.force)
    outputs.check(out, inputs=[cfg.checkpoint])
    model, tokenizer = load_model(cfg.checkpoint)
    eps = {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}
    if eps - {1e-5}:
        raise HFExportError(f"the model's LayerNorms have eps {sorted(eps)}: transformers' "
                            "Marian and Pegasus layers take 1e-5")
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise HFExportError(f"the tokenizer has {tokenizer.vocab_size} pieces but the model "
                            f"vocab_size={model.cfg.vocab_size}")
    run = _run_config(Path(cfg.checkpoint))
    decode = DecodeConfig(**{k: v for k, v in run.get("decode", {}).items() if k in _DECODE_KEYS})
    state = hf_state_dict(model)  # before anything is written: a model it cannot hold stops here
    with outputs.write_dir(out) as tmp:
        tmp.mkdir()
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_bytes(_json(hf_config(model.cfg)))
        (tmp / "generation_config.json").write_bytes(_json(generation_config(model.cfg, decode)))
        for name, data in tokenizer_files(tokenizer, model.cfg).items():
            (tmp / name).write_bytes(data)
        card = model_card(model.cfg, CLASSES[model.cfg.pre_norm][1], run,
                          _read_json(Path(cfg.checkpoint) / META), _read_reports(reports), cfg.license)
        (tmp / "README.md").write_text(card)
        info = {"model": asdict(model.cfg), "checkpoint": str(Path(cfg.checkpoint).resolve()),
                "format": "hf", "class": CLASSES[model.cfg.pre_norm][1]}
        (tmp / INFO).write_bytes(_json(info))
    log.info("wrote %s (transformers %s)", cfg.output, CLASSES[model.cfg.pre_norm][1])
    return Path(cfg.output)


_DECODE_KEYS = {"beam_size", "min_len"}  # what generation_config takes from the run's decode


def _run_config(checkpoint: Path) -> dict:
    """The checkpoint's resolved run config (config.yaml), {} if it has none."""
    from omegaconf import OmegaConf

    path = checkpoint / "config.yaml"
    if not path.is_file():
        return {}
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _read_reports(paths) -> list[dict]:
    reports = []
    for path in paths:
        try:
            reports.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as e:
            log.warning("model card: skipped %s (%s)", path, e)
    return reports


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode()
