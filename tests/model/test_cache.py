"""Properties of incremental decoding's step (transformer/model/cache.py): a step of fixed
shape writes its cache in place and allocates the same bytes whatever its number, beams
reorder into a preallocated buffer, the step compiles as one graph,.

Shapes: R rows, A sentences, S source length, V vocabulary.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformer.model.attention import set_attention_path
from transformer.model.cache import DecoderCache

from helpers import BOS, EOS, pad_batch, tiny_model

SRC = [[5, 6, 7, 8, EOS], [9, 10, EOS]]


class NewBytes(TorchDispatchMode):
    """Bytes of the new tensors each op returns (an output whose storage is none of its
    inputs'), as /work/shared/tools/decode_cost.py counts them; and the non-view ops."""

    VIEWS = frozenset({"view", "transpose", "unsqueeze", "slice", "expand", "t", "_unsafe_view", "select",
             "detach", "alias", "reshape", "squeeze", "as_strided", "permute", "unbind"})

    def __init__(self) -> None:
        super().__init__()
        self.bytes = self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in self.VIEWS:
            return out
        self.ops += 1
        ins = {a.untyped_storage().data_ptr() for a in [*args, *(kwargs or {}).values()]
               if isinstance(a, torch.Tensor)}
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in ins:
                self.bytes += o.untyped_storage().nbytes()
        return out


def steps(model, cache, beams: int, n: int) -> list[tuple[int, int]]:
    """(new bytes, ops) of each of n beam-like steps: one decode call of one token per row,
    then the rows reordered among their sentence's beams."""
    rows = cache.self_kv.rows
    index = torch.arange(rows).view(-1, beams).flip(1).flatten()  # beams swap within a sentence
    ids = torch.full((rows, 1), 7)
    out = []
    for _ in range(n):
        with NewBytes() as count:
            model.decode(ids, None, None, cache)
            cache.reorder(index, cross=False)
        out.append((count.bytes, count.ops))
    return out


def test_a_step_allocates_the_same_bytes_whatever_its_number():
    # On the path a GPU runs (SDPA). The CPU's explicit product also allocates its scores
    # over the written prefix, (R, H, 1, t): R * H * 4 more bytes a step.
    model = tiny_model()
    set_attention_path(model, True)
    src = pad_batch(SRC)
    beams = 3
    with torch.inference_mode():
        cache = DecoderCache(max_len=20, max_rows=len(SRC) * beams)
        model.decode(torch.full((len(SRC), 1), BOS), model.encode(src), src, cache)
        cache.reorder(torch.arange(len(SRC)).repeat_interleave(beams), cross=False)  # fan-out
        counted = steps(model, cache, beams, 15)
    assert len({b for b, _ in counted}) == 1, counted  # no step allocates more than the first
    assert len({o for _, o in counted}) == 1, counted
    assert cache.self_kv.buffers[0].size(1) == len(SRC) * beams  # no buffer grew


def test_the_cache_is_preallocated_to_the_bound_and_written_in_place():
    model = tiny_model()
    src = pad_batch(SRC)
    with torch.inference_mode():
        cache = DecoderCache(max_len=9)
        model.decode(torch.full((2, 1), BOS), model.encode(src), src, cache)
        buffer = cache.self_kv.tensor
        pointer = buffer.data_ptr()
        model.decode(torch.full((2, 1), 5), None, None, cache)
        assert buffer.size(3) == 9 and cache.self_kv.tensor.data_ptr() == pointer
        with pytest.raises(ValueError, match="holds 9 positions"):
            model.decode(torch.full((2, 8), 5), None, None, cache)


def test_cross_attention_is_kept_once_per_sentence_and_memory_is_not_needed_after_step_one():
    model = tiny_model()
    src = pad_batch(SRC)
    with torch.inference_mode():
        memory = model.encode(src)
        cache = DecoderCache(max_len=6, max_rows=4)
        first = model.decode(torch.full((2, 1), BOS), memory, src, cache)
        cache.reorder(torch.tensor([0, 0, 1, 1]), cross=False)  # two beams per sentence
        assert cache.cross_kv.tensor.size(1) == 2  # sentences, not rows
        fanned = model.decode(torch.tensor([[5], [6], [5], [6]]), None, None, cache)
        alone = DecoderCache(max_len=6)
        model.decode(torch.full((4, 1), BOS), memory[[0, 0, 1, 1]], src[[0, 0, 1, 1]], alone)
        each_row = model.decode(torch.tensor([[5], [6], [5], [6]]), None, None, alone)
    assert first.shape == (2, 1, model.cfg.vocab_size)
    torch.testing.assert_close(fanned, each_row, atol=1e-5, rtol=0)


def test_the_step_compiles_as_one_graph_for_a_fixed_shape():
    """torch.compile(fullgraph=True) fails on any graph break: a host read, a data-dependent
    branch, an unsupported call. aot_eager traces it as inductor would, without a compiler."""
    model = tiny_model()
    src = pad_batch(SRC)
    with torch.inference_mode():
        memory = model.encode(src)
        eager, compiled = DecoderCache(max_len=8), DecoderCache(max_len=8)
        for cache in (eager, compiled):
            model.decode(torch.full((2, 1), BOS), memory, src, cache)
        step = torch.compile(lambda ids, c: model.decode(ids, None, None, c), fullgraph=True,
                             backend="aot_eager", dynamic=False)
        ids = torch.tensor([[5], [6]])
        got, want = step(ids, compiled), model.decode(ids, None, None, eager)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(compiled.self_kv.tensor, eager.self_kv.tensor, atol=1e-5, rtol=0)
    assert len(compiled) == len(eager) == 2
