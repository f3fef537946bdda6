"""Issue 30, 3: epsilons that make a run train nothing while it looks healthy are refused: a
norm epsilon outside (0, 0.1] (ModelSpec, a config.json's rms_norm_eps) and an AdamW eps above
1e-2 (--eps, AdamW, Trainer), each in one line naming the value and the range."""
import json
import re

import pytest

from horizon_exec.optim.adamw import check_hyper
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hf_config import from_hf_config
from horizon_sim.specs.model import ModelSpec

SPEC = dict(n_layers=1, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=256)
CONFIG = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
          "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 256}


@pytest.mark.parametrize("eps", [1e30, 0.5, 0.10001])
def test_a_norm_eps_past_the_range_is_refused(tmp_path, eps):
    with pytest.raises(HorizonError, match=re.escape(f"model norm_eps={eps!r} must lie in (0, 0.1]")):
        ModelSpec(**SPEC, norm_eps=eps)
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "rms_norm_eps": eps}))
    with pytest.raises(HorizonError, match=re.escape(f"config.json: key 'rms_norm_eps' = {eps!r} must lie in "
                                                     f"(0, 0.1]")) as e:
        from_hf_config(tmp_path / "config.json")
    assert "\n" not in str(e.value)


def test_norm_eps_in_the_range_is_accepted(tmp_path):
    assert ModelSpec(**SPEC, norm_eps=0.1).norm_eps == 0.1
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "rms_norm_eps": 1e-6}))
    assert from_hf_config(tmp_path / "config.json").norm_eps == 1e-6


@pytest.mark.parametrize("eps", [1e30, 0.0100001, 1.0])
def test_an_adam_eps_above_1e_2_is_refused(eps):
    with pytest.raises(HorizonError, match=re.escape(f"AdamW eps={eps!r} must be <= 0.01")):
        check_hyper(lr=1e-3, betas=(0.9, 0.95), eps=eps, weight_decay=0.0)
    check_hyper(lr=1e-3, betas=(0.9, 0.95), eps=1e-2, weight_decay=0.0)
