"""Training: the loop, validation, the loss, the optimizer, the run directory, fine-tuning.

`trainer.py` is the loop (`Trainer.fit`: batches, mixed precision, updates, when to
validate and save); what it delegates lives beside it: `state.py` the training state that
a checkpoint carries in and out (exact resume) and the run's checkpoints (writing, keeping
the last N, resuming), `signals.py` stopping on SIGINT/SIGTERM with a checkpoint,
`logbook.py` the logging windows and TensorBoard, `validation.py` dev loss and BLEU,
`loss.py` label-smoothed cross-entropy, `optimizer.py` Adam and the warm-up schedule,
`nan_guard.py` telling a diverged run from a skipped update, `update_meter.py` the
updates' metrics kept on the device until the loop reads them, `prefetch.py` batches
collated ahead by a background thread, `run_dir.py` the run
directory and its checkpoint rules, `distributed.py` the `torchrun` process group and RNG
states, `finetune.py` starting from a trained model's weights.

May import: the top-level modules, `transformer.model`, `transformer.data`,
`transformer.metrics` (validation scores the dev set), `transformer.decoding` (validation
translates the dev set); never deployment or the commands.
"""
