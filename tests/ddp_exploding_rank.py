"""Run by tests/training/test_distributed.py under torchrun: `mt-train` with the settings
given, where rank 1's loss (and so its gradients) is multiplied by 1e6 from its third
micro-batch on. That rank's loss explodes; the other's stays what it was."""

import os
import sys

from transformer.commands import train
from transformer.training import forward

EXPLODE_FROM = 3  # rank 1's micro-batches from this one on (counted from 1)
calls = 0


def exploding(*args, real=forward.batch_loss, **kwargs):
    global calls
    calls += 1
    loss, nll = real(*args, **kwargs)
    return (loss * 1e6, nll * 1e6) if calls >= EXPLODE_FROM else (loss, nll)


if __name__ == "__main__":
    if os.environ["RANK"] == "1":
        forward.batch_loss = exploding  # what `TrainForward` computes the loss with
    sys.argv = ["mt-train", *sys.argv[1:]]
    train.main()
