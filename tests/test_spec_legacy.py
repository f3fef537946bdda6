"""Specs written before ModelSpec had a family (four fields: qk_norm, moe_family, ffn_type, norm)
read as the family those fields described, as the HF writer chose a class then; a dict that mixes
both forms, or a combination no family has, is a one-line error."""
import json

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import build_schedule
from horizon_sim.schedule.serialize import from_json, to_json
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import PRESETS
from horizon_sim.specs.policy import Policy

OLD = dict(ffn_type="gated", qk_norm=False, norm="rmsnorm", moe_family="")


def _old(spec: ModelSpec, **legacy) -> dict:
    """spec's dict as Horizon wrote it before families (the fields it did not have dropped)."""
    d = {k: v for k, v in spec.to_dict().items() if k not in ("family", "padding_idx", "rotary_fraction")}
    return {**d, **OLD, **legacy}


@pytest.mark.parametrize("name,legacy", [
    ("llama-3.1-8b", {}), ("qwen2.5-7b", {}), ("qwen3-8b", dict(qk_norm=True)),
    ("qwen3-30b-a3b", dict(qk_norm=True, moe_family="qwen3_moe")), ("mixtral-8x7b", dict(moe_family="mixtral")),
])
def test_an_old_dict_reads_as_the_family_it_described(name, legacy):
    assert ModelSpec.from_dict(_old(PRESETS[name], **legacy)) == PRESETS[name]


def test_mistral_windows_and_gpt2_shapes():
    m = ModelSpec(name="w", family="mistral", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab=64,
                  layer_windows=(8, 8))
    assert ModelSpec.from_dict(_old(m)) == m
    g = ModelSpec(name="g", family="gpt2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=256, vocab=64)
    assert ModelSpec.from_dict(_old(g, ffn_type="plain", norm="layernorm")) == g


@pytest.mark.parametrize("legacy,words", [
    (dict(ffn_type="plain"), "ffn_type='plain' with norm='rmsnorm' is no family"),
    (dict(family="llama"), "give family alone, not with"),
])
def test_mixed_or_impossible_old_fields_are_one_line_errors(legacy, words):
    with pytest.raises(HorizonError, match=words) as e:
        ModelSpec.from_dict(_old(PRESETS["tiny"], **legacy))
    assert "\n" not in str(e.value)


def test_a_version_3_schedule_reads():
    """A schedule file of format 3 holds the model with the four old fields."""
    sched = build_schedule(PRESETS["qwen3-8b"], Policy(batch=2, seq=64))
    d = json.loads(to_json(sched))
    d["version"] = 3
    d["meta"]["model"] = _old(PRESETS["qwen3-8b"], qk_norm=True)
    assert from_json(json.dumps(d)).meta == sched.meta
