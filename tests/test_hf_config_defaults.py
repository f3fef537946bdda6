"""Issue 30, section 6: a config.json that leaves a field out trains the model transformers
builds from it (HF_DEFAULTS equals the installed config classes' defaults); initializer_range
is the std of a random init; yarn's beta_fast/beta_slow 0 mean their defaults (transformers'
`or 32`) and an explicit factor below 1 or attention_factor 0 is refused in one line."""
import inspect
import json

import pytest

from horizon_sim.specs.families import FAMILIES
import torch

from horizon_sim.errors import HorizonError
from horizon_sim.specs.hf_config import from_hf_config, spec_from_config_dict
from horizon_sim.specs.families import HF_ROWS
from horizon_sim.specs.hf_defaults import HF_DEFAULTS, REQUIRED
from horizon_sim.specs.hf_export import to_hf_config_dict

SIZES = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=48, vocab_size=64)


def _class(mt):
    from transformers import CONFIG_MAPPING
    return CONFIG_MAPPING[mt]


def _required_sizes(mt) -> dict:
    """The sizes hf_defaults.REQUIRED keeps required beyond SIZES (an MoE family's experts'), as
    the family's tiny config of tests/test_families.py writes them."""
    from tests.test_families import tiny
    return {k: v for k, v in to_hf_config_dict(tiny(mt)).items() if k in REQUIRED and k not in SIZES}


@pytest.mark.parametrize("mt", sorted(HF_DEFAULTS))
def test_table_equals_the_installed_config_classes(mt):
    cls = _class(mt)
    params = inspect.signature(cls.__init__).parameters
    for key, want in HF_DEFAULTS[mt].items():  # keyed by the shared names: GPT-2's n_embd is hidden_size
        have = cls.default_theta if key == "rope_theta" else params[HF_ROWS[mt].own_key(key)].default
        assert have == want, (mt, key, have, want)


@pytest.mark.parametrize("mt", sorted(HF_DEFAULTS))
def test_a_minimal_config_reads_as_transformers_builds_it(mt, tmp_path):
    """Only the sizes given (num_attention_heads 8 so that Mistral's and Qwen2's default kv
    head counts divide it): every other field as transformers' class fills it in."""
    from transformers import AutoConfig
    d = {"model_type": mt, **SIZES, "num_attention_heads": 8, "hidden_size": 64, **_required_sizes(mt),
         "vocab_size": 32064}  # holds every class's default pad_token_id
    if mt in ("qwen2", "qwen3", "qwen2_moe"):
        d["num_attention_heads"] = 32   # Qwen2's and Qwen3's default num_key_value_heads is 32
        d["hidden_size"] = 256
    (tmp_path / "config.json").write_text(json.dumps(d))
    spec = from_hf_config(tmp_path)
    hf = AutoConfig.for_model(mt, **{k: v for k, v in d.items() if k != "model_type"})
    def field(shared):  # under the class's own name (GPT-2's layer_norm_epsilon)
        return getattr(hf, HF_ROWS[mt].own_key(shared), None)

    mla = FAMILIES[mt].mla  # (MLA makes k and v for every head whatever num_key_value_heads says)
    assert spec.n_kv_heads == (hf.num_attention_heads if mla else field("num_key_value_heads") or hf.num_attention_heads)
    assert spec.norm_eps == field("rms_norm_eps")
    rope = field("rope_parameters")
    if rope is not None and "full_attention" in rope:  # a base per layer type (Gemma 3)
        assert (spec.rope_theta, spec.rope_local_theta) == (rope["full_attention"]["rope_theta"],
                                                          rope["sliding_attention"]["rope_theta"])
    elif rope is not None:
        assert spec.rope_theta == rope["rope_theta"]
    assert spec.tied_embeddings == hf.tie_word_embeddings
    assert spec.max_position == hf.max_position_embeddings
    assert spec.init_std == hf.initializer_range
    assert spec.padding_idx == hf.pad_token_id
    if mla:  # the q/k head: nope + rope (transformers' head_dim there is the rotated part's)
        assert spec.hd == hf.qk_nope_head_dim + hf.qk_rope_head_dim
    else:
        assert spec.hd == getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads  # qwen3: 128
    window, types = getattr(hf, "sliding_window", None), getattr(hf, "layer_types", None)
    if not window or (mt in ("qwen2", "qwen3", "qwen3_moe", "qwen2_moe") and not hf.use_sliding_window):
        want = ()  # (the Qwen classes keep a window they do not use)
    elif types:
        want = tuple(window if t == "sliding_attention" else 0 for t in types)
    else:
        want = (window,) * 2
    assert spec.layer_windows == (want if any(want) else ())
    if mt == "mistral":
        assert spec.layer_windows == (4096, 4096)  # the default window, not full attention


def test_explicit_nulls_keep_their_meaning():
    spec = spec_from_config_dict({"model_type": "mistral", **SIZES, "num_key_value_heads": None,
                                  "sliding_window": None})
    assert spec.n_kv_heads == 4 and spec.layer_windows == ()


def test_sizes_stay_required():
    d = {"model_type": "llama", **SIZES}
    del d["intermediate_size"]
    with pytest.raises(HorizonError, match="'intermediate_size' is missing"):
        spec_from_config_dict(d)


def test_initializer_range_is_the_init_std():
    from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.policy import Policy
    spec = spec_from_config_dict({"model_type": "llama", **SIZES, "initializer_range": 0.5})
    assert spec.init_std == 0.5
    with Trainer(spec, Policy(batch=1, seq=16), TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        w = tr.state_dict()["model.layers.0.mlp.up_proj.weight"]
        assert 0.4 < float(w.std()) < 0.6


def _yarn(**rp):
    return {"model_type": "llama", **SIZES, "max_position_embeddings": 256,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                "original_max_position_embeddings": 64, **rp}}


@pytest.mark.parametrize("zero", ["beta_fast", "beta_slow"])
def test_yarn_beta_zero_means_the_default_as_in_transformers(zero):
    from transformers import AutoConfig, AutoModelForCausalLM

    from horizon_exec.model.rope import inv_freq
    d = _yarn(**{zero: 0})
    spec = spec_from_config_dict(d)
    got, attn = inv_freq(spec, 16)
    m = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **{k: v for k, v in d.items()
                                                                        if k != "model_type"}))
    assert torch.equal(got, m.model.rotary_emb.inv_freq)
    assert attn == m.model.rotary_emb.attention_scaling


@pytest.mark.parametrize("bad, words", [({"factor": 0}, "factor = 0 must be >= 1"),
                                        ({"factor": 0.5}, "factor = 0.5 must be >= 1"),
                                        ({"attention_factor": 0}, "attention_factor = 0 must be > 0")])
def test_invalid_yarn_values_are_refused_in_one_line(bad, words):
    with pytest.raises(HorizonError) as e:
        spec_from_config_dict(_yarn(**bad))
    assert words in str(e.value) and "\n" not in str(e.value)
