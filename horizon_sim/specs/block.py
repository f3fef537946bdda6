"""The decoder block's parameters, described once: its projections in the order the block runs
them, and every tensor it holds under transformers' names and in transformers' order. ModelSpec's
parameter counts, the planner's GEMM shapes (schedule/work.py) and the executor's weight layout
(horizon_exec/model/layout.py) are all derived from here, so they cannot disagree.

A block (names relative to `model.layers.N.`): RMSNorm, q/k/v projections (biases: Qwen2), RoPE,
attention, o projection, residual, RMSNorm, then a gated MLP (gate, up, down; SwiGLU) or a plain
one (up, down), residual. `plain` and `layernorm` (a weight and a bias per norm) describe
GPT-2-style models the planner prices for published comparisons; the executor runs the gated,
RMSNorm block only (horizon_exec/model/layers.py refuses the others by name)."""
import math
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class Projection:
    """y = x . W^T (+ b): W is (out_features, in_features)."""
    module: str
    """transformers' module path in the block, e.g. 'self_attn.q_proj'."""
    in_features: int
    out_features: int
    bias: bool

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features


NORMS = ("input_layernorm", "post_attention_layernorm")


@lru_cache(maxsize=256)  # the planner asks for a model's counts per unit of every step it builds
def projections(m) -> tuple[Projection, ...]:
    """The block's projections (a ModelSpec's), in the order its forward runs them."""
    H, F, q, kv = m.hidden, m.ffn_hidden, m.q_dim, m.kv_dim
    mlp = (("gate_proj", H, F), ("up_proj", H, F), ("down_proj", F, H)) if m.ffn_type == "gated" \
        else (("up_proj", H, F), ("down_proj", F, H))
    return (Projection("self_attn.q_proj", H, q, m.qkv_bias), Projection("self_attn.k_proj", H, kv, m.qkv_bias),
            Projection("self_attn.v_proj", H, kv, m.qkv_bias), Projection("self_attn.o_proj", q, H, False),
            *(Projection(f"mlp.{name}", i, o, m.mlp_bias) for name, i, o in mlp))


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
    weight then bias, then the norms."""
    out = []
    for p in projections(m):
        out.append((f"{p.module}.weight", (p.out_features, p.in_features)))
        if p.bias:
            out.append((f"{p.module}.bias", (p.out_features,)))
    return (*out, *((f"{norm}.{t}", (m.hidden,)) for norm in NORMS for t in norm_tensors(m)))
