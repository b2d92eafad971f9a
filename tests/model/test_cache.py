"""Properties of incremental decoding's cache and step (transformer/model/cache.py and the
layers' `step`): a step of fixed shape writes its cache in place and allocates the same
bytes whatever its number; a reorder moves only the positions written so far; the static
step computes what the eager step computes, its buffers never move, and when traced every
input it writes is static (what CUDA graphs need).

Shapes: R rows, A sentences, S source length, L length bound, V vocabulary.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformer.model.attention import set_attention_path
from transformer.model.cache import DecoderCache, static_step

from helpers import BOS, EOS, pad_batch, tiny_model

SRC = [[5, 6, 7, 8, EOS], [9, 10, EOS]]


class Bytes(TorchDispatchMode):
    """Bytes of the new tensors each op returns (an output whose storage is none of its
    inputs') and bytes every op writes (new, in place or `out=`), per op name, as
    /work/shared/tools/decode_cost.py counts them; and the non-view ops."""

    VIEWS = frozenset({"view", "transpose", "unsqueeze", "slice", "expand", "t", "_unsafe_view", "select",
             "detach", "alias", "reshape", "squeeze", "as_strided", "permute", "unbind"})

    def __init__(self) -> None:
        super().__init__()
        self.bytes = self.ops = 0
        self.written: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in self.VIEWS:
            return out
        self.ops += 1
        ins = {a.untyped_storage().data_ptr() for a in [*args, *(kwargs or {}).values()]
               if isinstance(a, torch.Tensor)}
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(o, torch.Tensor):
                self.written[name] = self.written.get(name, 0) + o.numel() * o.element_size()
                if o.untyped_storage().data_ptr() not in ins:
                    self.bytes += o.untyped_storage().nbytes()
        return out


def started(model, rows: int, max_len: int = 20, beams: int = 1, static: bool = False):
    """A cache after the first step on SRC, fanned out to `beams` rows a sentence."""
    src = pad_batch(SRC)
    cache = DecoderCache(max_len=max_len, max_rows=len(SRC) * beams, static=static)
    model.decode(torch.full((len(SRC), 1), BOS), model.encode(src), src, cache)
    if beams > 1:
        cache.reorder(torch.arange(len(SRC)).repeat_interleave(beams))  # fan-out
    return cache


def steps(model, cache, beams: int, n: int) -> list[tuple[int, int]]:
    """(new bytes, ops) of each of n beam-like steps: one decode call of one token per row,
    then the rows reordered among their sentence's beams."""
    index = torch.arange(cache.rows).view(-1, beams).flip(1).flatten()  # beams swap within a sentence
    ids = torch.full((cache.rows, 1), 7)
    out = []
    for _ in range(n):
        with Bytes() as count:
            model.decode(ids, None, None, cache)
            cache.reorder(index)
        out.append((count.bytes, count.ops))
    return out


def test_a_step_allocates_the_same_bytes_whatever_its_number():
    # On the path a GPU runs (SDPA). The CPU's explicit product also allocates its scores
    # over the length bound, (R, H, 1, L).
    model = tiny_model()
    set_attention_path(model, True)
    with torch.inference_mode():
        cache = started(model, len(SRC), beams=3)
        held = cache.nbytes()
        counted = steps(model, cache, 3, 15)
    assert len({b for b, _ in counted}) == 1, counted  # no step allocates more than the first
    assert len({o for _, o in counted}) == 1, counted
    assert cache.nbytes() == held  # no buffer grew


def test_a_reorder_moves_the_written_positions_only():
    """Beam search's reorder gathers the prefix written so far, not the length bound: its
    bytes grow with the position and are a fraction of the buffer's."""
    model = tiny_model()
    with torch.inference_mode():
        cache = started(model, len(SRC), max_len=24, beams=3)
        index = torch.arange(cache.rows).flip(0)
        gathered = []
        for _ in range(4):
            model.decode(torch.full((cache.rows, 1), 7), None, None, cache)
            with Bytes() as count:
                cache.reorder(index)
            gathered.append(count.written["index_select"])
    per_position = cache.kv[:, :, :, :1].numel() * cache.kv.element_size()  # all rows and layers
    assert gathered == [per_position * n for n in (2, 3, 4, 5)]  # BOS and each step's token
    assert gathered[-1] * 4 < cache.kv.numel() * cache.kv.element_size()


def test_the_cache_is_preallocated_to_the_bound_and_written_in_place():
    model = tiny_model()
    src = pad_batch(SRC)
    with torch.inference_mode():
        cache = DecoderCache(max_len=9)
        model.decode(torch.full((2, 1), BOS), model.encode(src), src, cache)
        buffer = cache.kv
        pointer = buffer.data_ptr()
        model.decode(torch.full((2, 1), 5), None, None, cache)
        assert buffer.size(3) == 9 and cache.kv.data_ptr() == pointer
        with pytest.raises(ValueError, match="holds 9 positions"):
            model.decode(torch.full((2, 8), 5), None, None, cache)


def test_cross_attention_is_kept_once_per_sentence_and_memory_is_not_needed_after_step_one():
    model = tiny_model()
    src = pad_batch(SRC)
    with torch.inference_mode():
        memory = model.encode(src)
        cache = DecoderCache(max_len=6, max_rows=4)
        first = model.decode(torch.full((2, 1), BOS), memory, src, cache)
        cache.reorder(torch.tensor([0, 0, 1, 1]))  # two beams per sentence
        assert cache.cross.size(0) == 2  # sentences, not rows
        fanned = model.decode(torch.tensor([[5], [6], [5], [6]]), None, None, cache)
        alone = DecoderCache(max_len=6)
        model.decode(torch.full((4, 1), BOS), memory[[0, 0, 1, 1]], src[[0, 0, 1, 1]], alone)
        each_row = model.decode(torch.tensor([[5], [6], [5], [6]]), None, None, alone)
    assert first.shape == (2, 1, model.cfg.vocab_size)
    torch.testing.assert_close(fanned, each_row, atol=1e-5, rtol=0)


def static_steps(model, eager: DecoderCache, static: DecoderCache, tokens: list[list[int]],
                 reorders: dict[int, tuple[list[int], list[int] | None]], step=None):
    """Feed both caches the same tokens, step by step (the eager one through `decode`, the
    static one through `step`, by default `static_step` uncompiled), reordering both where
    `reorders` says; yields the two steps' log-probabilities."""
    step = step or static_step
    pos = torch.ones((), dtype=torch.long)
    for i, ids in enumerate(tokens):
        ids = torch.tensor(ids)[:, None]
        want = torch.log_softmax(model.decode(ids, None, None, eager)[:, -1], dim=-1)
        got = step(model, ids, pos, static.kv, static.cross, static.src_mask, static.embed, static.qkv)
        static.length += 1
        pos += 1
        yield got, want
        if i in reorders:
            rows, sentences = reorders[i]
            for cache in (eager, static):
                cache.reorder(torch.tensor(rows), None if sentences is None else torch.tensor(sentences))


@pytest.mark.parametrize("pre_norm", [False, True])
def test_the_static_step_computes_what_the_eager_step_computes(pre_norm):
    """Exactly, in fp32, through beam-like reorders and a sentence dropped: the same
    arithmetic on the same buffers; only the position is a tensor."""
    model = tiny_model(pre_norm=pre_norm)
    with torch.inference_mode():
        eager, static = started(model, 2, beams=2), started(model, 2, beams=2, static=True)
        addresses = [static.kv.data_ptr(), static.cross.data_ptr(), static.src_mask.data_ptr()]
        tokens = [[5, 6, 7, 8], [9, 9, 5, 6], [7, 8, 9, 5], [6, 7], [8, 9]]
        reorders = {0: ([1, 0, 3, 3], None), 1: ([0, 0, 2, 3], None), 2: ([2, 3], [1])}
        for got, want in static_steps(model, eager, static, tokens, reorders):
            assert torch.equal(got, want)
    assert [static.kv.data_ptr(), static.cross.data_ptr(), static.src_mask.data_ptr()] == addresses


def test_a_static_cache_keeps_its_rows():
    model = tiny_model()
    with torch.inference_mode():
        static = started(model, 2, beams=2, static=True)
        with pytest.raises(ValueError, match="static cache holds 4 rows; 5 asked"):
            static.reorder(torch.tensor([0, 1, 2, 3, 3]))


def aot_traced(model, seen: list):
    """`static_step` compiled through AOT autograd (no code generated); each trace appends
    (the runtime indices of the inputs it writes, those of its static inputs) to `seen`."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._guards import TracingContext

    def inspect(gm, example_inputs):
        meta = TracingContext.get().fw_metadata
        seen.append((set(meta.mutated_inp_runtime_indices), set(meta.static_input_indices)))
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    return torch.compile(static_step, backend=aot_autograd(fw_compiler=inspect), fullgraph=True)


def test_the_traced_static_step_writes_static_inputs_only():
    """What inductor needs to replay a step as a CUDA graph (it skips graphs with a
    mutated input that is not static, torch/_inductor/cudagraph_trees.py): AOT autograd's
    metadata of the traced step lists the inputs it writes, and each must be static."""
    model, seen = tiny_model(), []
    step = aot_traced(model, seen)
    with torch.inference_mode():
        eager, static = started(model, 2, beams=2), started(model, 2, beams=2, static=True)
        tokens = [[5, 6, 7, 8], [9, 9, 5, 6]]
        for got, want in static_steps(model, eager, static, tokens, {}, step):
            torch.testing.assert_close(got, want)  # traced: SDPA, where the CPU's eager path is explicit
    assert seen, "nothing was traced"
    for mutated, static_inputs in seen:
        assert mutated, "the step writes its cache"
        assert mutated <= static_inputs, (mutated, static_inputs)


def test_an_unmarked_buffer_is_caught():
    """The check above fails where it should: the same step on a cache whose buffers are
    not marked static has a mutated input that is not static."""
    model, seen = tiny_model(), []
    step = aot_traced(model, seen)
    with torch.inference_mode():
        cache = started(model, 2, beams=2)  # not static: nothing marked
        step(model, torch.full((4, 1), 5), torch.ones((), dtype=torch.long), cache.kv, cache.cross,
             cache.src_mask, cache.embed, cache.qkv)
    assert seen and seen[0][0] - seen[0][1], "a written unmarked buffer should be a mutated non-static input"
