"""Corpora to batches: reading, cleaning, encoding, the tokenizer, mixing, batching, sentences.

Preparation runs in stages, each a module: `corpus.py` reads parallel corpora (files, the
shared Tatoeba and Europarl, hub datasets) and holds the cleaning rule; `clean_split.py`
streams a corpus through cleaning and hashing into an Arrow `CleanSplit`; `tokenizer.py`
trains and loads the joint SentencePiece model; `encode_split.py` turns a cleaned split into
ids in the prepared-data cache (`SplitWriter`), on the processes of `workers.py`.
`pipeline.py` is preparation's entry point (`prepare_data`, `load_test_set`);
`prepared_cache.py` writes and opens a folder of the prepared-data cache, checking every
file it holds against the checksums recorded in it. At training
time `mixture.py` samples from several corpora and `batching.py` makes token-based batches
bucketed by length; `epoch_resume.py` continues an epoch under other batching settings
with the pairs it has not seen yet. `sentences.py` splits a user's line into the sentences the model was
trained on (scripts/studies/paragraphs.py joins a test set's lines into paragraphs to measure it).

May import: the top-level `transformer.config`, `errors`, `paths`, `bounds`, `outputs`;
never the model, training or decoding.
"""
