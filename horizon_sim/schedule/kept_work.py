"""The work of a kept layer (Policy.keep_last): its FORWARD keeps its autograd graph on the
device and its BACKWARD_SAVED runs from it, no forward again. Sizes count the executor's
template (horizon_exec/runtime/kept_graph.py) the way work.py counts it, and were checked
against the executor's measured temporaries (tests/test_keep_activations.py); work.py holds
the shared counts (block_saved_bytes: what autograd saves; block_temp_peak_bytes).

N = micro_batch x seq tokens, a = bytes of the compute dtype, H hidden."""
from horizon_sim.schedule import work
from horizon_sim.specs import block
from horizon_sim.specs.model import ModelSpec


def kept_saved_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int, attention: str = "flash",
                     mask: int = 0) -> int:
    """The SAVED_ACTIVATIONS buffer of one kept layer and micro-batch: work.block_saved_bytes
    (the saved tensors and the output the graph holds), plus the layer's input where the graph
    keeps it (work.block_input_saved: in fp32 the first norm's fp32 input is the input itself;
    without a first norm the projections read it; a boundary the layer's FORWARD frees), plus an explicit mask's bool and additive forms (mask elements; 0 when
    causal), plus eager attention's T x T scores and probabilities per head."""
    N = micro_batch * seq
    n = (work.block_saved_bytes(m, micro_batch, seq, a) + (N * m.hidden * a if work.block_input_saved(m, a) else 0)
         + mask * (1 + a))
    if attention == "eager":
        n += 2 * micro_batch * m.n_heads * seq * seq * a
    return int(n)


def kept_forward_workspace_bytes(m: ModelSpec, micro_batch: int, seq: int, mask: int = 0) -> int:
    """A kept FORWARD's temporaries beyond its saved tensors and its output (both charged from
    its start, as buffers): at most one fp32 temporary per token as wide as the widest norm (a
    norm's normalised rows before their cast; measured: the peak is the saved bytes plus exactly
    this), and an explicit mask's bool form while SDPA makes the additive one."""
    widest = max((k.width for k in block.kernels(m) if k.kind == "rmsnorm"), default=0)  # a LayerNorm: none
    return int(micro_batch * seq * widest * 4 + mask)


def saved_backward_workspace_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int, mask: int = 0) -> int:
    """A BACKWARD_SAVED's temporaries beyond its output dx (a buffer): the recomputing
    backward's (work.block_workspace_bytes) less what the forward saved, which the saved
    backward finds in its buffer, but never below the first norm's backward point, where
    every weight gradient of the block is live with the norm's fp32 temporaries
    (work.backward_end_bytes, which hold almost no saved tensor)."""
    H, N = m.hidden, micro_batch * seq
    full = work.block_workspace_bytes(m, micro_batch, seq, a, backward=True, mask=mask)
    end = work.backward_end_bytes(m, micro_batch, seq, a) - N * H * a
    return int(max(full - work.block_saved_bytes(m, micro_batch, seq, a), end))


def saved_backward_elementwise_bytes(m: ModelSpec, tokens: int, seq: int, a: int) -> int:
    """A BACKWARD_SAVED's elementwise traffic: the recomputing backward's less its forward's
    (those kernels ran in the kept FORWARD)."""
    return (work.block_elementwise_bytes(m, tokens, seq, a, backward=True)
            - work.block_elementwise_bytes(m, tokens, seq, a, backward=False))
