"""Prepare a corpus ahead of training (same as `mt-prepare`): python scripts/data/prepare_data.py data=sample"""

from transformer.commands.prepare import main

if __name__ == "__main__":
    main()
