"""How many rows each expert's GEMMs run in an MoE block: the tokens of one op times top-k,
spread over E experts unevenly, as a real router spreads them.

The executor runs the experts as a loop of per-expert GEMMs (transformers' own Experts
forward: one gate_up and one down GEMM per expert over the rows routed to it), so the op's
GEMM time is the sum of E GEMMs whose row counts add up to tokens x k exactly; the imbalance
changes their shapes (one large, many smaller: small GEMMs run at a lower rate), not their FLOPs.

The most loaded expert gets mean + LOAD_SPREAD x sqrt(2 mean ln E) rows (mean = tokens k / E):
the expected maximum of E independent Poisson(mean) loads (the Gaussian tail bound), i.e. a
router that balances in expectation, as the load-balancing loss trains it to; a trained router
is at least this uneven. LOAD_SPREAD (1.0 by default) is the knob: raise it for a router
known to be more skewed; it is an estimate until the executor measures per-expert loads."""
import math

LOAD_SPREAD = 1.0
"""Multiplier on the max-load excess over the mean (0 = perfectly even experts)."""

BF16_ROW_MULTIPLE = 16
"""On a CPU computing in bf16 the executor pads each expert's rows with zero rows to a multiple
of this (horizon_exec/model/moe_block.py: oneDNN compiles a GEMM kernel per shape there). The
temporaries are priced with the most padding (padded_rows) wherever bf16 runs: on a GPU, which
does not pad, that overstates an MoE block's by at most E x 15 rows, a few MiB."""


def row_multiple(a: int) -> int:
    """The multiple an expert's rows may be padded to at activation width a (bytes)."""
    return BF16_ROW_MULTIPLE if a == 2 else 1


def padded_rows(rows: int, a: int) -> int:
    """rows rounded up to row_multiple(a)."""
    m = row_multiple(a)
    return -(-rows // m) * m


def expert_rows(tokens: int, top_k: int, experts: int, spread: float = LOAD_SPREAD) -> tuple[tuple[int, int], ...]:
    """(rows, count) groups: the hottest expert, then the rest sharing what is left as evenly
    as integers allow. Rows sum to tokens x top_k exactly; groups with no expert are left out."""
    routed = tokens * top_k
    mean = routed / experts
    hot = min(tokens, routed, math.ceil(mean + spread * math.sqrt(2.0 * mean * math.log(experts))))
    hot = max(hot, math.ceil(mean))
    rest, extra = divmod(routed - hot, experts - 1)
    groups = ((hot, 1), (rest + 1, extra), (rest, experts - 1 - extra))
    return tuple((r, c) for r, c in groups if c > 0 and r > 0)


def max_rows(tokens: int, top_k: int, experts: int, spread: float = LOAD_SPREAD) -> int:
    """Rows of the most loaded expert."""
    return expert_rows(tokens, top_k, experts, spread)[0][0]


def min_rows(tokens: int, top_k: int, experts: int, spread: float = LOAD_SPREAD) -> int:
    """Rows of the least loaded expert: the hottest's mirror, mean - LOAD_SPREAD x sqrt(2 mean
    ln E) (the expected minimum of the same E loads, by the same Gaussian bound), at least 0.
    expert_rows spreads the rest evenly, which prices the GEMMs; this is for a figure that is
    largest where an expert has few rows (the backward's temporaries, work.py)."""
    mean = tokens * top_k / experts
    return max(0, math.floor(mean - spread * math.sqrt(2.0 * mean * math.log(experts))))
