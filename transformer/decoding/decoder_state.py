"""The search's view of the decoder: feed one token per row, read the next token's
log-probabilities, follow the search's choice of rows; eagerly or as a compiled step.

Shapes: R rows, A sentences, S source length, L the cache's length bound, V vocabulary.

Compiled (`decode.compile`, a `torch.compile` mode), the first step runs eagerly (it
projects the memory into the cache) and every later one is `cache.static_step` on a
static `DecoderCache`: the position is a tensor, attention reads the whole length bound
under a position mask, and the buffers never move. Rows, sentences, the source length and
the length bound are marked dynamic, so dynamo traces one graph for every batch and
position (and one more where a dimension is 1, which it specialises); with
`mode="reduce-overhead"` inductor then records one CUDA graph per shape it meets, a
batch's row buckets (`search._live_rows`) times its length bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from transformer.model.cache import DecoderCache, static_step

logger = logging.getLogger(__name__)

# One compiled callable per mode, for the process: dynamo's cache of graphs belongs to the
# callable (its backend), so a new torch.compile per batch would trace every batch anew.
# None: compiling failed once (no C++ compiler, no Triton, ...); the steps run eagerly.
_COMPILED: dict[str, Callable | None] = {}


def compiled_step(mode: str) -> Callable | None:
    """`cache.static_step` under `torch.compile(mode=...)`, made once a process;
    None where compiling failed before."""
    if mode not in _COMPILED:
        _COMPILED[mode] = torch.compile(static_step, mode=None if mode == "default" else mode)
    return _COMPILED[mode]


def _mark(tensor: torch.Tensor, dims: tuple[int, ...], static: bool = False) -> torch.Tensor:
    """Mark tensor's dims dynamic for dynamo (those above 1: it specialises 0 and 1) and,
    if static, its address fixed (what CUDA graphs need of a buffer a step writes)."""
    for dim in dims:
        if tensor.size(dim) > 1:
            torch._dynamo.mark_dynamic(tensor, dim)
    if static:
        torch._dynamo.mark_static_address(tensor)
    return tensor


def _compile_errors() -> tuple[type[BaseException], ...]:
    """What a compile that cannot be done raises (imported here, when it is raised: the
    compiler's modules are loaded by torch.compile, not by this module)."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import InductorError

    return BackendCompilerFailed, InductorError


def _reason(error: BaseException) -> str:
    """The first line of what a failed compile says, from the error behind dynamo's wrapper."""
    inner = getattr(error, "inner_exception", None) or error.__cause__ or error
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0][:200]}" if lines else type(inner).__name__


class DecoderState:
    """Feeds one token per row, returns next-token log-probabilities, and follows the
    search's choice of rows.

    With a cache (`DecoderCache`, preallocated to the batch's length bound and rows) each
    step feeds the rows' last tokens only, and the encoder memory is dropped after the
    first step, whose cross-attention keys and values the cache keeps. use_cache=False
    re-runs the decoder over the whole prefix at every step (what `torch.nn.Transformer`
    users do); it is the reference for tests and benchmarks. compile: a `torch.compile`
    mode for the steps after the first (module docstring), or None.
    """

    def __init__(self, model, src_ids: torch.Tensor, bound: int, max_rows: int,
                 use_cache: bool = True, compile: str | None = None) -> None:
        self.model = model
        self.src_ids: torch.Tensor | None = src_ids  # (R, S) without a cache, else (A, S)
        self.memory: torch.Tensor | None = model.encode(src_ids)  # likewise (., S, D)
        device = src_ids.device
        self.step = compiled_step(compile) if compile is not None and use_cache else None
        self.cache = DecoderCache(bound + 1, max_rows, static=self.step is not None) if use_cache else None
        # a static step's position, on the device (the first step is eager)
        self.pos = torch.ones((), dtype=torch.long, device=device) if self.step is not None else None
        self.fed = torch.full((src_ids.size(0), 1), model.cfg.bos_id, device=device)  # (R, 1), (R, t+1)
        self.log_p = torch.empty(max_rows, model.cfg.vocab_size, device=device)  # written each eager step

    def log_probs(self) -> torch.Tensor:
        """Next-token log-probabilities (R, V), float32."""
        if self.cache is not None and self.memory is None:  # the cache holds what it needs
            if self.step is not None:
                return self._static_log_probs()
            logits = self.model.decode(self.fed, None, None, self.cache)
        else:
            logits = self.model.decode(self.fed, self.memory, self.src_ids, self.cache)
            if self.cache is not None:
                self.memory = self.src_ids = None
        out = self.log_p[:logits.size(0)]
        if logits.dtype != torch.float32:  # upcast into the output, normalised in place
            return torch.log_softmax(out.copy_(logits[:, -1]), dim=-1, out=out)
        return torch.log_softmax(logits[:, -1], dim=-1, out=out)

    def _static_log_probs(self) -> torch.Tensor:
        cache = self.cache
        args = (_mark(self.fed, (0,)), _mark(self.pos, (), static=True), _mark(cache.kv, (0, 3)),
                _mark(cache.cross, (0, 3)), _mark(cache.src_mask, (0, 3)), cache.embed, cache.qkv)
        try:
            out = self.step(self.model, *args)
        except _compile_errors() as e:
            logger.warning("decode.compile: compiling the decoder step failed (%s); decoding "
                           "eagerly", _reason(e))
            _COMPILED.update(dict.fromkeys(_COMPILED))  # every mode: the same compiler
            self.step = None
            out = static_step(self.model, *args)
        cache.length += 1
        self.pos.add_(1)
        return out

    def advance(self, index: torch.Tensor | None, tokens: torch.Tensor,
                sentences: torch.Tensor | None = None) -> None:
        """Row i of the next step is row index[i] (R',) of this step (None: row i) plus
        tokens[i]. sentences (A',): the sentences kept, when some were dropped; None:
        every row stays among its own sentence's rows."""
        if self.cache is None:
            prefix = self.fed if index is None else self.fed.index_select(0, index)
            self.fed = torch.cat([prefix, tokens[:, None]], dim=1)
            if index is not None:
                self.memory = self.memory.index_select(0, index)
                self.src_ids = self.src_ids.index_select(0, index)
            return
        if index is not None:
            self.cache.reorder(index, sentences)
        self.fed = tokens[:, None]
