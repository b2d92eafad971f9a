"""A checkpoint as a self-contained CTranslate2 model directory (`mt-export`, its default format).

    mt-export checkpoint=runs/tatoeba_cpu/checkpoints/best output=exports/tatoeba_int8 quantization=int8
    mt-translate checkpoint=exports/tatoeba_int8 input.file=news.it     # run by transformer/decoding/ct2_model.py
    mt-export checkpoint=... output=exports/tatoeba.argosmodel format=argos   # for LibreTranslate (argos.py)

CTranslate2 (a C++ inference engine: int8 weights, batched beam search) converts fairseq,
OpenNMT and Marian models, not ours, so `CheckpointConverter` subclasses its `Converter`:
it builds a `TransformerSpec` from our ModelConfig and fills it from the state dict.
What it respects, each checked by tests/deploy/test_ct2_export.py:
- Positions: our sinusoidal table (`layers.sinusoid_table`: sin on even, cos on odd dims,
  from position 0) is stored in the spec, `max_positions` rows. CTranslate2's own table puts
  the sines in the first half and the cosines in the second, counts from position 1 and
  steps its frequencies by log(1e4) / (D/2 - 1): another function. It refuses positions
  past the stored rows, so a sentence longer than max_positions is translated in pieces
  cut at clauses, then words (`sentences.segment`), and decoding lengths are capped below
  it (`search.max_lengths`), as with our model.
- Post-norm or pre-norm (the spec's pre_norm; pre-norm adds the final encoder and
  decoder LayerNorms), tied or untied embeddings (all three matrices are written;
  CTranslate2 stores equal variables once), embeddings scaled by sqrt(D)
  (scale_embeddings), LayerNorm eps written as layer_norm_epsilon (ours is
  nn.LayerNorm's 1e-5; CTranslate2 reads that key, else assumes 1e-5 for a LayerNorm with
  a bias and 1e-6 for RMSNorm).
- Fused projections in the spec's layout: self-attention [Wq; Wk; Wv] stacked along the
  output dimension in linear[0]; cross-attention Wq in linear[0], [Wk; Wv] in linear[1];
  the output projection last.
- Tokens: the vocabulary is the SentencePiece pieces in id order; decoding starts from
  `<s>`; the source gets neither BOS nor EOS, as in training (`batching.collate`).
- Strict: every tensor of the checkpoint is used and every spec variable is set, or the
  export stops naming what is left over.

The output directory holds CTranslate2's files (model.bin, config.json,
shared_vocabulary.json), our tokenizer.model, export.json (ModelConfig, source
checkpoint, quantization) and the `.mt-output` marker. It is written to `<output>.tmp-<pid>`
and renamed into place; an existing output is replaced only with force=true, and only if
it is an earlier export: mt-export never deletes what it did not write
(`transformer/outputs.py`, the rule every command's outputs follow).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from transformer import outputs
from transformer.checkpoint import TOKENIZER, load_model
from transformer.config import ModelConfig, require
from transformer.data.tokenizer import UNK_ID
from transformer.decoding.ct2_model import CT2_FILES, EXPORT_INFO, is_export, require_ctranslate2
from transformer.errors import UserError
from transformer.model.layers import sinusoid_table
from transformer.model.transformer import Transformer

try:  # the optional dependency (pip install -e ".[export]"); mt-export says so in one line
    import ctranslate2
    from ctranslate2.converters import Converter
    from ctranslate2.specs import model_spec, transformer_spec
except ImportError:
    ctranslate2 = None
    Converter = object  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

# CTranslate2's weight types; "none" keeps the checkpoint's fp32.
QUANTIZATIONS = ("none", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16", "float32")
FORMATS = ("ct2", "argos", "hf")  # a CTranslate2 directory | an Argos Translate package (argos.py)
# | a Hugging Face transformers folder (hf_export.py)


@dataclass
class ExportConfig:
    """The settings of mt-export (configs/export.yaml)."""

    checkpoint: str | None = None
    """Required: a checkpoint directory, or a run directory (its best checkpoint, else its
    newest)."""
    output: str | None = None
    """Required: the export to write, a directory (or an .argosmodel file with
    format=argos); refused if it exists, unless force=true."""
    quantization: str = "none"
    """The weights' type: none (fp32) | int8 | int8_float32 | int8_float16 | int8_bfloat16 |
    int16 | float16 | bfloat16 | float32."""
    force: bool = False
    """Replace an existing output, if it is an earlier export (or empty)."""
    format: str = "ct2"
    """ct2 (a CTranslate2 directory) | argos (an .argosmodel Argos Translate package, for
    LibreTranslate; needs .[argos]) | hf (a Hugging Face transformers folder: MarianMTModel
    for a post-norm model, PegasusForConditionalGeneration for a pre-norm one)."""
    license: str = "unknown"
    """format=hf: the licence identifier the model card gives the weights (a Hugging Face
    Hub one, e.g. mit, cc-by-4.0, other)."""

    def validate(self) -> None:
        require(bool(self.checkpoint), "checkpoint", self.checkpoint,
                "required: add checkpoint=path/to/checkpoint_dir")
        require(bool(self.output), "output", self.output, "required: add output=path/to/export_dir")
        require(self.quantization in QUANTIZATIONS, "quantization", self.quantization,
                f"choose one of {', '.join(QUANTIZATIONS)}")
        require(self.format in FORMATS, "format", self.format, f"choose one of {', '.join(FORMATS)}")
        argos_file = str(self.output).endswith(".argosmodel")
        require(argos_file or self.format != "argos", "output", self.output,
                "format=argos writes a file ending in .argosmodel")
        require(not argos_file or self.format == "argos", "output", self.output,
                "an .argosmodel is written with format=argos")
        require(self.format != "hf" or self.quantization == "none", "quantization",
                self.quantization, "format=hf writes fp32 weights: leave quantization=none")
        require(bool(self.license) and not any(c.isspace() for c in str(self.license)), "license",
                self.license, "a licence identifier without spaces, e.g. mit, cc-by-4.0, other")


class ExportError(UserError, ValueError):
    """The checkpoint and the spec do not fit each other, or the output cannot be written."""


class _Weights:
    """The state dict as float32 numpy arrays, remembering which tensors were taken."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state
        self.used: set[str] = set()

    def __call__(self, name: str) -> np.ndarray:
        if name not in self.state:
            raise ExportError(f"the checkpoint has no tensor {name!r}, which the spec needs")
        self.used.add(name)
        return self.state[name].detach().to("cpu", torch.float32).numpy().copy()

    def linear(self, spec, *prefixes: str) -> None:
        """Set a LinearSpec from one or more nn.Linear, stacked along the output dimension."""
        spec.weight = np.concatenate([self(f"{p}.weight") for p in prefixes])
        spec.bias = np.concatenate([self(f"{p}.bias") for p in prefixes])

    def layer_norm(self, spec, prefix: str) -> None:
        spec.gamma = self(f"{prefix}.weight")
        spec.beta = self(f"{prefix}.bias")

    def check_all_used(self) -> None:
        unused = sorted(set(self.state) - self.used)
        if unused:
            raise ExportError(f"{len(unused)} tensor(s) of the checkpoint have no place in the "
                              f"spec: {', '.join(unused)}")


class CheckpointConverter(Converter):
    """Our model as a CTranslate2 `TransformerSpec`; `convert(output_dir, quantization=...)`
    (CTranslate2's) validates, quantizes and writes it.

    cfg and state: the ModelConfig and state dict of a `Transformer`; pieces: the
    SentencePiece pieces in id order; layer_norm_eps: the eps of every LayerNorm.
    """

    def __init__(self, cfg: ModelConfig, state: dict[str, torch.Tensor], pieces: list[str],
                 layer_norm_eps: float = 1e-5) -> None:
        if len(pieces) != cfg.vocab_size:
            raise ExportError(f"the tokenizer has {len(pieces)} pieces but the model "
                              f"vocab_size={cfg.vocab_size}")
        self.cfg, self.state, self.pieces, self.eps = cfg, state, pieces, layer_norm_eps

    @classmethod
    def from_model(cls, model: Transformer, pieces: list[str]) -> CheckpointConverter:
        eps = {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}
        if len(eps) != 1:
            raise ExportError(f"the model's LayerNorms have different eps {sorted(eps)}: "
                              "CTranslate2 takes one")
        return cls(model.cfg, model.state_dict(), pieces, eps.pop())

    def positions(self) -> np.ndarray:
        """The (max_positions, D) table added to the embeddings: ours, interleaved, from 0."""
        return sinusoid_table(self.cfg.max_positions, self.cfg.d_model).numpy()

    def _load(self):
        """Build and fill the spec (CTranslate2's `Converter.convert` calls this)."""
        cfg = self.cfg
        encoder = transformer_spec.TransformerEncoderSpec(
            cfg.n_encoder_layers, cfg.n_heads, pre_norm=cfg.pre_norm)
        decoder = transformer_spec.TransformerDecoderSpec(
            cfg.n_decoder_layers, cfg.n_heads, pre_norm=cfg.pre_norm)
        spec = transformer_spec.TransformerSpec(encoder, decoder)
        w = _Weights(self.state)
        self._fill_encoder(spec.encoder, w)
        self._fill_decoder(spec.decoder, w)
        w.check_all_used()
        _check_all_set(spec)
        spec.config.layer_norm_epsilon = self.eps
        spec.config.unk_token = self.pieces[UNK_ID]
        spec.config.bos_token = spec.config.decoder_start_token = self.pieces[cfg.bos_id]
        spec.config.eos_token = self.pieces[cfg.eos_id]
        spec.config.add_source_bos = spec.config.add_source_eos = False
        spec.register_source_vocabulary(self.pieces)
        spec.register_target_vocabulary(self.pieces)
        return spec

    def _inputs(self, spec, w: _Weights, embed: str) -> None:
        (spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings).weight = w(embed)
        spec.scale_embeddings = np.float32(self.cfg.d_model**0.5)  # model._embed
        spec.position_encodings.encodings = self.positions()

    def _fill_encoder(self, spec, w: _Weights) -> None:
        self._inputs(spec, w, "src_embed.weight")
        for i, layer in enumerate(spec.layer):
            p = f"encoder_layers.{i}"
            w.layer_norm(layer.self_attention.layer_norm, f"{p}.self_attn_res.norm")
            w.linear(layer.self_attention.linear[0], *(f"{p}.self_attn.{x}_proj" for x in "qkv"))
            w.linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
            self._ffn(layer.ffn, w, p)
        if self.cfg.pre_norm:
            w.layer_norm(spec.layer_norm, "encoder_norm")

    def _fill_decoder(self, spec, w: _Weights) -> None:
        self._inputs(spec, w, "tgt_embed.weight")
        spec.projection.weight = w("out_proj.weight")  # no bias: the spec's stays unset
        for i, layer in enumerate(spec.layer):
            p = f"decoder_layers.{i}"
            w.layer_norm(layer.self_attention.layer_norm, f"{p}.self_attn_res.norm")
            w.linear(layer.self_attention.linear[0], *(f"{p}.self_attn.{x}_proj" for x in "qkv"))
            w.linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
            w.layer_norm(layer.attention.layer_norm, f"{p}.cross_attn_res.norm")
            w.linear(layer.attention.linear[0], f"{p}.cross_attn.q_proj")
            w.linear(layer.attention.linear[1], f"{p}.cross_attn.k_proj", f"{p}.cross_attn.v_proj")
            w.linear(layer.attention.linear[2], f"{p}.cross_attn.out_proj")
            self._ffn(layer.ffn, w, p)
        if self.cfg.pre_norm:
            w.layer_norm(spec.layer_norm, "decoder_norm")

    @staticmethod
    def _ffn(spec, w: _Weights, prefix: str) -> None:
        w.layer_norm(spec.layer_norm, f"{prefix}.ffn_res.norm")
        w.linear(spec.linear_0, f"{prefix}.ffn.linear1")
        w.linear(spec.linear_1, f"{prefix}.ffn.linear2")


# Optional spec variables that our model has and the converter must therefore set.
_REQUIRED_OPTIONAL = ("/bias", "position_encodings/encodings")
_BIASLESS = ("decoder/projection/bias",)  # out_proj has no bias


def _check_all_set(spec) -> None:
    """Every variable of the spec set: required ones (None when unset) and the optional
    ones our model has (biases, the position table), so none falls back to a default."""
    unset: list[str] = []

    def visit(_layer, name: str, value) -> None:
        optional_but_ours = name.endswith(_REQUIRED_OPTIONAL) and name not in _BIASLESS
        if value is None or (optional_but_ours and isinstance(value, str)):
            unset.append(name)

    model_spec.visit_spec(spec, visit)
    if unset:
        raise ExportError(f"{len(unset)} spec variable(s) were not set: {', '.join(unset)}")


def export_ct2(cfg: ExportConfig) -> Path:
    """Write the CTranslate2 export of `cfg.checkpoint` to `cfg.output`.

    Args:
        cfg: the checkpoint, the output directory (replaced only with `force=true`, and
            only if mt-export wrote it), the quantization.

    Returns:
        The output directory.
    """
    require_ctranslate2("mt-export")
    outputs.check_input(cfg.checkpoint, "checkpoint", is_dir=True)
    output = Path(cfg.output)
    out = outputs.Output.of(cfg.output, "output", "mt-export", is_dir=True, force=cfg.force,
                            owned_before=_earlier_export)
    outputs.check(out, inputs=[cfg.checkpoint])
    model, tokenizer = load_model(cfg.checkpoint)
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    converter = CheckpointConverter.from_model(model, pieces)
    with outputs.write_dir(out) as tmp:
        quantization = None if cfg.quantization == "none" else cfg.quantization
        converter.convert(str(tmp), quantization=quantization)
        (tmp / TOKENIZER).write_bytes(tokenizer.proto)
        info = {"model": asdict(model.cfg), "checkpoint": str(Path(cfg.checkpoint).resolve()),
                "quantization": cfg.quantization, "ctranslate2": ctranslate2.__version__}
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
    size = sum(f.stat().st_size for f in output.iterdir())
    log.info("wrote %s (%s, %.1f MB)", output, cfg.quantization, size / 1e6)
    return output


def _earlier_export(path: Path) -> bool:
    """An export written before outputs carried a marker: export.json, and only the files
    an export holds."""
    return is_export(path) and all(f.name in (*CT2_FILES, TOKENIZER, EXPORT_INFO)
                                   for f in path.iterdir())
