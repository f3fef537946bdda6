"""Every field of transformers' LlamaConfig, Qwen2Config and MistralConfig is accounted for by
the config reader, field by field:

- the reader knows each field of the three classes (read, ignored on purpose, or refused): a
  field a new transformers adds fails this test until it is classified;
- each field the reader ignores leaves transformers' own logits unchanged when it changes
  (same weights): ignoring it is what transformers does too;
- each field that changes the model is read into the spec or refused with its name, tested
  with a value that matters; foreign fields of other architectures are refused by name.
"""
import dataclasses
import json

import pytest
import torch

from horizon_sim.errors import HorizonError
from horizon_sim.specs.families import HF_ROWS
from horizon_sim.specs.hf_config import READ, READ_BY_TYPE, IGNORED, from_hf_config
from horizon_sim.specs.hf_export import to_hf_config_dict

FAMILIES = tuple(HF_ROWS)  # every config class Horizon reads
TINY = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=48, vocab_size=64, max_position_embeddings=256,
            pad_token_id=None)  # a class default pad_token_id may be no row of this vocabulary


def _class(mt):
    from transformers import CONFIG_MAPPING
    return CONFIG_MAPPING[mt]


def _saved(tmp_path, mt, base=TINY, **over) -> dict:
    """config.json as transformers writes it for a tiny model of family mt."""
    from transformers import AutoConfig
    AutoConfig.for_model(mt, **{**base, **over}).save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


def _family_tiny(mt) -> dict:
    """The family's tiny config of tests/test_families.py, as its class's keywords."""
    from tests.test_families import tiny
    return {k: v for k, v in to_hf_config_dict(tiny(mt)).items() if k not in ("model_type", "architectures")}


def _read(tmp_path, cfg: dict):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return from_hf_config(tmp_path / "config.json")


@pytest.mark.parametrize("mt", FAMILIES)
def test_every_field_of_the_transformers_class_is_classified(tmp_path, mt):
    saved = _saved(tmp_path, mt, _family_tiny(mt))
    fields = {f.name for f in dataclasses.fields(_class(mt))} | set(saved)
    known = READ | READ_BY_TYPE[mt] | IGNORED
    assert sorted(fields - known) == []
    _read(tmp_path, saved)  # a config transformers writes is accepted as is


# Ignored fields with a value that differs from the default; transformers' logits must not move.
IGNORED_CHANGES = dict(use_cache=False, bos_token_id=3, eos_token_id=[4, 5], pretraining_tp=2, chunk_size_feed_forward=8, output_hidden_states=True,
                       id2label={0: "a", 1: "b", 2: "c"}, problem_type="regression",
                       output_attentions=True)


@pytest.mark.parametrize("mt", ("llama", "qwen2", "mistral"))
def test_ignored_fields_do_not_change_transformers_logits(tmp_path, mt):
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(AutoConfig.for_model(mt, **TINY), dtype=torch.float32).eval()
    toks = torch.randint(0, 64, (2, 24))
    with torch.no_grad():
        want = base(input_ids=toks, return_dict=True).logits
    fields = {f.name for f in dataclasses.fields(_class(mt))}
    for k, v in IGNORED_CHANGES.items():
        if k not in fields and k not in ("output_attentions",):
            continue
        assert k in IGNORED
        cfg = AutoConfig.for_model(mt, **{**TINY, k: v})
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        m.load_state_dict(base.state_dict())
        with torch.no_grad():
            got = m(input_ids=toks, return_dict=True).logits
        assert torch.equal(got, want), k
        spec = _read(tmp_path, _saved(tmp_path, mt, **{k: v}))
        assert spec == _read(tmp_path, _saved(tmp_path, mt)), k


# Fields that change the model: (family, overrides) -> expected spec attributes, or the field
# name the refusal must mention.
HONOURED = [
    ("llama", dict(mlp_bias=True), dict(mlp_bias=True)),
    ("llama", dict(head_dim=16), dict(head_dim=16)),
    ("mistral", dict(head_dim=16), dict(head_dim=16)),
    ("llama", dict(tie_word_embeddings=True), dict(tied_embeddings=True)),
    ("llama", dict(rms_norm_eps=1e-3), dict(norm_eps=1e-3)),
    ("llama", dict(num_key_value_heads=1), dict(n_kv_heads=1)),
    ("qwen2", dict(), dict(qkv_bias=True)),
    ("mistral", dict(sliding_window=16), dict(layer_windows=(16, 16))),
    ("mistral", dict(sliding_window=None), dict(layer_windows=())),
    ("qwen2", dict(use_sliding_window=True, sliding_window=16, max_window_layers=1), dict(layer_windows=(0, 16))),
    ("qwen2", dict(use_sliding_window=False, sliding_window=16), dict(layer_windows=())),
    ("qwen2", dict(use_sliding_window=True, sliding_window=16, layer_types=["sliding_attention", "full_attention"]),
     dict(layer_windows=(16, 0))),
    ("llama", dict(max_position_embeddings=512), dict(max_position=512)),
    ("llama", dict(rope_parameters=dict(rope_type="default", rope_theta=5e5)), dict(rope_theta=5e5)),
]
REFUSED = [
    ("llama", dict(attention_bias=True), "attention_bias"),
    ("llama", dict(attention_dropout=0.1), "attention_dropout"),
    ("qwen2", dict(attention_dropout=0.1), "attention_dropout"),
    ("llama", dict(hidden_act="gelu"), "hidden_act"),
    ("llama", dict(rope_parameters=dict(rope_type="mrope", rope_theta=1e4, mrope_section=[2, 2])), "mrope"),
    ("llama", dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5)),
     "partial_rotary_factor"),
    ("llama", dict(pad_token_id=64), "pad_token_id = 64 is not a row of the 64-token embedding"),
    ("phi3", dict(resid_pdrop=0.1), "resid_pdrop"),
    ("gpt_neox", dict(use_parallel_residual=False), "use_parallel_residual"),
]


def test_a_class_default_pad_outside_the_vocabulary_is_named_as_the_default(tmp_path):
    cfg = _saved(tmp_path, "phi3")
    del cfg["pad_token_id"]  # Phi3Config's default, 32000, then applies
    with pytest.raises(HorizonError, match="pad_token_id = 32000 \\(phi3's default: the file does not set it\\)"):
        _read(tmp_path, cfg)


@pytest.mark.parametrize("mt,over,want", HONOURED)
def test_fields_that_change_the_model_are_read(tmp_path, mt, over, want):
    spec = _read(tmp_path, _saved(tmp_path, mt, **over))
    for k, v in want.items():
        assert getattr(spec, k) == v, k


@pytest.mark.parametrize("mt,over,name", REFUSED)
def test_fields_horizon_does_not_implement_are_refused_by_name(tmp_path, mt, over, name):
    cfg = _saved(tmp_path, mt)
    cfg.update(over)  # written as a user's file would hold it (transformers may refuse some itself)
    with pytest.raises(HorizonError, match=name):
        _read(tmp_path, cfg)


@pytest.mark.parametrize("field,value", [
    ("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0), ("partial_rotary_factor", 0.5),
    ("query_pre_attn_scalar", 256), ("num_local_experts", 8), ("quantization_config", {"quant_method": "gptq"}),
    ("auto_map", {"AutoModelForCausalLM": "modeling.X"}), ("use_qk_norm", True), ("some_new_field", 1),
])
def test_foreign_and_unknown_fields_are_refused_by_name(tmp_path, field, value):
    cfg = _saved(tmp_path, "llama")
    cfg[field] = value
    with pytest.raises(HorizonError, match=field):
        _read(tmp_path, cfg)


def test_foreign_fields_at_their_off_value_are_accepted(tmp_path):
    cfg = _saved(tmp_path, "llama")
    cfg.update(partial_rotary_factor=1.0, quantization_config=None, final_logit_softcapping=None)
    _read(tmp_path, cfg)


def test_a_field_of_another_family_is_refused(tmp_path):
    cfg = _saved(tmp_path, "llama")
    cfg["sliding_window"] = 16          # Mistral's, not Llama's: LlamaForCausalLM would ignore it
    with pytest.raises(HorizonError, match="sliding_window.*not a llama config field"):
        _read(tmp_path, cfg)


def test_rope_scaling_4x_style_and_parameter_checks(tmp_path):
    cfg = _saved(tmp_path, "llama")
    cfg.pop("rope_parameters")
    cfg.update(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    spec = _read(tmp_path, cfg)
    assert (spec.rope_theta, spec.rope_scaling.kind, spec.rope_scaling.factor) == (5e5, "linear", 2.0)
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "bogus": 1}
    with pytest.raises(HorizonError, match="bogus"):
        _read(tmp_path, cfg)
    cfg["rope_scaling"] = {"rope_type": "linear"}
    with pytest.raises(HorizonError, match="factor"):
        _read(tmp_path, cfg)
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": float("nan")}
    with pytest.raises(HorizonError, match="factor"):
        _read(tmp_path, cfg)


def test_a_multimodal_gemma3_config_is_read_by_its_text_config(tmp_path):
    """Its language model is the text_config (tests/test_gemma3_multimodal.py trains it): a flat
    config without one is refused, naming what is missing."""
    cfg = {"model_type": "gemma3", **{k: v for k, v in TINY.items() if v is not None}}
    with pytest.raises(HorizonError, match="model_type 'gemma3' needs a text_config") as e:
        _read(tmp_path, cfg)
    assert "\n" not in str(e.value)


def test_gemma3_text_reads_a_rope_base_per_layer_type(tmp_path):
    """transformers 5's rope_parameters per layer type and 4.x's rope_theta, rope_scaling and
    rope_local_base_freq read the same; a scaled RoPE on the sliding layers is refused."""
    base = {"model_type": "gemma3_text", **{k: v for k, v in TINY.items() if v is not None},
            "num_hidden_layers": 6, "sliding_window": 8, "query_pre_attn_scalar": 16}
    new = _read(tmp_path, {**base, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}})
    old = _read(tmp_path, {**base, "rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                           "rope_local_base_freq": 1e4, "sliding_window_pattern": 6})
    # a config converted from 4.x: the bases only top-level, rope_parameters without them
    mixed = _read(tmp_path, {**base, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": None,
                             "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0},
                                                 "sliding_attention": {"rope_type": "default"}}})
    assert new == old == mixed and new.rope_theta == 1e6 and new.rope_local_theta == 1e4
    assert new.rope_scaling.kind == "linear" and new.layer_windows == (8, 8, 8, 8, 8, 0)
    with pytest.raises(HorizonError, match="sliding layers is not supported"):
        _read(tmp_path, {**base, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                      "sliding_attention": {"rope_type": "linear", "factor": 2.0}}})
