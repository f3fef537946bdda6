"""ModelSpec: a decoder-only transformer described by its shape, with exact parameter counts
and FLOPs per token. Presets live in model_presets.py. Activation and temporary bytes are
the schedule's business (schedule/work.py), measured against the executor there."""
import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache

from horizon_sim.errors import HorizonError
from horizon_sim.specs import block, mla, moe
from horizon_sim.specs.families import family as family_named
from horizon_sim.specs.families.legacy import translate_legacy
from horizon_sim.specs.from_dict import spec_from_dict
from horizon_sim.specs.rope import RopeScaling

MAX_NORM_EPS = 0.1
"""Largest norm epsilon accepted. It is added to the mean square of activations of order 1
(RMSNorm: x / sqrt(mean(x^2) + eps)); real models use 1e-6 .. 1e-5. At 1e30 every normalised
activation is ~0 and the model trains on nothing while the loss looks fine."""


@dataclass(kw_only=True, frozen=True, slots=True)
class ModelSpec:
    """A decoder of one family (specs/families: Llama, Qwen2, Mistral, Qwen3, the MoE ones, ...).
    Layer 'units' the schedule streams are the decoder blocks 0..n_layers-1 plus the head
    (final norm + LM head); the embedding stays on the host."""

    name: str = "custom"
    family: str = "llama"
    """The block's family by name (specs/families/__init__.py lists them): what its block holds
    and runs, its HF config class, whether the executor runs it."""
    n_layers: int
    """Decoder blocks."""
    hidden: int
    """Model width H."""
    n_heads: int
    """Query heads."""
    n_kv_heads: int
    """Key/value heads (GQA); equal to n_heads for plain multi-head attention."""
    head_dim: int = 0
    """Per-head width; 0 means hidden // n_heads."""
    ffn_hidden: int
    """MLP inner width F."""
    vocab: int
    tied_embeddings: bool = False
    """LM head shares the embedding matrix."""
    qkv_bias: bool | None = None
    """Biases on q, k, v projections; None = the family's (Qwen2 and Qwen2-MoE: True)."""
    mlp_bias: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_local_theta: float = 0.0
    """The sliding layers' RoPE base when it is not rope_theta (Gemma 3's rope_local_base_freq:
    those layers unscaled, the global ones rope_theta with rope_scaling); 0 = rope_theta."""
    rotary_fraction: float = 1.0
    """The fraction of each head's dimensions RoPE rotates (GPT-NeoX's rotary_pct, 0.25 in
    Pythia); the rest pass through unrotated."""
    rope_scaling: RopeScaling | None = None
    """RoPE frequency scaling (Llama 3.1's 'llama3', 'linear', 'dynamic', 'yarn'); None = plain RoPE."""
    max_position: int = 0
    """max_position_embeddings of the HF config (dynamic RoPE scales past it); 0 = not given."""
    layer_windows: tuple[int, ...] = ()
    """Sliding-window attention per block: a query attends to itself and the window-1 tokens
    before it; 0 = the whole causal prefix. Empty = every block full (Llama)."""
    padding_idx: int | None = None
    """The embedding row that never trains (the HF config's pad_token_id: transformers builds
    nn.Embedding(padding_idx=...), whose backward gives that row no gradient); None = none."""
    attn_softcap: float = 0.0
    """Attention scores soft-capped to (-c, c) by c * tanh(s / c) (Gemma 2's attn_logit_softcapping);
    0 = none."""
    logit_softcap: float = 0.0
    """The LM head's logits soft-capped the same way (Gemma 2's final_logit_softcapping); 0 = none."""
    query_scale: float = 0.0
    """Attention scores scaled by query_scale ** -0.5 instead of head_dim ** -0.5 (Gemma's
    query_pre_attn_scalar); 0 = head_dim."""
    hidden_act: str = ""
    """The MLP's activation by its transformers name where the family takes more than one
    (GPT-NeoX: gelu, or the tanh approximations gelu_new, gelu_fast, gelu_pytorch_tanh);
    "" = the family's own (its config row's first: silu, gelu for gpt_neox, gelu_new for gpt2)."""
    init_std: float = 0.02
    """Standard deviation of a random init's matrices (the HF config's initializer_range)."""
    # ---- mixture of experts (specs/moe.py; all zero = a dense MLP; an MoE family needs them) --
    n_experts: int = 0
    """Routed experts E per block (num_experts / num_local_experts)."""
    experts_per_token: int = 0
    """Top-k: experts each token is routed to (num_experts_per_tok)."""
    expert_ffn_hidden: int = 0
    """One expert's SwiGLU inner width (moe_intermediate_size; Mixtral: intermediate_size).
    ffn_hidden keeps the config's intermediate_size, which an all-MoE block does not use
    (Mixtral: equal to this) so that the config round-trips."""
    shared_expert_ffn_hidden: int = 0
    """Qwen2-MoE's shared expert inner width (0 = none), gated per token by a sigmoid."""
    norm_topk_prob: bool = False
    """Divide the k routing weights by their sum (Mixtral always)."""
    router_aux_loss_coef: float = 0.0
    """Weight of the load-balancing loss added to the training loss (0 = not added: transformers
    adds it only with output_router_logits)."""
    swiglu_alpha: float = 0.0
    """gpt-oss's experts' gate: g * sigmoid(swiglu_alpha * g) (its config's swiglu_alpha, 1.702);
    0 in every other family."""
    swiglu_limit: float = 0.0
    """gpt-oss's clamp: gate to at most swiglu_limit, up to [-limit, limit] (7.0); 0 elsewhere."""
    # ---- DeepSeek (specs/families/deepseek.py; all zero elsewhere) ---------------------------
    kv_lora_rank: int = 0
    """Multi-head latent attention when > 0: k and v made from a kv_lora_rank-wide latent
    (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj). head_dim is then the q/k head width,
    qk_nope_head_dim + qk_rope_head_dim."""
    q_lora_rank: int = 0
    """MLA: q through a q_lora_rank-wide bottleneck (q_a_proj, q_a_layernorm, q_b_proj); 0 = one
    q_proj (DeepSeek-V2-Lite)."""
    qk_rope_head_dim: int = 0
    """MLA: the last qk_rope_head_dim dimensions of each q/k head are rotated (k's part shared by
    every head, made from the latent's projection); the rest are not."""
    v_head_dim: int = 0
    """MLA: the width of each head's value (and of the attention's output per head)."""
    first_dense_layers: int = 0
    """Blocks 0..first_dense_layers-1 have a dense SwiGLU MLP of ffn_hidden, the others the MoE MLP
    (DeepSeek's first_k_dense_replace): the model has two block shapes (block_spec). A family with
    such blocks and no experts at all (n_experts 0) is dense throughout."""
    expert_groups: int = 0
    """Routed experts in this many groups, a token's top-k taken from its topk_groups best groups
    (DeepSeek's n_group, topk_group); 0 = no groups."""
    topk_groups: int = 0
    routed_scaling: float = 1.0
    """The routing weights' multiplier (DeepSeek's routed_scaling_factor)."""

    def __post_init__(self):
        # JSON round trips (schedule meta, sweep rows) hand these back as dict / list.
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if not isinstance(self.layer_windows, tuple):
            object.__setattr__(self, "layer_windows", tuple(self.layer_windows))
        fam = family_named(self.family)
        if self.qkv_bias is None:
            object.__setattr__(self, "qkv_bias", fam.qkv_bias)
        for f in ("qkv_bias", "mlp_bias", "tied_embeddings"):
            if not isinstance(getattr(self, f), bool):
                raise HorizonError(f"model {f}={getattr(self, f)!r} must be true or false")
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise HorizonError(f"model {f}={v!r} must be a positive integer")
        if self.head_dim < 0:
            raise HorizonError(f"model head_dim={self.head_dim} must be >= 0 (0 = hidden // n_heads)")
        if not self.head_dim and self.hidden % self.n_heads:
            raise HorizonError(f"model hidden={self.hidden} is not divisible by n_heads={self.n_heads}")
        if self.hd % 2:
            raise HorizonError(f"model head_dim={self.hd} (hidden {self.hidden} / {self.n_heads} heads unless "
                               "given) must be even: RoPE rotates pairs of dimensions")
        if self.n_heads % self.n_kv_heads:
            raise HorizonError(
                f"model n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        for f in ("norm_eps", "rope_theta"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise HorizonError(f"model {f}={v!r} must be a positive finite number")
        if self.norm_eps > MAX_NORM_EPS:
            raise HorizonError(f"model norm_eps={self.norm_eps!r} must lie in (0, {MAX_NORM_EPS:g}] (it is added "
                               f"to the activations' mean square; usual values 1e-6 .. 1e-5)")
        if (isinstance(self.init_std, bool) or not isinstance(self.init_std, (int, float))
                or not math.isfinite(self.init_std) or self.init_std < 0):
            raise HorizonError(f"model init_std={self.init_std!r} must be a finite number >= 0")
        v = self.rope_local_theta
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise HorizonError(f"model rope_local_theta={v!r} must be a finite number >= 0 (0 = rope_theta)")
        if v and not fam.local_rope:
            raise HorizonError(f"model rope_local_theta={v!r}: family {self.family!r} has one RoPE base "
                               "(gemma3_text has one per layer type)")
        for f in ("attn_softcap", "logit_softcap", "query_scale"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise HorizonError(f"model {f}={v!r} must be a finite number >= 0 (0 = none)")
            if v and not fam.softcapping:
                raise HorizonError(f"model {f}={v!r}: family {self.family!r} has no soft-capping or query scale "
                                   "(gemma2 has)")
        acts = fam.hf.activations if fam.hf is not None else ()
        if not isinstance(self.hidden_act, str) or (self.hidden_act and self.hidden_act not in acts):
            raise HorizonError(f"model hidden_act={self.hidden_act!r}: family {self.family!r} takes "
                               f"{', '.join(acts) or 'its own only'} (\"\" = {acts[0] if acts else 'its own'})")
        p = self.padding_idx
        if p is not None and (not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < self.vocab):
            raise HorizonError(f"model padding_idx={p!r} must be a token id in 0..{self.vocab - 1} (the vocabulary) "
                               "or None")
        if not isinstance(self.max_position, int) or self.max_position < 0:
            raise HorizonError(f"model max_position={self.max_position!r} must be an integer >= 0")
        f = self.rotary_fraction
        if (isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1
                or int(self.hd * f) % 2 or int(self.hd * f) == 0):
            raise HorizonError(f"model rotary_fraction={f!r} must lie in (0, 1] and rotate an even number of each "
                               f"head's {self.hd} dimensions")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise HorizonError(f"model rope_scaling={self.rope_scaling!r} must be a RopeScaling or None")
        if self.rope_scaling is not None and self.rope_scaling.kind == "dynamic" and not self.max_position:
            raise HorizonError("model rope_scaling 'dynamic' needs max_position (max_position_embeddings)")
        s = self.rope_scaling
        if s is not None and s.kind == "longrope" and \
                not len(s.short_factor) == len(s.long_factor) == self.rotary_dim // 2:
            raise HorizonError(f"model rope_scaling 'longrope' has {len(s.short_factor)} short and "
                               f"{len(s.long_factor)} long factors; want one per rotated frequency, "
                               f"{self.rotary_dim // 2} (rotary_dim / 2)")
        if self.layer_windows and len(self.layer_windows) != self.n_layers:
            raise HorizonError(f"model layer_windows has {len(self.layer_windows)} entries; "
                               f"want one per block ({self.n_layers}) or none")
        if any(not isinstance(w, int) or isinstance(w, bool) or w < 0 for w in self.layer_windows):
            raise HorizonError(f"model layer_windows {self.layer_windows[:8]} must be integers >= 0 (0 = full)")
        for f in ("swiglu_alpha", "swiglu_limit"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise HorizonError(f"model {f}={v!r} must be a finite number >= 0")
            if fam.clamped_swiglu and not v:
                raise HorizonError(f"model {f}=0: family {self.family!r} clamps its experts' SwiGLU: give its "
                                   "config's value (gpt-oss: swiglu_alpha 1.702, swiglu_limit 7.0)")
            if v and not fam.clamped_swiglu:
                raise HorizonError(f"model {f}={v!r}: family {self.family!r} has no clamped SwiGLU (gpt_oss has)")
        mla.check(self, fam)
        moe.check(self, fam)
        fam.check(self)

    # ---- block shapes ---------------------------------------------------------------------
    @property
    def uniform(self) -> bool:
        """Every block has one shape (no dense blocks before MoE ones)."""
        return self.first_dense_layers == 0

    def block_spec(self, layer: int) -> "ModelSpec":
        """The spec that describes block `layer` (specs/block.py, schedule/work.py and the
        executor's layout and forward take one block shape): this spec when every block is alike;
        for a model with dense blocks first, the same model with every block dense or every
        block MoE, as `layer` is."""
        if self.uniform:
            return self
        return _view(self, layer < self.first_dense_layers)

    @property
    def block_shapes(self) -> tuple[tuple["ModelSpec", int], ...]:
        """((a block shape's spec, its blocks), ...): one entry, or the dense blocks' and the MoE ones'."""
        if self.uniform:
            return ((self, self.n_layers),)
        return ((_view(self, True), self.first_dense_layers), (_view(self, False), self.n_layers - self.first_dense_layers))

    @property
    def max_layer_params(self) -> int:
        """The largest block's parameters (a device slot holds any block)."""
        return max(s.layer_params for s, _ in self.block_shapes)

    # ---- shapes -------------------------------------------------------------------------
    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.n_heads

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.hd

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.hd

    @property
    def rope_width(self) -> int:
        """The RoPE tables' width: a head's (the pass-through part at cos 1, sin 0), or MLA's
        rotated part alone (its q and k parts are rotated apart from the rest)."""
        return self.qk_rope_head_dim if self.kv_lora_rank else self.hd

    @property
    def v_dim(self) -> int:
        """The attention's value and output width: n_heads x the value head width (MLA's
        v_head_dim; head_dim elsewhere)."""
        return self.n_heads * (self.v_head_dim or self.hd)

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head RoPE rotates (all of them unless rotary_fraction < 1; MLA:
        qk_rope_head_dim)."""
        return self.qk_rope_head_dim if self.kv_lora_rank else int(self.hd * self.rotary_fraction)

    def window(self, layer: int) -> int:
        """Block `layer`'s attention window in tokens (0 = the whole causal prefix)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def rope_table_count(self) -> int:
        """RoPE tables a step needs: one, or two with a base of the sliding layers' own."""
        return 2 if self.rope_local_theta else 1

    def rope_table(self, layer: int) -> int:
        """Which of them block `layer` rotates by: 1 for a sliding layer with a base of its own."""
        return 1 if self.rope_local_theta and self.window(layer) else 0

    def attended(self, layer: int, seq: int) -> int:
        """Keys a query of block `layer` may see at most, in a sequence of `seq` tokens."""
        w = self.window(layer)
        return min(w, seq) if w else seq

    # ---- parameters (exact: tests compare with transformers; the block: specs/block.py) ---
    @property
    def norm_params(self) -> int:
        """One norm's parameters (a block has two, the head one)."""
        return self.hidden * len(block.norm_tensors(self))

    @property
    def layer_matmul_params(self) -> int:
        """Weights of the block's matmuls (q, k, v, o, MLP); what 6·N counts per layer."""
        return sum(p.weight_params for p in block.projections(self))

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def layer_active_matmul_params(self) -> int:
        """Matmul weights one token meets in a block: the attention's, the router's, its k
        experts' (and a shared expert with its gate); equal to layer_matmul_params when dense."""
        return sum(p.active_params(self.experts_per_token) for p in block.projections(self))

    @property
    def layer_params(self) -> int:
        """All parameters of one decoder block: matmuls, biases and both norms."""
        return block.parameter_count(self)

    @property
    def embedding_params(self) -> int:
        """The token embedding, and a learned position embedding where the family has one."""
        rows = self.vocab + (self.max_position if family_named(self.family).learned_positions else 0)
        return rows * self.hidden

    @property
    def head_params(self) -> int:
        """Final norm plus the LM head matrix (0 extra when tied: it is the embedding)."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def head_device_params(self) -> int:
        """Parameters the head needs on the device: the LM head matrix even when tied."""
        return self.norm_params + self.vocab * self.hidden

    @property
    def blocks_params(self) -> int:
        """Every block's parameters (the blocks of each shape)."""
        return sum(n * s.layer_params for s, n in self.block_shapes)

    @property
    def total_params(self) -> int:
        return self.embedding_params + self.blocks_params + self.head_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses: total_params less the experts it is not routed to
        (an MoE model's "A3B"); total_params when dense."""
        idle = sum(n * (s.layer_matmul_params - s.layer_active_matmul_params) for s, n in self.block_shapes)
        return self.total_params - idle

    @property
    def model_flops_params(self) -> int:
        """N of the PaLM 6·N term: every matmul weight applied to every token, block matmuls
        plus the LM head (the embedding lookup is not a matmul). MoE: the active matmuls only
        (attention, router, k experts, shared expert), so MFU counts active parameters."""
        return sum(n * s.layer_active_matmul_params for s, n in self.block_shapes) + self.vocab * self.hidden

    # ---- FLOPs --------------------------------------------------------------------------
    def model_flops_per_token(self, seq: int, context: int = 0) -> float:
        """PaLM model FLOPs per trained token: 6·N + 12·H·Σ_l T_l (non-causal attention term;
        uses q_dim for H so GQA and explicit head_dim count right). T_l is what a query of
        block l can attend to: seq, or its sliding window when shorter, or `context` (the
        mean document length under document masks) when given and shorter."""
        ctx = sum(min(self.attended(layer, seq), context or seq) for layer in range(self.n_layers))
        return 6.0 * self.model_flops_params + 6.0 * (self.q_dim + self.v_dim) * ctx

    def layer_fwd_flops(self, tokens: int, seq: int, causal: bool = True) -> float:
        """FLOPs one block's forward executes over `tokens` tokens of sequence length `seq`
        (a uniform spec: block_spec). Causal attention executes half of QK^T and AV (flash
        kernels skip masked tiles); causal=False: the kernel computes every T x T score (an
        explicit mask)."""
        attn = 2.0 * seq * (self.q_dim + self.v_dim) * tokens * (0.5 if causal else 1.0)
        return 2.0 * self.layer_active_matmul_params * tokens + attn

    def head_fwd_flops(self, tokens: int) -> float:
        return 2.0 * self.vocab * self.hidden * tokens

    @classmethod
    def from_dict(cls, d: dict, what: str = "") -> "ModelSpec":
        """The spec to_dict() wrote (unknown fields: a one-line error naming them). A dict
        written before specs had a family (qk_norm, moe_family, ffn_type, norm) is read as the
        family those fields described (families/legacy.py)."""
        return spec_from_dict(cls, translate_legacy(d, what) if isinstance(d, dict) else d, what)

    def to_dict(self) -> dict:
        """Plain JSON values (layer_windows as a list, rope_scaling as a dict or None), so a
        dict read back from JSON compares equal; ModelSpec.from_dict(d) rebuilds the spec."""
        d = asdict(self)
        d["layer_windows"] = list(self.layer_windows)
        if not d["hidden_act"]:  # the family's own: left out, so specs written before the field read (and digest) the same
            del d["hidden_act"]
        for f, off in _LATER_FIELDS.items():  # likewise the fields of families added since, at their off values
            if d[f] == off:
                del d[f]
        if d["rope_scaling"] is not None:  # longrope's lists; left out of the other kinds, as before them
            for f in ("short_factor", "long_factor"):
                d["rope_scaling"][f] = list(d["rope_scaling"][f])
                if not d["rope_scaling"][f]:
                    del d["rope_scaling"][f]
        return d


_LATER_FIELDS = {"swiglu_alpha": 0.0, "swiglu_limit": 0.0, "kv_lora_rank": 0, "q_lora_rank": 0, "qk_rope_head_dim": 0,
                 "v_head_dim": 0, "first_dense_layers": 0, "expert_groups": 0, "topk_groups": 0, "routed_scaling": 1.0}
"""Fields to_dict leaves out at these values (a spec written before them reads, and digests, the same)."""


@lru_cache(maxsize=256)
def _view(m: ModelSpec, dense: bool) -> ModelSpec:
    """m with every block MoE (first_dense_layers 0), or every block dense: the same model without
    experts (a dense model of its family), so that whatever asks a block spec for its experts
    (n_experts, is_moe) hears of none."""
    if not dense:
        return replace(m, first_dense_layers=0)
    return replace(m, first_dense_layers=0, n_experts=0, experts_per_token=0, expert_ffn_hidden=0,
                   shared_expert_ffn_hidden=0, norm_topk_prob=False, router_aux_loss_coef=0.0, expert_groups=0,
                   topk_groups=0, routed_scaling=1.0)
