"""GPT-NeoX's block (Pythia, GPT-NeoX-20B): LayerNorms with biases; attention and the MLP both
read the block's input (the parallel residual, x + attention(ln1(x)) + mlp(ln2(x)), added as
(x + attention) + mlp); q, k and v in one biased projection whose output is per head [q | k | v]
(transformers' view (B, T, heads, 3 hd)); RoPE on the first rotary_dim dimensions of each head
(rope.py pads the tables); a plain GELU MLP with biases (erf, or the tanh approximation when
the config's hidden_act names one). v is copied out of the fused output, as Phi-3's is, so the
graph keeps v and not the whole q|k|v output."""
from horizon_exec.model.adapters import linear
from horizon_exec.model.layers import named_layer_norm as norm, plain_gelu, self_attention


def fused_qkv(m, w, h):
    B, T, _ = h.shape
    qkv = linear(h, w, "attention.query_key_value")
    q, k, v = qkv.view(B, T, m.n_heads, 3 * m.hd).split(m.hd, dim=-1)   # (B, T, heads, hd) each
    return q, k, v.contiguous()


def forward(m, w, x, cos, sin, window=0, docs=None, router=None):
    h = norm(w, "input_layernorm", x, m.norm_eps)                          # (B, T, H)
    x1 = x + self_attention(m, w, h, cos, sin, window, docs, project=fused_qkv, out="attention.dense")
    del h
    h = norm(w, "post_attention_layernorm", x, m.norm_eps)                 # the block's input, not x1
    u = linear(h, w, "mlp.dense_h_to_4h")  # (B, T, F)
    del h
    u = plain_gelu(m, u)
    return x1 + linear(u, w, "mlp.dense_4h_to_h")
