"""Model dicts written before ModelSpec had a family: schedules, sweep rows, job digests and
measurement tables described a block by four fields (moe_family, qk_norm, ffn_type, norm). Read
back, those fields name the family they described, as the HF writer chose a class then, so no
file written by an earlier Horizon is refused for its age."""
from horizon_sim.errors import HorizonError

LEGACY_FIELDS = ("moe_family", "qk_norm", "ffn_type", "norm")


def translate_legacy(d: dict, what: str = "") -> dict:
    """d with the legacy fields replaced by `family` (d itself when it has none of them)."""
    if not any(k in d for k in LEGACY_FIELDS):
        return d
    where = f"{what or 'ModelSpec'}: "
    if "family" in d:
        raise HorizonError(f"{where}give family alone, not with {', '.join(k for k in LEGACY_FIELDS if k in d)} "
                           "(the fields it replaced)")
    out = {k: v for k, v in d.items() if k not in LEGACY_FIELDS}
    plain = d.get("ffn_type", "gated") != "gated" or d.get("norm", "rmsnorm") != "rmsnorm"
    if d.get("moe_family"):
        out["family"] = d["moe_family"]
    elif plain:
        if (d.get("ffn_type"), d.get("norm")) != ("plain", "layernorm"):
            raise HorizonError(f"{where}ffn_type={d.get('ffn_type', 'gated')!r} with norm={d.get('norm', 'rmsnorm')!r} "
                               "is no family; family 'gpt2' is a plain MLP with LayerNorm")
        out["family"] = "gpt2"
    elif d.get("qk_norm"):
        out["family"] = "qwen3"
    elif d.get("qkv_bias"):
        out["family"] = "qwen2"
    elif d.get("layer_windows"):
        out["family"] = "mistral"
    return out
