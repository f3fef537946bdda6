"""Issue 28: MoE models (Qwen3-MoE, Mixtral, Qwen2-MoE) described exactly as transformers 5 builds
them: parameter counts, names, shapes and order of a meta-device model; active parameters against
the published figures; config.json read and written back; other MoE families and per-layer
dense/MoE mixes refused by name."""
import json
from dataclasses import replace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from horizon_sim.errors import HorizonError
from horizon_sim.specs import block
from horizon_sim.specs.hf_config import READ, READ_BY_TYPE, IGNORED, from_hf_config, spec_from_config_dict
from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import PRESETS

MOE_PRESETS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b")
# Published (model cards): Qwen3-30B-A3B "30.5B total, 3.3B activated"; Qwen3-235B-A22B "235B,
# 22B activated"; Mixtral-8x7B "46.7B total, 12.9B active". Totals to the card's rounding.
PUBLISHED_B = {"qwen3-30b-a3b": (30.5, 3.3), "qwen3-235b-a22b": (235, 22), "mixtral-8x7b": (46.7, 12.9)}

TINY = dict(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn_hidden=48, vocab=64, norm_eps=1e-6)
TINY_MOE = {
    "qwen3_moe": ModelSpec(name="t-qwen3-moe", **TINY, head_dim=16, family="qwen3_moe",
                           n_experts=4, experts_per_token=2, expert_ffn_hidden=16, norm_topk_prob=True),
    "mixtral": ModelSpec(name="t-mixtral", **{**TINY, "ffn_hidden": 24}, family="mixtral", n_experts=4,
                         experts_per_token=2, expert_ffn_hidden=24, norm_topk_prob=True, router_aux_loss_coef=0.02),
    "qwen2_moe": ModelSpec(name="t-qwen2-moe", **TINY, family="qwen2_moe", n_experts=4,
                           experts_per_token=2, expert_ffn_hidden=16, shared_expert_ffn_hidden=40),
}


def _meta(spec: ModelSpec):
    d = to_hf_config_dict(spec)
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def _block_tensors(model) -> list:
    return [(n.removeprefix("model.layers.0."), tuple(p.shape)) for n, p in model.named_parameters()
            if n.startswith("model.layers.0.")]


@pytest.mark.parametrize("spec", [PRESETS[n] for n in MOE_PRESETS] + list(TINY_MOE.values()), ids=lambda s: s.name)
def test_counts_names_shapes_and_order_equal_transformers(spec):
    model = _meta(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.total_params
    assert _block_tensors(model) == list(block.parameters(spec))  # names, 3-D expert shapes, order


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_totals_and_active_parameters_match_the_published_figures(name):
    spec = PRESETS[name]
    total_b, active_b = PUBLISHED_B[name]
    assert spec.total_params / 1e9 == pytest.approx(total_b, rel=0.005)
    # the cards round active counts loosely (Qwen3-30B-A3B: 3.35B counted, "3.3B" published)
    assert spec.active_params / 1e9 == pytest.approx(active_b, rel=0.02)


def test_active_counts_k_experts_and_the_router():
    s = PRESETS["qwen3-30b-a3b"]
    per_expert = 3 * s.hidden * s.expert_ffn_hidden
    assert s.total_params - s.active_params == s.n_layers * (s.n_experts - s.experts_per_token) * per_expert
    attn = sum(p.weight_params for p in block.projections(s) if p.module.startswith("self_attn."))
    router = s.hidden * s.n_experts
    assert s.layer_active_matmul_params == attn + router + s.experts_per_token * per_expert
    assert s.model_flops_params == s.n_layers * s.layer_active_matmul_params + s.vocab * s.hidden
    # a dense model: active is total, as before
    d = PRESETS["qwen3-8b"]
    assert d.active_params == d.total_params and d.layer_active_matmul_params == d.layer_matmul_params


@pytest.mark.parametrize("spec", [PRESETS[n] for n in MOE_PRESETS] + list(TINY_MOE.values()), ids=lambda s: s.name)
def test_config_round_trip_through_transformers(spec, tmp_path):
    """spec -> config dict -> transformers' config class -> config.json -> spec: the same spec."""
    d = to_hf_config_dict(spec)
    AutoConfig.for_model(d.pop("model_type"), **d).save_pretrained(tmp_path)
    back = from_hf_config(tmp_path)
    assert replace(back, name=spec.name) == spec


@pytest.mark.parametrize("mt", sorted(TINY_MOE))
def test_every_field_of_the_transformers_class_is_classified(mt, tmp_path):
    import dataclasses
    d = to_hf_config_dict(TINY_MOE[mt])
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    cfg.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    fields = {f.name for f in dataclasses.fields(type(cfg))} | set(saved)
    assert sorted(fields - (READ | READ_BY_TYPE[mt] | IGNORED)) == []


def test_aux_loss_coefficient_counts_only_with_output_router_logits():
    d = to_hf_config_dict(TINY_MOE["mixtral"])
    assert d["output_router_logits"] is True and d["router_aux_loss_coef"] == 0.02
    assert spec_from_config_dict({**d, "output_router_logits": False}).router_aux_loss_coef == 0.0
    assert spec_from_config_dict(d).router_aux_loss_coef == 0.02


def test_norm_topk_prob_is_read_and_mixtral_always_renormalises():
    d = to_hf_config_dict(TINY_MOE["qwen3_moe"])
    assert spec_from_config_dict({**d, "norm_topk_prob": False}).norm_topk_prob is False
    assert spec_from_config_dict(to_hf_config_dict(TINY_MOE["mixtral"])).norm_topk_prob is True


def _one_line(fn, *args, match: str):
    with pytest.raises(HorizonError, match=match) as e:
        fn(*args)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("mt,words", [("deepseek_v32", "DeepSeek-V3.2"), ("jamba", "Mamba layers"),
                                      ("qwen3_next", "gated delta-net")])
def test_other_moe_families_are_refused_by_name(mt, words):
    _one_line(spec_from_config_dict, {"model_type": mt, "hidden_size": 32}, match=words)


@pytest.mark.parametrize("mt,over,words", [
    ("qwen3_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step = 2"),
    ("qwen2_moe", {"mlp_only_layers": [1]}, "mlp_only_layers"),
    ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
    ("mixtral", {"sliding_window": 4096}, "sliding window"),
    ("qwen3_moe", {"use_sliding_window": True}, "sliding window"),
    ("qwen3_moe", {"attention_bias": True}, "attention_bias"),
    ("qwen3_moe", {"num_experts_per_tok": 9}, "experts_per_token=9"),
    ("qwen2_moe", {"shared_expert_intermediate_size": 0}, "'shared_expert_intermediate_size' = 0 must be"),
    ("mixtral", {"num_experts": 6}, "num_experts = 6 and num_local_experts = 4 disagree"),
    ("qwen3_moe", {"shared_expert_intermediate_size": 8}, "not a qwen3_moe config field"),
])
def test_unsupported_moe_configs_are_refused_in_one_line(mt, over, words):
    d = {**to_hf_config_dict(TINY_MOE[mt]), **over}
    _one_line(spec_from_config_dict, d, match=words)


def test_a_required_expert_size_is_not_guessed():
    d = to_hf_config_dict(TINY_MOE["qwen3_moe"])
    del d["num_experts"]
    _one_line(spec_from_config_dict, d, match="'num_experts' is missing")


@pytest.mark.parametrize("over,words", [
    (dict(n_experts=4), "family 'llama' is dense; MoE families: qwen3_moe, mixtral, qwen2_moe"),
    (dict(family="switch", n_experts=4, experts_per_token=1, expert_ffn_hidden=8), "family='switch'; allowed: llama"),
    (dict(family="mixtral", n_experts=4, experts_per_token=2, expert_ffn_hidden=48), "norm_topk_prob"),
    (dict(family="mixtral", n_experts=4, experts_per_token=2, expert_ffn_hidden=8, norm_topk_prob=True),
     "must equal expert_ffn_hidden"),
    (dict(family="qwen3_moe", n_experts=1, experts_per_token=1, expert_ffn_hidden=8), "n_experts=1"),
    (dict(family="qwen3_moe", n_experts=4, experts_per_token=2, expert_ffn_hidden=8, qkv_bias=True), "qkv_bias=True"),
    (dict(family="qwen3_moe", n_experts=4, experts_per_token=2, expert_ffn_hidden=-1), ">= 0"),
    (dict(family="qwen2_moe", n_experts=4, experts_per_token=2, expert_ffn_hidden=8), "shared_expert_ffn_hidden=0"),
    (dict(router_aux_loss_coef=float("nan")), "router_aux_loss_coef"),
])
def test_bad_moe_fields_are_one_line_errors(over, words):
    _one_line(lambda: ModelSpec(**TINY, **over), match=words)


def test_a_moe_spec_survives_its_dict_round_trip():
    s = PRESETS["qwen3-30b-a3b"]
    assert ModelSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s


@pytest.mark.parametrize("value", [1, True, 0.5, "full_attention"])
def test_a_layer_types_that_is_not_a_list_is_a_one_line_error(value):
    """qwen2_moe reads layer_types; a scalar there was iterated and crashed with a TypeError."""
    d = {**to_hf_config_dict(TINY_MOE["qwen2_moe"]), "layer_types": value}
    _one_line(spec_from_config_dict, d, match="layer_types = .* must be a list")
