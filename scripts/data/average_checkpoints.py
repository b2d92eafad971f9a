"""Average checkpoints (same as `mt-average`): see transformer/commands/average.py.

    python scripts/data/average_checkpoints.py runs/tatoeba_cpu --last 5 -o runs/tatoeba_cpu/checkpoints/avg_last5
"""

from transformer.commands.average import main

if __name__ == "__main__":
    main()
