"""What GPT-NeoX adds beyond tests/test_families.py's generic checks: the activation a config
names (erf GELU, or GPT-NeoX-20B's tanh gelu_fast) is the one trained, a RoPE rotating a
fraction of each head other than the tiny config's, and the spec field that records the
activation leaves every other spec's dict (and so its job digest) as it was."""
from dataclasses import replace

import pytest
import torch

from horizon_sim.errors import HorizonError
from horizon_sim.job.digest import model_digest
from horizon_sim.specs.hf_config import spec_from_config_dict
from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import model_preset
from tests.test_families import B, T, V, _random_hf, tiny

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


@pytest.mark.parametrize("act,fraction", [("gelu_fast", 0.5), ("gelu", 1.0)])
def test_the_configs_activation_and_rotary_fraction_train_as_transformers(tmp_path, act, fraction):
    from horizon_exec.checkpoints.hf_checkpoint import load_hf, spec_from_hf_dir
    from horizon_exec.runtime.config import TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.policy import exact_policy
    from tests.hf_tiny import assert_step_matches
    spec = replace(tiny("gpt_neox"), hidden_act="" if act == "gelu" else act, rotary_fraction=fraction)
    ref = _random_hf(spec, seed=4)
    assert ref.config.hidden_act == act
    ref.save_pretrained(tmp_path)
    got = spec_from_hf_dir(tmp_path)
    assert (got.hidden_act, got.rotary_fraction) == (spec.hidden_act, fraction)
    tr = Trainer(got, exact_policy(batch=B, seq=T, optimizer="after", grad_clip=0.0), TrainerConfig(random_init=False))
    load_hf(tr, tmp_path)
    assert_step_matches(tr, ref, torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(2)))


def test_an_activation_the_family_does_not_take_is_refused_by_name():
    with pytest.raises(HorizonError, match=r"hidden_act='relu': family 'gpt_neox' takes gelu, gelu_new"):
        replace(tiny("gpt_neox"), hidden_act="relu")
    with pytest.raises(HorizonError, match=r"hidden_act='gelu_fast': family 'llama' takes silu, swish"):
        ModelSpec(n_layers=1, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=96, vocab=64, hidden_act="gelu_fast")
    d = to_hf_config_dict(tiny("gpt_neox")) | {"hidden_act": "relu"}
    with pytest.raises(HorizonError, match=r"hidden_act 'relu' is not supported; gpt_neox takes gelu"):
        spec_from_config_dict(d)


def test_the_family_default_activation_leaves_specs_and_digests_as_they_were():
    llama = model_preset("llama-3.1-8b")
    assert "hidden_act" not in llama.to_dict() and ModelSpec.from_dict(llama.to_dict()) == llama
    neox = model_preset("gpt-neox-20b")
    assert neox.hidden_act == "gelu_fast" and ModelSpec.from_dict(neox.to_dict()) == neox
    assert model_digest(replace(neox, hidden_act="gelu_new")) != model_digest(neox)
    assert spec_from_config_dict(to_hf_config_dict(neox)) == replace(neox, name=neox.name)
