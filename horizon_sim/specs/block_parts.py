"""The pieces a family's decoder block is described with (families/<name>.py composes them):
projections (y = x . W^T + b, Linear or stacked experts), the non-GEMM kernels with their widths
and what autograd keeps of them, and the builders the families share: the attention half (with
or without q/k norms), a gated or plain MLP, an MoE MLP, and the block's tensors in
transformers' order. Everything the planner prices per kind (schedule/work.py,
kernel_bytes.py) is a Kernel of one of KINDS, so a family built from these needs no change there."""
import math
from dataclasses import dataclass


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
    transposed: bool = False
    """The weight is stored (in_features, out_features): GPT-2's Conv1D, gpt-oss's experts
    ((E, in, out) stacked)."""
    inner: bool = False
    """It reads a tensor made inside its half (the attention's output, the MLP's activation),
    not the half's normed input, which the half's other projections share."""

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features * max(1, self.experts)

    @property
    def params(self) -> int:
        """Its weight's elements and its bias's."""
        return self.weight_params + (self.out_features * max(1, self.experts) if self.bias else 0)

    @property
    def tensor(self) -> str:
        """The weight's parameter name."""
        return self.module if self.experts else f"{self.module}.weight"

    @property
    def shape(self) -> tuple[int, ...]:
        one = (self.in_features, self.out_features) if self.transposed else (self.out_features, self.in_features)
        return (self.experts, *one) if self.experts else one

    @property
    def bias_tensor(self) -> tuple[str, tuple[int, ...]]:
        """Its bias's (name, shape): `<module>.bias`, or a stacked experts' `<module>_bias` (E, out)."""
        if self.experts:
            return f"{self.module}_bias", (self.experts, self.out_features)
        return f"{self.module}.bias", (self.out_features,)

    def active_params(self, top_k: int) -> int:
        """Weights one token meets: all of a Linear's, top_k experts' of a stacked tensor."""
        return self.in_features * self.out_features * (top_k if self.experts else 1)


KINDS = ("rmsnorm", "layernorm", "rope", "attention", "swiglu", "clamped_swiglu", "silu", "residual", "router",
         "dispatch", "combine", "gate_mul", "split")
"""The kernel kinds schedule/work.py prices (bytes moved, saved, temporaries per element): a
block built from these needs no change there."""
PARTS = ("attention", "mlp")
NORM_KINDS = ("rmsnorm", "layernorm")
"""RMSNorm (a weight), LayerNorm (a weight and a bias: GPT-NeoX, GPT-2)."""


@dataclass(frozen=True, slots=True)
class Kernel:
    """One non-GEMM step of the block's forward; its backward follows from its kind."""
    kind: str
    """One of KINDS. 'silu' is any plain (non-gated) activation of one input: SiLU, or GELU
    (erf or tanh), which read, write and keep the same bytes. 'clamped_swiglu' is gpt-oss's
    experts' gate: (clamp(up) + 1) * g * sigmoid(alpha g), g = clamp(gate), one fused autograd
    function (horizon_exec/model/gpt_oss_experts.py) that keeps only its input."""
    part: str
    """'attention' or 'mlp': the half of the block it runs in (the temporaries' peaks are
    found per half, schedule/work.py)."""
    width: int
    """Elements per token of its input (attention: the query width)."""
    rows: int = 1
    """Rows per token a norm reduces over (1; a per-head norm: the heads). Attention: query heads.
    Router: the top-k it picks per token; dispatch and combine: the k routed rows per token."""
    softcap: bool = False
    """Attention only: its scores are soft-capped (Gemma 2), so it runs in chunks of query rows
    (horizon_exec/model/softcap_attention.py) instead of SDPA."""
    sinks: bool = False
    """Attention only: each head's softmax has one more learned logit, a sink that takes
    probability and gives no value (gpt-oss), which SDPA cannot do: it runs in the same chunks."""
    kv_width: int = 0
    """Attention: the key (and value) width. Split: the part of a fused projection's output the
    forward copies out (Phi-3's v, made contiguous)."""
    v_width: int = 0
    """Attention: the value width and the output's, when they differ from kv_width and width
    (MLA: n_heads x v_head_dim); 0 = as wide as the keys and the queries."""
    input_width: int = 0
    """Router: the width of its input when it computes in fp32 (DeepSeek's): the fp32 copy of its
    input it keeps for its weight's gradient (none when the block computes in fp32). RMSNorm: the
    width of the tensor its input is a slice of (MLA's latent, whose norm reads its first
    kv_lora_rank columns), which it keeps whole where it keeps its input itself (in fp32)."""
    sigmoid: bool = False
    """Router only: scores are the logits' sigmoids (DeepSeek-V3), the top-k picked by the scores
    plus a correction bias within groups, instead of a softmax over all E."""
    fan_out: int = 1
    """Projections reading its output: the backward adds their fan_out input gradients."""
    output_saved: bool = False
    """A consumer (a projection) keeps its output for backward (a norm's; a residual add's when
    the MLP reads x1 with no norm between: OLMo-2)."""
    fp32_weight: bool = False
    """A norm that multiplies its weight into the fp32 normalised rows and then casts back
    (OLMo-2, Gemma): autograd keeps the fp32 rows instead of the cast."""
    unit_offset: bool = False
    """A norm whose weight is an offset from one (Gemma: times 1 + w, made in fp32 per call and
    kept for the backward)."""
    reads_block_input: bool = False
    """It reads the block's input x: in fp32 a norm's fp32 view of x is x itself, no temporary."""
    aux_loss: bool = False
    """Router only: it also feeds the load-balancing loss (router_aux_loss_coef > 0): its
    probabilities summed per expert, and that sum's gradient added into theirs."""
    rotary: float = 1.0
    """RoPE only: the fraction of each head it rotates (ModelSpec.rotary_fraction); the rest
    pass through (the tables are 1 and 0 there), width still the whole heads'."""
    grad_copied: bool = True
    """RoPE only: its input's gradient is copied back out of the attention's layout (q and k
    viewed from a (B, T, width) projection); False when the projection's output is already
    (B, T, heads, hd) and a fused split takes the gradient as it is (GPT-NeoX)."""
    renormalised: bool = True
    """Router only: its k weights are divided by their sum (norm_topk_prob), which keeps the
    top-k values and their sum for the backward."""
    topk_first: bool = False
    """Router only: top-k of the logits, then a softmax over those k in the compute dtype
    (gpt-oss), instead of a softmax over all E in fp32 and top-k of the probabilities."""
    routed: bool = False
    """It runs on an MoE block's routed rows, expert by expert (the dispatch, the experts'
    activation, the combine): the backward frees what it saved expert by expert, while the
    experts' weight gradients build up (schedule/work.py prices that loop's two ends)."""

    @property
    def chunked(self) -> bool:
        """Attention run in chunks of query rows (soft-capped scores, or sinks), not by SDPA."""
        return self.softcap or self.sinks

    @property
    def weight(self) -> int:
        """Elements of its weight (a norm's, shared by its rows)."""
        if self.kind == "layernorm":
            return 2 * self.width  # its weight and its bias
        return self.width // self.rows if self.kind == "rmsnorm" else 0


ROUTERS = ("mlp.gate", "mlp.router")
"""An MoE router's module name (Qwen's and Mixtral's mlp.gate, gpt-oss's mlp.router): a TopKRouter
module in transformers 5, not a Linear (adapters skip it)."""
NORMS = ("input_layernorm", "post_attention_layernorm")
"""The block's two norms under transformers' Llama names: before attention, before the MLP."""


# ---- projections --------------------------------------------------------------------------
def attention_projections(m, qkv_bias: bool) -> tuple[Projection, ...]:
    """q, k, v (biases: Qwen2's) and o (never a bias), as the attention half runs them."""
    H, q, kv = m.hidden, m.q_dim, m.kv_dim
    return (Projection("self_attn.q_proj", H, q, qkv_bias), Projection("self_attn.k_proj", H, kv, qkv_bias),
            Projection("self_attn.v_proj", H, kv, qkv_bias), Projection("self_attn.o_proj", q, H, False, inner=True))


def gated_mlp_projections(m, bias: bool) -> tuple[Projection, ...]:
    """SwiGLU: gate and up (H -> F), down (F -> H)."""
    H, F = m.hidden, m.ffn_hidden
    return (Projection("mlp.gate_proj", H, F, bias), Projection("mlp.up_proj", H, F, bias),
            Projection("mlp.down_proj", F, H, bias, inner=True))


def plain_mlp_projections(m, bias: bool) -> tuple[Projection, ...]:
    """A non-gated MLP: up (H -> F), down (F -> H)."""
    H, F = m.hidden, m.ffn_hidden
    return Projection("mlp.up_proj", H, F, bias), Projection("mlp.down_proj", F, H, bias, inner=True)


def moe_projections(m, router_first: bool) -> tuple[Projection, ...]:
    """An MoE MLP's in transformers' parameter order: the router (mlp.gate) before or after the
    experts (two stacked tensors), then a shared expert with its sigmoid gate when
    m.shared_expert_ffn_hidden > 0."""
    H, E, I, S = m.hidden, m.n_experts, m.expert_ffn_hidden, m.shared_expert_ffn_hidden
    router = (Projection("mlp.gate", H, E, False),)
    experts = (Projection("mlp.experts.gate_up_proj", H, 2 * I, False, experts=E),
               Projection("mlp.experts.down_proj", I, H, False, experts=E, inner=True))
    shared = (Projection("mlp.shared_expert.gate_proj", H, S, False), Projection("mlp.shared_expert.up_proj", H, S, False),
              Projection("mlp.shared_expert.down_proj", S, H, False, inner=True),
              Projection("mlp.shared_expert_gate", H, 1, False)) if S else ()
    return (*router, *experts, *shared) if router_first else (*experts, *router, *shared)


def block_tensors(m, projections, norm_tensors=("weight",), qk_norm: bool = False) -> tuple:
    """(name, shape) of every tensor of the block in transformers' order: each projection's
    weight then bias (per-head q/k norms, Qwen3's, after the attention's), then the two norms."""
    out = []
    for p in projections:
        out.append((p.tensor, p.shape))
        if p.bias:
            out.append(p.bias_tensor)
        if p.module == "self_attn.o_proj" and qk_norm:
            out += [("self_attn.q_norm.weight", (m.hd,)), ("self_attn.k_norm.weight", (m.hd,))]
    return (*out, *((f"{norm}.{t}", (m.hidden,)) for norm in NORMS for t in norm_tensors))


def tensor_elements(tensors) -> int:
    return sum(math.prod(shape) for _, shape in tensors)


# ---- kernels ------------------------------------------------------------------------------
def attention_kernels(m, qk_norm: bool, readers: int = 3, rope: bool = True) -> tuple[Kernel, ...]:
    """The attention half: RMSNorm (its output read by q, k and v: `readers` projections, 1 when
    they are one fused projection), per-head RMSNorms of q and k (Qwen3), RoPE on q and on k
    (none with learned positions; over the whole heads, a part of each rotated when
    m.rotary_fraction < 1), attention, the residual add."""
    H = m.hidden
    qk_norms = (Kernel("rmsnorm", "attention", m.q_dim, rows=m.n_heads),
                Kernel("rmsnorm", "attention", m.kv_dim, rows=m.n_kv_heads)) if qk_norm else ()
    ropes = (Kernel("rope", "attention", m.q_dim, rotary=m.rotary_fraction),
             Kernel("rope", "attention", m.kv_dim, rotary=m.rotary_fraction)) if rope else ()
    return (Kernel("rmsnorm", "attention", H, fan_out=readers, output_saved=True, reads_block_input=True),
            *qk_norms, *ropes,
            Kernel("attention", "attention", m.q_dim, rows=m.n_heads, kv_width=m.kv_dim),
            Kernel("residual", "attention", H))


def dense_mlp_kernels(m, gated: bool, fused: bool = False) -> tuple[Kernel, ...]:
    """The MLP half: RMSNorm (read by gate and up, or by up alone or by one fused gate_up), the
    activation, the residual."""
    H, F = m.hidden, m.ffn_hidden
    return (Kernel("rmsnorm", "mlp", H, fan_out=2 if gated and not fused else 1, output_saved=True),
            Kernel("swiglu" if gated else "silu", "mlp", F),
            Kernel("residual", "mlp", H))


def moe_kernels(m) -> tuple[Kernel, ...]:
    """The MoE half, per token: the norm (read by the router, the dispatch, and the shared
    expert's gate, up and sigmoid gate), the router (softmax over E, top-k, renormalise), the
    dispatch (each token's row gathered for its k experts: k H wide), the experts' SwiGLU
    (k I wide), the combine (each expert row scaled by its routing weight and added into the
    output: k H wide), the shared expert's SwiGLU and its sigmoid gate (Qwen2-MoE), the residual."""
    H, k, S = m.hidden, m.experts_per_token, m.shared_expert_ffn_hidden
    shared = (Kernel("swiglu", "mlp", S), Kernel("gate_mul", "mlp", H)) if S else ()
    return (Kernel("rmsnorm", "mlp", H, fan_out=2 + (3 if S else 0), output_saved=True),
            Kernel("router", "mlp", m.n_experts, rows=k, aux_loss=m.router_aux_loss_coef > 0,
                   renormalised=m.norm_topk_prob),
            Kernel("dispatch", "mlp", k * H, rows=k, routed=True),
            Kernel("swiglu", "mlp", k * m.expert_ffn_hidden, routed=True),
            Kernel("combine", "mlp", k * H, rows=k, routed=True),
            *shared,
            Kernel("residual", "mlp", H))
