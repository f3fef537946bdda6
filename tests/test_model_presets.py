"""Every preset's parameter counts equal the real transformers model's, exactly.

The real model is built on the meta device (no memory, no downloads), so even the 405B preset
takes a fraction of a second. Published totals (the "safetensors total" / model-card counts of
the HF repos) are cited in PUBLISHED below and checked too.
"""
import json
from dataclasses import replace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from horizon_sim.errors import HorizonError
from horizon_sim.specs.hf_config import from_hf_config, load_model
from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import PRESETS, model_preset

# Parameter totals published for the HF checkpoints (safetensors metadata "total" on the hub).
PUBLISHED = {
    "llama-2-7b": 6_738_415_616,       # meta-llama/Llama-2-7b-hf
    "llama-2-13b": 13_015_864_320,     # meta-llama/Llama-2-13b-hf
    "llama-2-70b": 68_976_648_192,     # meta-llama/Llama-2-70b-hf
    "llama-3.1-8b": 8_030_261_248,     # meta-llama/Llama-3.1-8B
    "llama-3.1-70b": 70_553_706_496,   # meta-llama/Llama-3.1-70B
    "llama-3.1-405b": 405_853_388_800,  # meta-llama/Llama-3.1-405B
    "qwen2.5-0.5b": 494_032_768,       # Qwen/Qwen2.5-0.5B (tied embeddings)
    "qwen2.5-7b": 7_615_616_512,       # Qwen/Qwen2.5-7B
    "qwen2.5-14b": 14_770_033_664,     # Qwen/Qwen2.5-14B
    "qwen2.5-32b": 32_763_876_352,     # Qwen/Qwen2.5-32B
    "qwen2.5-72b": 72_706_203_648,     # Qwen/Qwen2.5-72B
    "mistral-7b": 7_248_023_552,       # mistralai/Mistral-7B-v0.3
    "qwen3-8b": 8_190_735_360,         # Qwen/Qwen3-8B ("8.2B" on its card; transformers' count of its config)
    "phi-3-mini": 3_821_079_552,       # microsoft/Phi-3-mini-4k-instruct (keras-hub phi3_presets.py "params")
    "phi-3-medium": 13_960_238_080,    # microsoft/Phi-3-medium-4k-instruct (as counted for its unsloth copy)
    "gemma-2-2b": 2_614_341_888,       # google/gemma-2-2b (keras-hub gemma2 presets "params")
    "gemma-2-9b": 9_241_705_984,       # google/gemma-2-9b (the same; its safetensors total)
    "gemma-2-27b": 27_227_128_320,     # google/gemma-2-27b (the same)
    "olmo-2-7b": 7_298_617_344,        # allenai/OLMo-2-1124-7B (its safetensors total)
    "olmo-2-13b": 13_716_198_400,      # allenai/OLMo-2-1124-13B (the same)
    "olmo-2-32b": 32_234_279_936,      # allenai/OLMo-2-0325-32B (the same)
    "gemma-3-1b": 999_885_952,         # google/gemma-3-1b-pt (keras-hub gemma3 presets "params")
    "pythia-1b": 1_011_781_632,        # EleutherAI/pythia-1b (as released)
    "pythia-1.4b": 1_414_647_808,      # EleutherAI/pythia-1.4b
    "pythia-2.8b": 2_775_208_960,      # EleutherAI/pythia-2.8b
    "pythia-6.9b": 6_857_302_016,      # EleutherAI/pythia-6.9b
    "pythia-12b": 11_846_072_320,      # EleutherAI/pythia-12b
    "gpt2-124m": 124_439_808,          # openai-community/gpt2 (tied head)
    "gpt2-355m": 354_823_168,          # openai-community/gpt2-medium
    "gpt2-774m": 774_030_080,          # openai-community/gpt2-large
    "gpt2-1.5b": 1_557_611_200,        # openai-community/gpt2-xl
}


def _hf_config(spec: ModelSpec):
    d = to_hf_config_dict(spec)
    return AutoConfig.for_model(d.pop("model_type"), **d)


def _meta_model(spec: ModelSpec):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(_hf_config(spec))


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())  # parameters() counts a tied tensor once


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_matches_transformers(name):
    spec = PRESETS[name]
    model = _meta_model(spec)
    assert _numel(model) == spec.total_params
    base = model.base_model  # model.model, or gpt_neox's / transformer's under their own names
    layers = base.h if hasattr(base, "h") else base.layers  # GPT-2's blocks are transformer.h
    norm = next(getattr(base, n) for n in ("norm", "final_layer_norm", "ln_f") if hasattr(base, n))
    embed = model.get_input_embeddings()
    assert len(layers) == spec.n_layers
    for i in (0, spec.first_dense_layers, spec.n_layers - 1):  # DeepSeek's dense first blocks, then MoE ones
        assert _numel(layers[i]) == spec.block_spec(i).layer_params
    positions = base.wpe.weight.numel() if hasattr(base, "wpe") else 0  # GPT-2's, in the embedding unit
    assert embed.weight.numel() + positions == spec.embedding_params
    assert _numel(norm) + model.lm_head.weight.numel() == spec.head_device_params
    if spec.tied_embeddings:
        assert model.lm_head.weight is embed.weight
    else:
        assert model.lm_head.weight is not embed.weight
        assert model.lm_head.weight.numel() == spec.vocab * spec.hidden
        assert _numel(norm) + model.lm_head.weight.numel() == spec.head_params


def test_published_totals():
    for name, total in PUBLISHED.items():
        assert PRESETS[name].total_params == total, name


@pytest.mark.parametrize("spec", [
    # GQA + explicit head_dim different from hidden // heads (Qwen3/Mistral-Nemo style)
    ModelSpec(name="hd", n_layers=2, hidden=96, n_heads=4, n_kv_heads=2, head_dim=40,
              ffn_hidden=200, vocab=512),
    ModelSpec(name="hd-qwen", n_layers=2, hidden=96, n_heads=4, n_kv_heads=2, head_dim=40,
              ffn_hidden=200, vocab=512, family="qwen2", tied_embeddings=True),
    ModelSpec(name="qk-norm", n_layers=2, hidden=96, n_heads=4, n_kv_heads=2, head_dim=40,
              ffn_hidden=200, vocab=512, family="qwen3"),   # Qwen3: per-head q/k norms
    ModelSpec(name="mlpbias", n_layers=3, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=160,
              vocab=300, mlp_bias=True),
], ids=lambda s: s.name)
def test_custom_shapes_match_transformers(spec):
    model = _meta_model(spec)
    assert _numel(model) == spec.total_params
    assert _numel(model.model.layers[0]) == spec.layer_params


def test_export_rejects_unrepresentable():
    base = dict(n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128, vocab=100)
    for bad in (ModelSpec(**base, qkv_bias=True),
                ModelSpec(**base, layer_windows=(4, 4)), ModelSpec(**base, family="mistral", layer_windows=(4, 8)),
                ModelSpec(**base, family="qwen2", mlp_bias=True), ModelSpec(**base, family="qwen2", qkv_bias=False),
                ModelSpec(**base, family="qwen3", qkv_bias=True)):
        with pytest.raises(HorizonError):
            to_hf_config_dict(bad)


# ---- from_hf_config ---------------------------------------------------------------------

def _write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return p


@pytest.mark.parametrize("name", list(PRESETS))
def test_round_trip(tmp_path, name):
    spec = PRESETS[name]
    d = to_hf_config_dict(spec)
    del d["_name_or_path"]
    p = _write(tmp_path, d)
    got = from_hf_config(p)
    assert got.name == tmp_path.name  # no _name_or_path: the directory's name
    assert got.to_dict() | {"name": spec.name} == spec.to_dict()
    assert from_hf_config(tmp_path).to_dict() == got.to_dict()  # a directory works too


def test_round_trip_via_transformers_save(tmp_path):
    """A config.json written by transformers itself (rope_theta inside rope_parameters in v5)."""
    spec = model_preset("llama-3.1-8b")
    _hf_config(spec).save_pretrained(tmp_path)
    got = from_hf_config(tmp_path / "config.json")
    assert got.total_params == spec.total_params
    assert got.to_dict() | {"name": spec.name} == spec.to_dict()


# Abridged copies of published config.json files (old-style: rope_theta top-level).
LLAMA2_7B = {
    "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.31.0.dev0",
    "use_cache": True, "vocab_size": 32000,
}
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
}
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 896,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "use_sliding_window": False,
    "vocab_size": 151936,
}
MISTRAL_7B_V03 = {
    "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "vocab_size": 32768,
}


@pytest.mark.parametrize("cfg,preset", [(LLAMA2_7B, "llama-2-7b"), (LLAMA31_8B, "llama-3.1-8b"),
                                        (QWEN25_05B, "qwen2.5-0.5b"), (MISTRAL_7B_V03, "mistral-7b")])
def test_published_configs_equal_presets(tmp_path, cfg, preset):
    got = from_hf_config(_write(tmp_path, cfg))
    assert got.to_dict() | {"name": preset} == PRESETS[preset].to_dict()


def test_name_and_new_style_rope(tmp_path):
    cfg = dict(LLAMA2_7B)
    del cfg["num_key_value_heads"]  # defaults to the head count
    cfg.pop("rope_scaling")
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 123456.0}
    got = from_hf_config(_write(tmp_path, cfg))
    assert got.name == "meta-llama/Llama-2-7b-hf"
    assert got.rope_theta == 123456.0 and got.n_kv_heads == 32
    assert got.total_params == PUBLISHED["llama-2-7b"]


def test_load_model(tmp_path):
    p = _write(tmp_path, QWEN25_05B)
    assert load_model(str(p)).total_params == PUBLISHED["qwen2.5-0.5b"]
    assert load_model(tmp_path).total_params == PUBLISHED["qwen2.5-0.5b"]
    assert load_model("Llama-2-7B") is PRESETS["llama-2-7b"]
    with pytest.raises(HorizonError, match="not found"):
        load_model(str(tmp_path / "nope.json"))
    with pytest.raises(HorizonError, match="unknown model"):
        load_model("llama-9-7b")


def _err(tmp_path, cfg) -> str:
    p = _write(tmp_path, cfg)
    with pytest.raises(HorizonError) as e:
        from_hf_config(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.count(str(p)) == 1
    return msg


def test_errors(tmp_path):
    msg = _err(tmp_path, {"model_type": "bloom", "n_layer": 12, "hidden_size": 768})
    assert "'bloom'" in msg and "llama, qwen2, mistral, qwen3" in msg

    msg = _err(tmp_path, '{"model_type": "llama", "hidden_size": 4096,')
    assert "not valid JSON" in msg

    msg = _err(tmp_path, {k: v for k, v in LLAMA2_7B.items() if k != "intermediate_size"})
    assert "'intermediate_size'" in msg and "missing" in msg

    msg = _err(tmp_path, LLAMA2_7B | {"hidden_size": "4096"})
    assert "'hidden_size'" in msg and "integer" in msg
    msg = _err(tmp_path, LLAMA2_7B | {"num_hidden_layers": 32.0})
    assert "'num_hidden_layers'" in msg and "integer" in msg
    msg = _err(tmp_path, LLAMA2_7B | {"vocab_size": True})
    assert "'vocab_size'" in msg

    msg = _err(tmp_path, LLAMA2_7B | {"hidden_act": "gelu"})
    assert "'gelu'" in msg and "silu" in msg
    msg = _err(tmp_path, LLAMA2_7B | {"attention_bias": True})
    assert "attention_bias" in msg
    msg = _err(tmp_path, LLAMA2_7B | {"num_key_value_heads": 5})  # ModelSpec's own check
    assert "n_kv_heads" in msg
    msg = _err(tmp_path, LLAMA2_7B | {"tie_word_embeddings": "yes"})
    assert "'tie_word_embeddings'" in msg
    msg = _err(tmp_path, [1, 2])
    assert "JSON object" in msg

    missing = tmp_path / "absent" / "config.json"
    with pytest.raises(HorizonError, match="not found") as e:
        from_hf_config(missing)
    assert str(missing) in str(e.value)
    with pytest.raises(HorizonError, match="not found"):
        from_hf_config(tmp_path / "absent")  # a directory without config.json


def test_a_gpt2_config_from_the_hub_is_planned_with_transformers_count(tmp_path):
    """GPT-2 from its own config.json (its own field names, dropout 0.1, the summary head's
    fields, the old n_ctx): every parameter transformers builds is counted, learned positions
    and biases included, and the executor takes it (its n_positions rows are trained)."""
    d = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
         "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
         "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 1600, "n_head": 25,
         "n_layer": 48, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
         "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
         "summary_use_proj": True, "vocab_size": 50257}  # gpt2-xl's
    (tmp_path / "config.json").write_text(json.dumps(d))
    spec = from_hf_config(tmp_path)
    cfg = AutoConfig.for_model("gpt2", **{k: v for k, v in d.items() if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert (spec.family, spec.hidden, spec.ffn_hidden) == ("gpt2", 1600, 6400)
    assert spec.total_params == _numel(model) == 1_557_611_200
    from horizon_exec.model.families import check_runnable
    check_runnable(spec)
    assert spec.max_position == 1024
    with pytest.raises(HorizonError, match="gpt2 learns a position embedding of max_position rows"):
        check_runnable(replace(spec, max_position=0))


@pytest.mark.parametrize("name,total", [("gemma-3-4b", 4_300_079_472), ("gemma-3-12b", 12_187_325_040),
                                        ("gemma-3-27b", 27_432_406_640)])
def test_gemma3_presets_are_the_published_models_without_their_vision_tower(name, total):
    """google/gemma-3-{4,12,27}b-pt are multimodal (keras-hub gemma3 presets "params": the totals
    here): transformers' Gemma3ForConditionalGeneration with the preset as its text_config and
    the checkpoints' SigLIP vision_config counts exactly those totals on the meta device."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    text = {k: v for k, v in to_hf_config_dict(PRESETS[name]).items() if k not in ("architectures", "_name_or_path")}
    vision = dict(model_type="siglip_vision_model", hidden_size=1152, image_size=896, intermediate_size=4304,
                  num_attention_heads=16, num_hidden_layers=27, patch_size=14, vision_use_head=False)
    with torch.device("meta"):
        model = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision))
    assert sum(p.numel() for p in model.parameters()) == total
