"""Training data for `horizon train`: byte-level tokens of a text file (ids 0..255), served
as (batch, seq) windows at random offsets from a seeded generator."""
from pathlib import Path

import torch

from horizon_sim.errors import HorizonError

BYTE_VOCAB = 256
BUILTIN_CORPUS = Path(__file__).parent / "corpus" / "python_docs.txt"
"""~360 KB of English prose (Python standard library docstrings, PSF License) shipped with
the package, so the demo and tests train on real text without downloading anything."""


def byte_tokens(path) -> torch.Tensor:
    p = Path(path)
    if not p.is_file():
        raise HorizonError(f"data file {str(p)!r} not found")
    data = p.read_bytes()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)


class RandomWindows:
    """Endless (batch, seq) int64 windows drawn uniformly from a token stream."""

    def __init__(self, tokens: torch.Tensor, batch: int, seq: int, seed: int = 0):
        if tokens.numel() < seq + 1:
            raise HorizonError(f"data has {tokens.numel()} tokens; need at least seq+1 = {seq + 1}")
        self.tokens, self.batch, self.seq = tokens, batch, seq
        self.gen = torch.Generator().manual_seed(seed)

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        starts = torch.randint(0, self.tokens.numel() - self.seq + 1, (self.batch,), generator=self.gen)
        return torch.stack([self.tokens[s:s + self.seq] for s in starts.tolist()])
