"""How a unit's parameters are split over the ranks of a data-parallel run: the one rule both
interpreters use to place a rank's share in the buffers the Schedule declares.

R = N x M ranks (N devices per node, M nodes); rank (i, j) is local rank i of node j. A unit's
P parameters are padded to R equal chunks of `chunk` = ceil(P / R) elements and numbered
i-major: chunk i*M + j is rank (i, j)'s, the part it updates. Then

  - the node's reduce-scatter leaves local rank i the sum over the node's devices of its
    `local` slice: chunks i*M .. i*M + M - 1 (contiguous, M chunks);
  - the nodes' reduce-scatter of that slice leaves node j's rank its own chunk;
  - node j's host store (master, moments) holds its ranks' chunks i*M + j for i = 0..N-1, N
    chunks; local rank i's is the i-th of them;
  - the working copy is whole on every node (padded to R chunks), each node's ranks
    gathering the other nodes' updated chunks of their local slice.

With one rank the chunk is the unit (nothing is padded). Padding is zero everywhere and stays
zero (AdamW keeps a zero weight with a zero gradient at zero), so a padded chunk's norm is its
real elements' norm.
"""
from dataclasses import dataclass
from enum import Enum

from horizon_sim.specs.layout import ONE, Layout


class Part(str, Enum):
    """Which part of its unit a buffer holds (Buffer.part)."""
    WHOLE = "whole"  # the unit (padded to R chunks when R > 1)
    LOCAL = "local"  # a local rank's slice after the node's reduce-scatter: M chunks
    NODE = "node"    # a node's share of the host store: its N ranks' chunks


@dataclass(frozen=True, slots=True)
class Partition:
    params: int
    """P: the unit's parameters."""
    layout: Layout = ONE

    @property
    def ranks(self) -> int:
        return self.layout.ranks

    @property
    def chunk(self) -> int:
        """Elements a rank owns (updates)."""
        return -(-self.params // self.ranks)

    @property
    def padded(self) -> int:
        """The unit's elements padded to whole chunks (P when R = 1)."""
        return self.chunk * self.ranks

    def numel(self, part: Part) -> int:
        return {Part.WHOLE: self.padded, Part.LOCAL: self.layout.nodes * self.chunk,
                Part.NODE: self.layout.devices_per_node * self.chunk}[part]

    def chunk_index(self, local_rank: int, node: int) -> int:
        """The number of rank (i, j)'s chunk: i*M + j."""
        return local_rank * self.layout.nodes + node

    def local_range(self, local_rank: int) -> tuple[int, int]:
        """Local rank i's slice of the whole unit (the node's reduce-scatter leaves it that)."""
        n = self.layout.nodes * self.chunk
        return local_rank * n, (local_rank + 1) * n

    def local_in(self, part: Part, local_rank: int) -> tuple[int, int]:
        """Local rank i's slice within a buffer holding `part` of the unit (WHOLE or LOCAL)."""
        return self.local_range(local_rank) if part == Part.WHOLE else (0, self.numel(Part.LOCAL))

    def owned_range(self, local_rank: int, node: int) -> tuple[int, int]:
        """Rank (i, j)'s chunk of the whole unit."""
        c = self.chunk_index(local_rank, node) * self.chunk
        return c, c + self.chunk

    def owned_in(self, part: Part, local_rank: int, node: int) -> tuple[int, int]:
        """Rank (i, j)'s chunk within a buffer holding `part` of the unit."""
        c = self.chunk
        if part == Part.WHOLE:
            return self.owned_range(local_rank, node)
        if part == Part.LOCAL:
            return node * c, (node + 1) * c
        return local_rank * c, (local_rank + 1) * c
