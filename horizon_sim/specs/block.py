"""The decoder block, described once: its projections in the order the block runs them, every
tensor it holds under transformers' names and in transformers' order, and its other kernels
(norms, RoPE, attention, activation, residual adds) with their widths and what autograd keeps of
them. ModelSpec's parameter counts, the planner's GEMM shapes, elementwise bytes, saved bytes and
temporaries (schedule/work.py, which knows what each *kind* of kernel costs) and the executor's
weight layout (horizon_exec/model/layout.py) are all derived from here, so they cannot disagree.

A block (names relative to `model.layers.N.`): RMSNorm, q/k/v projections (biases: Qwen2), an
RMSNorm over each head of q and of k (Qwen3: `self_attn.q_norm`, `k_norm`), RoPE,
attention, o projection, residual, RMSNorm, then a gated MLP (gate, up, down; SwiGLU) or a plain
one (up, down), residual. An MoE block (specs/moe.py) replaces the MLP by a router (mlp.gate),
E experts stored as two 3-D tensors (mlp.experts.gate_up_proj (E, 2I, H), down_proj (E, H, I))
each run on the tokens routed to it, and (Qwen2-MoE) a sigmoid-gated shared expert. `plain` and `layernorm` (a weight and a bias per norm) describe
GPT-2-style models the planner prices for published comparisons; the executor runs the gated,
RMSNorm block only (horizon_exec/model/layers.py refuses the others by name)."""
import math
from dataclasses import dataclass
from functools import lru_cache

from horizon_sim.specs.moe import ROUTER_FIRST


@dataclass(frozen=True, slots=True)
class Projection:
    """y = x . W^T (+ b): W is (out_features, in_features); with `experts` E > 0, E such
    weights stacked in one (E, out, in) tensor, expert e applied to the tokens routed to it."""
    module: str
    """transformers' module path in the block, e.g. 'self_attn.q_proj'; for stacked experts
    the parameter's own name ('mlp.experts.gate_up_proj')."""
    in_features: int
    out_features: int
    bias: bool
    experts: int = 0
    """0: a Linear run on every token. E: routed experts (each token meets k of them)."""

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features * max(1, self.experts)

    @property
    def tensor(self) -> str:
        """The weight's parameter name."""
        return self.module if self.experts else f"{self.module}.weight"

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.experts, self.out_features, self.in_features) if self.experts \
            else (self.out_features, self.in_features)

    def active_params(self, top_k: int) -> int:
        """Weights one token meets: all of a Linear's, top_k experts' of a stacked tensor."""
        return self.in_features * self.out_features * (top_k if self.experts else 1)


NORMS = ("input_layernorm", "post_attention_layernorm")


@lru_cache(maxsize=256)  # the planner asks for a model's counts per unit of every step it builds
def projections(m) -> tuple[Projection, ...]:
    """The block's projections (a ModelSpec's), in the order its forward runs them."""
    H, F, q, kv = m.hidden, m.ffn_hidden, m.q_dim, m.kv_dim
    attn = (Projection("self_attn.q_proj", H, q, m.qkv_bias), Projection("self_attn.k_proj", H, kv, m.qkv_bias),
            Projection("self_attn.v_proj", H, kv, m.qkv_bias), Projection("self_attn.o_proj", q, H, False))
    if m.n_experts:
        return (*attn, *_moe_projections(m))
    mlp = (("gate_proj", H, F), ("up_proj", H, F), ("down_proj", F, H)) if m.ffn_type == "gated" \
        else (("up_proj", H, F), ("down_proj", F, H))
    return (*attn, *(Projection(f"mlp.{name}", i, o, m.mlp_bias) for name, i, o in mlp))


def _moe_projections(m) -> tuple[Projection, ...]:
    """An MoE MLP's in transformers' parameter order (the router first or last: specs/moe.py)."""
    H, E, I, S = m.hidden, m.n_experts, m.expert_ffn_hidden, m.shared_expert_ffn_hidden
    router = (Projection("mlp.gate", H, E, False),)
    experts = (Projection("mlp.experts.gate_up_proj", H, 2 * I, False, experts=E),
               Projection("mlp.experts.down_proj", I, H, False, experts=E))
    shared = (Projection("mlp.shared_expert.gate_proj", H, S, False), Projection("mlp.shared_expert.up_proj", H, S, False),
              Projection("mlp.shared_expert.down_proj", S, H, False),
              Projection("mlp.shared_expert_gate", H, 1, False)) if S else ()
    return (*router, *experts, *shared) if m.moe_family in ROUTER_FIRST else (*experts, *router, *shared)


def norm_tensors(m) -> tuple[str, ...]:
    """The tensors of one norm: RMSNorm a weight, LayerNorm a weight and a bias."""
    return ("weight", "bias") if m.norm == "layernorm" else ("weight",)


@lru_cache(maxsize=256)
def parameter_count(m) -> int:
    """Elements of every tensor of the block."""
    return sum(math.prod(shape) for _, shape in parameters(m))


@lru_cache(maxsize=256)
def parameters(m) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every tensor of the block, in transformers' order: each projection's
    weight then bias (the q/k norms after the attention's), then the norms."""
    out = []
    for p in projections(m):
        out.append((p.tensor, p.shape))
        if p.bias:
            out.append((f"{p.module}.bias", (p.out_features,)))
        if p.module == "self_attn.o_proj" and m.qk_norm:
            out += [("self_attn.q_norm.weight", (m.hd,)), ("self_attn.k_norm.weight", (m.hd,))]
    return (*out, *((f"{norm}.{t}", (m.hidden,)) for norm in NORMS for t in norm_tensors(m)))


KINDS = ("rmsnorm", "rope", "attention", "swiglu", "silu", "residual", "router", "dispatch", "combine", "gate_mul")
"""The kernel kinds schedule/work.py prices (bytes moved, saved, temporaries per element): a
block built from these needs no change there."""
PARTS = ("attention", "mlp")


@dataclass(frozen=True, slots=True)
class Kernel:
    """One non-GEMM step of the block's forward; its backward follows from its kind."""
    kind: str
    """One of KINDS."""
    part: str
    """'attention' or 'mlp': the half of the block it runs in (the temporaries' peaks are
    found per half, schedule/work.py)."""
    width: int
    """Elements per token of its input (attention: the query width)."""
    rows: int = 1
    """Rows per token a norm reduces over (1; a per-head norm: the heads). Attention: query heads.
    Router: the top-k it picks per token; dispatch and combine: the k routed rows per token."""
    kv_width: int = 0
    """Attention only: the key (and value) width."""
    fan_out: int = 1
    """Projections reading its output: the backward adds their fan_out input gradients."""
    output_saved: bool = False
    """A consumer (a projection) keeps its output for backward."""
    reads_block_input: bool = False
    """It reads the block's input x: in fp32 a norm's fp32 view of x is x itself, no temporary."""
    aux_loss: bool = False
    """Router only: it also feeds the load-balancing loss (router_aux_loss_coef > 0): its
    probabilities summed per expert, and that sum's gradient added into theirs."""
    routed: bool = False
    """It runs on an MoE block's routed rows, expert by expert (the dispatch, the experts'
    activation, the combine): the backward frees what it saved expert by expert, while the
    experts' weight gradients build up (schedule/work.py prices that loop's two ends)."""

    @property
    def weight(self) -> int:
        """Elements of its weight (a norm's, shared by its rows)."""
        return self.width // self.rows if self.kind == "rmsnorm" else 0


@lru_cache(maxsize=256)
def kernels(m) -> tuple[Kernel, ...]:
    """The block's non-GEMM kernels in forward order (horizon_exec/model/layers.py runs them):
    RMSNorm (its output read by q, k and v), per-head RMSNorms of q and k (Qwen3), RoPE on q and
    on k, attention, the residual add;
    RMSNorm (read by gate and up, or up alone), the activation, the residual add. A LayerNorm
    block is priced as RMSNorm (the published GPT-2 rows; the executor refuses it)."""
    H, F = m.hidden, m.ffn_hidden
    gated = m.ffn_type == "gated"
    if m.n_experts:
        return (*_attention_kernels(m), *_moe_kernels(m))
    return (*_attention_kernels(m),
            Kernel("rmsnorm", "mlp", H, fan_out=2 if gated else 1, output_saved=True),
            Kernel("swiglu" if gated else "silu", "mlp", F),
            Kernel("residual", "mlp", H))


def _attention_kernels(m) -> tuple[Kernel, ...]:
    H = m.hidden
    qk_norms = (Kernel("rmsnorm", "attention", m.q_dim, rows=m.n_heads),
                Kernel("rmsnorm", "attention", m.kv_dim, rows=m.n_kv_heads)) if m.qk_norm else ()
    return (Kernel("rmsnorm", "attention", H, fan_out=3, output_saved=True, reads_block_input=True),
            *qk_norms, Kernel("rope", "attention", m.q_dim), Kernel("rope", "attention", m.kv_dim),
            Kernel("attention", "attention", m.q_dim, rows=m.n_heads, kv_width=m.kv_dim),
            Kernel("residual", "attention", H))


def _moe_kernels(m) -> tuple[Kernel, ...]:
    """The MoE half, per token: the norm (read by the router, the dispatch, and the shared
    expert's gate, up and sigmoid gate), the router (softmax over E, top-k, renormalise), the
    dispatch (each token's row gathered for its k experts: k H wide), the experts' SwiGLU
    (k I wide), the combine (each expert row scaled by its routing weight and added into the
    output: k H wide), the shared expert's SwiGLU and its sigmoid gate (Qwen2-MoE), the residual."""
    H, k, S = m.hidden, m.experts_per_token, m.shared_expert_ffn_hidden
    shared = (Kernel("swiglu", "mlp", S), Kernel("gate_mul", "mlp", H)) if S else ()
    return (Kernel("rmsnorm", "mlp", H, fan_out=2 + (3 if S else 0), output_saved=True),
            Kernel("router", "mlp", m.n_experts, rows=k, aux_loss=m.router_aux_loss_coef > 0),
            Kernel("dispatch", "mlp", k * H, rows=k, routed=True),
            Kernel("swiglu", "mlp", k * m.expert_ffn_hidden, routed=True),
            Kernel("combine", "mlp", k * H, rows=k, routed=True),
            *shared,
            Kernel("residual", "mlp", H))
