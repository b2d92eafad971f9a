"""Looking inside: masks and attention as the model sees them, learning curves as pictures.

`mask_inspector.py` lays out a batch of real sentence pairs with their masks and
attention weights, `attention_plots.py` draws them, and `learning_curves.py` reads a run's
TensorBoard logs into dev BLEU and loss curves.

May import: the top-level modules, `transformer.model`, `transformer.data`,
`transformer.decoding`; never training, deployment or the commands.
"""
