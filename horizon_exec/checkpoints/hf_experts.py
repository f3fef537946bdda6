"""MoE expert tensors as checkpoints store them, versus as the executor holds them.

transformers 5 holds each layer's experts fused (mlp.experts.gate_up_proj (E, 2I, H), gate the
first I rows of an expert, up the last I; mlp.experts.down_proj (E, H, I)), but its checkpoints
keep the hub's per-expert layout, which save_pretrained writes back and the hub's models
(Qwen3-MoE, Mixtral, Qwen2-MoE) ship in (transformers' conversion_mapping.py):
  qwen3_moe, qwen2_moe  mlp.experts.{e}.gate_proj.weight (I, H), .up_proj (I, H), .down_proj (H, I)
  mixtral               block_sparse_moe.experts.{e}.w1 (gate), w3 (up), w2 (down), and the
                        router as block_sparse_moe.gate.weight
So a load copies each stored tensor into its part of the fused one, and a save writes the parts
as views of it (no copy of the fused tensor). Dense models store every tensor as held, and so do
gpt-oss's checkpoints their expert stacks (MoeTraits.stored_per_expert; the hub's as MXFP4 blocks
and scales, hf_mxfp4.py).
"""
from horizon_sim.specs.families import family
from horizon_sim.specs.model import ModelSpec


def stored_parts(m: ModelSpec) -> dict[str, tuple[str, tuple]]:
    """{name in a checkpoint: (parameter name as held, index into that parameter)} for every
    tensor stored other than as held (empty for a dense model)."""
    if not m.n_experts or not family(m.family).moe.stored_per_expert:
        return {}
    I = m.expert_ffn_hidden
    gate, up = slice(0, I), slice(I, 2 * I)
    mixtral = m.family == "mixtral"  # its checkpoints keep 4.x names: block_sparse_moe, w1/w3/w2
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = {}
    for layer in range(m.n_layers):
        if not m.block_spec(layer).n_experts:
            continue  # a dense block (DeepSeek's first ones) stores its MLP as held
        held = f"model.layers.{layer}.mlp."
        stored = f"model.layers.{layer}.{'block_sparse_moe' if mixtral else 'mlp'}."
        if mixtral:
            out[stored + "gate.weight"] = (held + "gate.weight", ())
        for e in range(m.n_experts):
            s = f"{stored}experts.{e}."
            out[s + f"{names[0]}.weight"] = (held + "experts.gate_up_proj", (e, gate))
            out[s + f"{names[1]}.weight"] = (held + "experts.gate_up_proj", (e, up))
            out[s + f"{names[2]}.weight"] = (held + "experts.down_proj", (e,))
    return out


def stored_items(m: ModelSpec, items):
    """[(held name, tensor)] -> [(stored name, tensor or a view of it)], in the held order, a
    fused tensor's parts expert by expert."""
    parts = stored_parts(m)
    if not parts:
        return list(items)
    by_held: dict[str, list] = {}
    for stored, (held, idx) in parts.items():
        by_held.setdefault(held, []).append((stored, idx))
    out = []
    for name, t in items:
        if name in by_held:
            out.extend((s, t[idx]) for s, idx in by_held[name])
        else:
            out.append((name, t))
    return out
