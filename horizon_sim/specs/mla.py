"""Multi-head latent attention (DeepSeek-V2/V3): the checks a ModelSpec's MLA fields must pass.

Shapes (n heads, H hidden): q = q_proj(x) (H -> n (nope + rope)), or through a bottleneck
q_b_proj(q_a_layernorm(q_a_proj(x))) (H -> q_lora_rank -> n (nope + rope)); the latent
kv_a_proj_with_mqa(x) (H -> kv_lora_rank + rope) split into c (kv_lora_rank, normed by
kv_a_layernorm) and k_rot (rope, one head shared by all); kv_b_proj(c) (kv_lora_rank -> n (nope +
v)) split per head into k_nope and v; RoPE on q's and k's rope parts; attention over q = [q_nope,
q_rot] and k = [k_nope, k_rot] (nope + rope wide: ModelSpec.head_dim), v (v_head_dim wide);
o_proj (n v -> H). The softmax scale is (nope + rope) ** -0.5, times YaRN's mscale squared when
the RoPE scaling has mscale_all_dim (specs/rope.py)."""
import math

from horizon_sim.errors import HorizonError

FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")


def check(m, fam) -> None:
    """One-line errors for MLA fields the spec's family cannot have, or that do not make an MLA."""
    for f in FIELDS:
        v = getattr(m, f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise HorizonError(f"model {f}={v!r} must be an integer >= 0")
    given = [f for f in FIELDS if getattr(m, f)]
    if not fam.mla:
        if given:
            raise HorizonError(f"model {given[0]}={getattr(m, given[0])}: family {m.family!r} has no multi-head latent "
                               "attention (deepseek_v2 and deepseek_v3 have)")
        return
    if not (m.kv_lora_rank and m.qk_rope_head_dim and m.v_head_dim):
        raise HorizonError(f"model {m.family}: kv_lora_rank, qk_rope_head_dim and v_head_dim must be > 0 (got "
                           f"{m.kv_lora_rank}, {m.qk_rope_head_dim}, {m.v_head_dim})")
    if m.qk_rope_head_dim >= m.hd:
        raise HorizonError(f"model {m.family}: head_dim={m.hd} (qk_nope_head_dim + qk_rope_head_dim) must exceed "
                           f"qk_rope_head_dim={m.qk_rope_head_dim}")
    if m.n_kv_heads != m.n_heads:
        raise HorizonError(f"model {m.family}: n_kv_heads={m.n_kv_heads} must equal n_heads={m.n_heads} (MLA "
                           "makes k and v for every head from the latent)")


def nope_dim(m) -> int:
    """qk_nope_head_dim: the unrotated part of each q/k head."""
    return m.hd - m.qk_rope_head_dim


def softmax_scale(m) -> float:
    """(nope + rope) ** -0.5, times YaRN's mscale(factor, mscale_all_dim) squared when the RoPE
    scaling sets mscale_all_dim (transformers' yarn_apply_mscale)."""
    scale = m.hd ** -0.5
    s = m.rope_scaling
    if s is not None and s.kind != "default" and s.mscale_all_dim:
        mscale = 0.1 * s.mscale_all_dim * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0
        scale *= mscale * mscale
    return scale
