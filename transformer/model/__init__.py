"""The network: attention masks, multi-head attention, the encoder and decoder layers, the Transformer.

Plain tensors in and out: `Transformer(cfg)(src_ids, tgt_ids)` builds its masks itself from
the padded ids (`masks.py`: True = may attend), so nothing outside this folder makes a mask.
`attention.py` is multi-head attention with a key/value cache, `layers.py` the positions,
feed-forward and encoder/decoder layers, `dropout.py` a dropout cheap on a CPU,
`transformer.py` the encoder-decoder, `cache.py` its incremental-decoding cache and step,
and `weights.py` the weights held in the dtype a decoder step computes in.

May import: the top-level `transformer.config` and `transformer.errors` only; nothing of
the data pipeline, training or decoding.
"""
