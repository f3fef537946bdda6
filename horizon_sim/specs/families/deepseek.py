"""DeepSeek-V2 (DeepseekV2ForCausalLM, deepseek_v2; V2-Lite too) and DeepSeek-V3
(DeepseekV3ForCausalLM, deepseek_v3).

Attention: multi-head latent attention (specs/mla.py): q from q_proj, or through the q_a_proj ->
q_a_layernorm -> q_b_proj bottleneck (q_lora_rank); a latent kv_a_proj_with_mqa(x) split into c
(kv_lora_rank, kv_a_layernorm) and one shared rotated key part; kv_b_proj(c) -> each head's
unrotated key and value; RoPE on the last qk_rope_head_dim dimensions of q and of the shared key
(V2 in fp32 on interleaved pairs, V3 in the activation dtype on interleaved pairs taken apart:
either way a permutation both q and k share, so the same scores); softmax scale from the q/k head
width and YaRN's mscale; o_proj from the heads' values.

MLP: the first first_dense_layers blocks a dense SwiGLU (intermediate_size), the others an MoE:
routed experts (stacked, as Qwen's) chosen by a router (mlp.gate, no bias) with expert groups,
the routing weights times routed_scaling_factor, plus shared experts (n_shared_experts x
moe_intermediate_size wide, one dense SwiGLU, added ungated). V2: softmax scores, greedy top-k
or top-k within the topk_group groups of highest best score (group_limited_greedy), no
renormalisation. V3: sigmoid scores, the top-k picked by the scores plus a per-expert correction
bias (mlp.gate.e_score_correction_bias: a buffer, not a parameter; no gradient moves it) within
the topk_group groups of highest top-two sum (noaux_tc), then renormalised (norm_topk_prob).
Both routers compute in fp32 and return fp32 weights (MoeTraits.fp32_routing_weights).

HF config: num_key_value_heads is not read (MLA makes k and v for every head; transformers uses it
only in its eager attention's repeat of them), q_lora_rank (null: q_proj), kv_lora_rank,
qk_rope_head_dim, qk_nope_head_dim (head_dim = nope + rope; the config's head_dim and qk_head_dim
are what transformers derives), v_head_dim,
first_k_dense_replace, n_routed_experts, n_shared_experts (x moe_intermediate_size ->
shared_expert_ffn_hidden), num_experts_per_tok, n_group / topk_group (-> expert_groups,
topk_groups), routed_scaling_factor, norm_topk_prob (V3), topk_method (V2: greedy or
group_limited_greedy), rope_interleave (V3: true). The hub's own fields transformers does not
read (aux_loss_alpha, seq_aux, scoring_func, topk_method of V3, moe_layer_freq, ep_size) are
checked where they describe the model (scoring_func, moe_layer_freq) and otherwise ignored as
transformers ignores them; num_nextn_predict_layers (V3's multi-token-prediction layer, which
transformers does not build) is accepted, and that layer's tensors are dropped on load with a
message (checkpoints/hf_checkpoint.extra_layers)."""
from dataclasses import replace

from horizon_sim.errors import HorizonError
from horizon_sim.specs.block_parts import Kernel, Projection, block_tensors, dense_mlp_kernels, gated_mlp_projections
from horizon_sim.specs.families.family import ModelFamily, MoeTraits
from horizon_sim.specs.hf_families import HfFamily, defaults_with
from horizon_sim.specs.hf_values import as_bool, as_float, as_int


def _attention(m):
    H, n, hd, r = m.hidden, m.n_heads, m.hd, m.qk_rope_head_dim
    b, v = m.qkv_bias, m.v_head_dim
    q = ((Projection("self_attn.q_a_proj", H, m.q_lora_rank, b),
          Projection("self_attn.q_b_proj", m.q_lora_rank, n * hd, False, inner=True))
         if m.q_lora_rank else (Projection("self_attn.q_proj", H, n * hd, False),))
    return (*q, Projection("self_attn.kv_a_proj_with_mqa", H, m.kv_lora_rank + r, b),
            Projection("self_attn.kv_b_proj", m.kv_lora_rank, n * (hd - r + v), False, inner=True),
            Projection("self_attn.o_proj", n * v, H, b, inner=True))


def _moe(m):
    """The MoE MLP in transformers' order: the experts, the router, the shared experts."""
    H, E, I, S = m.hidden, m.n_experts, m.expert_ffn_hidden, m.shared_expert_ffn_hidden
    return (Projection("mlp.experts.gate_up_proj", H, 2 * I, False, experts=E),
            Projection("mlp.experts.down_proj", I, H, False, experts=E, inner=True),
            Projection("mlp.gate", H, E, False),
            Projection("mlp.shared_experts.gate_proj", H, S, False), Projection("mlp.shared_experts.up_proj", H, S, False),
            Projection("mlp.shared_experts.down_proj", S, H, False, inner=True))


def projections(m):
    return (*_attention(m), *(_moe(m) if m.n_experts else gated_mlp_projections(m, m.mlp_bias)))


def kernels(m):
    """The attention half: the block's norm (read by the q and the latent projections), the q
    bottleneck's norm, the latent's norm, RoPE on q's and the shared key's rotated parts, q put
    together (its parts copied into one tensor) and the keys (every head's unrotated part and
    the shared rotated one), attention (q and k nope + rope wide, v and o v_head_dim wide), the
    residual. The MLP half: dense SwiGLU, or the router, the routed experts and the shared
    experts' SwiGLU added in."""
    H, n, hd, r = m.hidden, m.n_heads, m.hd, m.qk_rope_head_dim
    q_norm = (Kernel("rmsnorm", "attention", m.q_lora_rank, output_saved=True),) if m.q_lora_rank else ()
    attn = (Kernel("rmsnorm", "attention", H, fan_out=2, output_saved=True, reads_block_input=True),
            *q_norm, Kernel("rmsnorm", "attention", m.kv_lora_rank, output_saved=True, input_width=m.kv_lora_rank + r),
            Kernel("rope", "attention", n * r), Kernel("rope", "attention", r),
            Kernel("split", "attention", n * hd, kv_width=n * hd), Kernel("split", "attention", n * hd, kv_width=n * hd),
            Kernel("attention", "attention", n * hd, rows=n, kv_width=n * hd, v_width=m.v_dim),
            Kernel("residual", "attention", H))
    if not m.n_experts:
        return (*attn, *dense_mlp_kernels(m, gated=True))
    k, S = m.experts_per_token, m.shared_expert_ffn_hidden
    return (*attn,
            Kernel("rmsnorm", "mlp", H, fan_out=4, output_saved=True),
            Kernel("router", "mlp", m.n_experts, rows=k, renormalised=m.norm_topk_prob, input_width=H,
                   sigmoid=_sigmoid(m)),
            Kernel("dispatch", "mlp", k * H, rows=k, routed=True),
            Kernel("swiglu", "mlp", k * m.expert_ffn_hidden, routed=True),
            Kernel("combine", "mlp", k * H, rows=k, routed=True),
            Kernel("swiglu", "mlp", S), Kernel("residual", "mlp", H), Kernel("residual", "mlp", H))


def tensors(m):
    """Every projection's weight (and bias), the q bottleneck's and the latent's norms after
    their projections, then the block's two norms: transformers' order."""
    out = []
    for p in projections(m):
        out += block_tensors(m, (p,), norm_tensors=())
        if p.module == "self_attn.q_a_proj":
            out.append(("self_attn.q_a_layernorm.weight", (m.q_lora_rank,)))
        elif p.module == "self_attn.kv_a_proj_with_mqa":
            out.append(("self_attn.kv_a_layernorm.weight", (m.kv_lora_rank,)))
    return (*out, ("input_layernorm.weight", (m.hidden,)), ("post_attention_layernorm.weight", (m.hidden,)))


def _sigmoid(m) -> bool:
    """V3's router: sigmoid scores with a correction bias (MoeTraits.scoring)."""
    from horizon_sim.specs.families import family
    return family(m.family).moe.scoring == "sigmoid"


def buffers(m):
    """Tensors a block holds that are not parameters (transformers' persistent buffers): V3's
    MoE blocks' router correction bias, fp32."""
    return (("mlp.gate.e_score_correction_bias", (m.n_experts,)),) if m.n_experts and _sigmoid(m) else ()


def _check(m) -> None:
    if m.n_experts and m.mlp_bias:
        raise HorizonError(f"model {m.family}: mlp_bias=True (biases on the dense and shared MLPs) is not supported")
    if _sigmoid(m) and m.expert_groups and m.n_experts // m.expert_groups < 2:
        raise HorizonError(f"model deepseek_v3: a group's score is its best two experts': expert_groups="
                           f"{m.expert_groups} leaves {m.n_experts // m.expert_groups} per group (want >= 2)")


# ---- HF config ---------------------------------------------------------------------------------
_SHARED_FIELDS = frozenset({
    "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "qk_head_dim",
    "first_k_dense_replace", "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
    "num_experts_per_tok", "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "attention_bias",
    "output_router_logits", "head_dim", "mlp_bias",
    # the hub's own fields: aux_loss_alpha and seq_aux (an aux loss transformers does not add), ep_size
    # (expert parallelism), moe_layer_freq (checked: 1), scoring_func and topk_method (checked)
    "aux_loss_alpha", "seq_aux", "ep_size", "moe_layer_freq", "scoring_func", "topk_method",
})


def _read_shared(cfg: dict, where: str, n_layers: int, mt: str) -> dict:
    if as_bool(cfg, "mlp_bias", where, False):
        raise HorizonError(f"{where}: mlp_bias = true (biases on the dense and shared MLPs) is not supported")
    if (f := cfg.get("moe_layer_freq", 1)) != 1:
        raise HorizonError(f"{where}: moe_layer_freq = {f!r}: MoE blocks every {f} blocks are not supported (want 1)")
    nope, rope = as_int(cfg, "qk_nope_head_dim", where), as_int(cfg, "qk_rope_head_dim", where)
    heads = as_int(cfg, "num_attention_heads", where)  # (num_key_value_heads: MLA makes k and v for every head)
    E = as_int(cfg, "n_routed_experts", where, minimum=0)
    groups = as_int(cfg, "n_group", where) if cfg.get("n_group") is not None else 0
    topk_groups = as_int(cfg, "topk_group", where) if cfg.get("topk_group") is not None else 0
    if groups == 1:  # one group of every expert: no groups
        groups = topk_groups = 0
    out = dict(kv_lora_rank=as_int(cfg, "kv_lora_rank", where), qk_rope_head_dim=rope,
               q_lora_rank=as_int(cfg, "q_lora_rank", where) if cfg.get("q_lora_rank") is not None else 0,
               v_head_dim=as_int(cfg, "v_head_dim", where), head_dim=nope + rope, n_kv_heads=heads,
               qkv_bias=as_bool(cfg, "attention_bias", where, False))
    first = as_int(cfg, "first_k_dense_replace", where, minimum=0)
    if not E or first >= n_layers:  # no MoE block (transformers' layers from first_k_dense_replace on): dense
        return out
    I = as_int(cfg, "moe_intermediate_size", where)
    return dict(out, n_experts=E, experts_per_token=as_int(cfg, "num_experts_per_tok", where), expert_ffn_hidden=I,
                shared_expert_ffn_hidden=as_int(cfg, "n_shared_experts", where) * I,
                first_dense_layers=first,
                expert_groups=groups, topk_groups=topk_groups,
                routed_scaling=as_float(cfg["routed_scaling_factor"], "routed_scaling_factor", where, strict=False))


def _read_v2(cfg: dict, where: str, n_layers: int) -> dict:
    out = _read_shared(cfg, where, n_layers, "deepseek_v2")
    method = cfg.get("topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy"):
        raise HorizonError(f"{where}: topk_method = {method!r}; DeepseekV2 runs 'greedy' or 'group_limited_greedy'")
    if as_bool(cfg, "norm_topk_prob", where, False):
        raise HorizonError(f"{where}: norm_topk_prob = true: transformers' DeepseekV2 router does not renormalise "
                           "(the released V2 configs set false)")
    if cfg.get("scoring_func", "softmax") != "softmax":
        raise HorizonError(f"{where}: scoring_func = {cfg['scoring_func']!r}; DeepseekV2 scores by softmax")
    if "n_experts" in out and method == "greedy":  # one group of every expert
        out.update(expert_groups=0, topk_groups=0)
    return out


def _read_v3(cfg: dict, where: str, n_layers: int) -> dict:
    out = _read_shared(cfg, where, n_layers, "deepseek_v3")
    if not as_bool(cfg, "rope_interleave", where, True):
        raise HorizonError(f"{where}: rope_interleave = false is not supported (the released V3 weights are interleaved)")
    if cfg.get("scoring_func", "sigmoid") != "sigmoid" or cfg.get("topk_method", "noaux_tc") != "noaux_tc":
        raise HorizonError(f"{where}: scoring_func = {cfg.get('scoring_func')!r}, topk_method = "
                           f"{cfg.get('topk_method')!r}; DeepseekV3 routes by sigmoid scores (noaux_tc)")
    if "n_experts" in out:
        out["norm_topk_prob"] = as_bool(cfg, "norm_topk_prob", where, True)
    return out


def _export(spec, v3: bool) -> dict:
    d = {"q_lora_rank": spec.q_lora_rank or None, "kv_lora_rank": spec.kv_lora_rank,
         "qk_rope_head_dim": spec.qk_rope_head_dim, "qk_nope_head_dim": spec.hd - spec.qk_rope_head_dim,
         "v_head_dim": spec.v_head_dim, "attention_bias": spec.qkv_bias, "n_routed_experts": spec.n_experts,
         "first_k_dense_replace": spec.first_dense_layers, "moe_intermediate_size": spec.expert_ffn_hidden,
         "num_experts_per_tok": spec.experts_per_token or None,
         "n_shared_experts": spec.shared_expert_ffn_hidden // spec.expert_ffn_hidden if spec.n_experts else 0,
         "n_group": spec.expert_groups or (1 if v3 else None), "topk_group": spec.topk_groups or (1 if v3 else None),
         "routed_scaling_factor": spec.routed_scaling}
    if v3:
        d.update(norm_topk_prob=spec.norm_topk_prob, rope_interleave=True)
    else:
        d.update(topk_method="group_limited_greedy" if spec.expert_groups else "greedy", norm_topk_prob=False,
                 mlp_bias=False)
    return d


def _preset_v3() -> dict:
    # deepseek-ai/DeepSeek-V3 config.json (and DeepSeek-V3 technical report, arXiv 2412.19437): 61
    # layers of 7168, the first 3 dense (18432), 128 heads, q_lora_rank 1536, kv_lora_rank 512, head
    # 128 + 64 rotated, v 128; 256 routed experts of 2048 and 1 shared, 8 per token from 4 of 8
    # groups, routed_scaling_factor 2.5, vocabulary 129280, YaRN factor 40 over 4096 (beta 32 / 1,
    # mscale 1, mscale_all_dim 1), rope_theta 10000, 163840 positions, untied. The report: 671B
    # total, 37B activated per token (its count leaves out the embedding and the MTP module).
    from horizon_sim.specs.rope import RopeScaling
    return dict(name="deepseek-v3", n_layers=61, hidden=7168, n_heads=128, n_kv_heads=128, head_dim=192,
                ffn_hidden=18432, vocab=129280, norm_eps=1e-6, rope_theta=10000.0, max_position=163840,
                rope_scaling=RopeScaling(kind="yarn", factor=40.0, original_max_position=4096, beta_fast=32.0,
                                         beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
                kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, first_dense_layers=3,
                n_experts=256, experts_per_token=8, expert_ffn_hidden=2048, shared_expert_ffn_hidden=2048,
                norm_topk_prob=True, expert_groups=8, topk_groups=4, routed_scaling=2.5)


def _preset_v2(name: str, **kw) -> dict:
    from horizon_sim.specs.rope import RopeScaling
    return dict(name=name, n_heads=kw.pop("heads"), n_kv_heads=kw.pop("kv_heads"), head_dim=192, vocab=102400,
                norm_eps=1e-6, rope_theta=10000.0, max_position=163840,
                rope_scaling=RopeScaling(kind="yarn", factor=40.0, original_max_position=4096, beta_fast=32.0,
                                         beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707),
                kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128, first_dense_layers=1, norm_topk_prob=False, **kw)


PRESETS_V2 = (
    # deepseek-ai/DeepSeek-V2 config.json (DeepSeek-V2 report, arXiv 2405.04434: 236B total, 21B activated):
    # 60 layers of 5120, the first dense (12288), 128 heads, q_lora_rank 1536, 160 routed experts of 1536
    # and 2 shared, 6 per token from 3 of 8 groups (group_limited_greedy), routed_scaling_factor 16,
    # YaRN factor 40 (mscale 0.707), 163840 positions.
    _preset_v2("deepseek-v2", n_layers=60, hidden=5120, heads=128, kv_heads=128, ffn_hidden=12288, q_lora_rank=1536,
               n_experts=160, experts_per_token=6, expert_ffn_hidden=1536, shared_expert_ffn_hidden=3072,
               expert_groups=8, topk_groups=3, routed_scaling=16.0),
    # deepseek-ai/DeepSeek-V2-Lite config.json (the report: 15.7B total, 2.4B activated): 27 layers of
    # 2048, the first dense (10944), 16 heads, q_proj (no q_lora_rank), 64 routed experts of 1408 and 2
    # shared, 6 per token (greedy), routed_scaling_factor 1.
    _preset_v2("deepseek-v2-lite", n_layers=27, hidden=2048, heads=16, kv_heads=16, ffn_hidden=10944,
               n_experts=64, experts_per_token=6, expert_ffn_hidden=1408, shared_expert_ffn_hidden=2816),
)

_COMMON_V = dict(num_key_value_heads=None, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
                 attention_bias=False, attention_dropout=0.0, output_router_logits=False)
HF_V2 = HfFamily(
    "deepseek_v2", "DeepseekV2ForCausalLM",
    defaults_with(**_COMMON_V, vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, max_position_embeddings=2048, mlp_bias=False, first_k_dense_replace=0,
                  kv_lora_rank=512, q_lora_rank=1536, n_group=None, n_routed_experts=64, n_shared_experts=2,
                  qk_nope_head_dim=128, qk_rope_head_dim=64, routed_scaling_factor=1.0, topk_group=None,
                  topk_method="greedy", norm_topk_prob=False, v_head_dim=128, num_experts_per_tok=None,
                  moe_intermediate_size=1407),
    _SHARED_FIELDS, _read_v2, lambda s: _export(s, False), drops=frozenset({"head_dim"}))
HF_V3 = HfFamily(
    "deepseek_v3", "DeepseekV3ForCausalLM",
    defaults_with(**{**_COMMON_V, "num_key_value_heads": 128}, vocab_size=129280, hidden_size=7168,
                  intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
                  n_shared_experts=1, n_routed_experts=256,
                  routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
                  qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8, first_k_dense_replace=3,
                  norm_topk_prob=True, max_position_embeddings=4096, rope_interleave=True),
    _SHARED_FIELDS | {"rope_interleave", "num_nextn_predict_layers", "num_mtp_layers"}, _read_v3, lambda s: _export(s, True),
    drops=frozenset({"head_dim"}))

_TRAITS = dict(router_first=False, fp32_routing_weights=True, shared_expert=True, shared_gate=False, dense_first=True)
FAMILY_V2 = ModelFamily("deepseek_v2", "multi-head latent attention, dense first blocks, grouped softmax routing with "
                        "shared experts (DeepSeek-V2)", projections, kernels, tensors, hf=HF_V2,
                        moe=MoeTraits(**_TRAITS, scoring="softmax", group_score="max"), check=_check, mla=True,
                        presets=PRESETS_V2)
FAMILY_V3 = ModelFamily("deepseek_v3", "multi-head latent attention, dense first blocks, grouped sigmoid routing with a "
                        "correction bias and shared experts (DeepSeek-V3)", projections, kernels, tensors, hf=HF_V3,
                        moe=MoeTraits(**_TRAITS, scoring="sigmoid", group_score="top2"), check=_check, mla=True,
                        buffers=buffers, extra_layers=True, presets=(_preset_v3(),))
