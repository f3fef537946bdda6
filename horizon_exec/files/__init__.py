"""Data and checkpoint files: documents to batches, tokenizers, training checkpoints and their lock, HF checkpoints in and out, atomic file writing, the built-in corpus."""
