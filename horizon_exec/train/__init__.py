"""The training loop around a Trainer and what guards a run: flag checks, outputs, signals, the
HF save at the end."""
