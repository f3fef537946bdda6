"""The training loop around a Trainer and what guards a run: admission (does it fit, before anything is allocated), flag checks, outputs, signals, the HF save at the end."""
