"""Issue 30, section 6: tie_word_embeddings true with a distinct lm_head.weight in the
checkpoint. transformers 5 compares the two (torch.equal) and keeps a distinct head untied
(with a warning); Horizon trains exactly that model, and --save-hf writes tie false. An
lm_head equal to the embedding (a tied head saved anyway) stays tied."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from horizon_exec.checkpoints.hf_checkpoint import hf_config_dict, load_hf, spec_from_hf_dir
from horizon_exec.runtime.config import TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import T, V, rel_err, tiny_hf

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _tied_config_untied_weights(tmp_path, same_head: bool):
    ref = tiny_hf("llama")                      # untied: embed and head differ
    ref.save_pretrained(tmp_path / "hf")
    cfg_path = tmp_path / "hf" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    if same_head:
        sd = load_file(tmp_path / "hf" / "model.safetensors")
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
        save_file(sd, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    return tmp_path / "hf"


@pytest.mark.parametrize("same_head", [False, True])
def test_logits_equal_what_transformers_loads(tmp_path, same_head):
    from transformers import AutoModelForCausalLM
    d = _tied_config_untied_weights(tmp_path, same_head)
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    ref_tied = ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()
    assert ref_tied == same_head                  # what the installed transformers does
    spec = spec_from_hf_dir(d)
    assert spec.tied_embeddings == same_head
    toks = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
    with Trainer(spec, exact_policy(batch=2, seq=T), TrainerConfig(random_init=False)) as tr:
        load_hf(tr, d)
        with torch.no_grad():
            want = ref(input_ids=toks).logits
        assert rel_err(tr.logits(toks), want) <= 1e-5
        cfg = hf_config_dict(tr.model, "fp32", json.loads((d / "config.json").read_text()))
        assert cfg["tie_word_embeddings"] is same_head   # the save says what was trained
