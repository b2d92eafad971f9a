"""Translating: beam and greedy search, text in and text out, a CTranslate2 model, `Translator`.

`search.py` is batched greedy and beam search on the model's key/value cache; `text.py`
the path from a user's lines to translations (normalise, split into sentences, encode,
batch by length, search, decode, rejoin); `loading.py` the commands' loader (a
checkpoint or an export); `settings.py` the decode settings as they will run (the
device's defaults filled in, once a call); `ct2_model.py` runs a CTranslate2 export in our
model's place; `translator.py` is the Python face (`Translator.load(path).translate(lines)`),
and what it runs beside `text.py`: `stream.py` (a stream of lines, a batch at a time, for
`translate_iterable` and mt-translate), `scoring.py` (forced scoring of given
translations), `tokens.py` (token scores and attention of chosen translations, by
teacher forcing) and `arguments.py` (its keywords checked, errors naming them);
`constraints.py` a forced target prefix and no repeated n-grams, applied to a search
step's logits;
`batch_memory.py` a decoding batch's memory estimate, which refuses one that would not fit.

May import: the top-level modules, `transformer.model`, `transformer.data`; never training,
deployment or the commands.
"""
