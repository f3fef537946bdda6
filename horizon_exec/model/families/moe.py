"""The mixture-of-experts blocks (qwen3_moe, mixtral, qwen2_moe): the attention half of their
dense relative (Qwen3's q/k norms for qwen3_moe), then moe_block.moe_mlp, which hands the
router's statistics to a RouterStats when the step trains with the load-balancing loss."""
from horizon_exec.model.layers import rms_norm, self_attention
from horizon_exec.model.moe_block import moe_mlp


def forward(m, w, x, cos, sin, window=0, docs=None, router=None, qk_norm: bool = False):
    h = rms_norm(x, w["input_layernorm.weight"], m.norm_eps)
    x = x + self_attention(m, w, h, cos, sin, window, docs, qk_norm)
    h = rms_norm(x, w["post_attention_layernorm.weight"], m.norm_eps)       # the first norm's output freed
    return x + moe_mlp(m, w, h, router)


def qwen3_forward(m, w, x, cos, sin, window=0, docs=None, router=None):
    return forward(m, w, x, cos, sin, window, docs, router, qk_norm=True)
