"""Phi-3's longrope RoPE and partial rotary heads (Phi-3-mini-128k, Phi-3.5, Phi-4-mini): read
from a config, planned and trained exactly as transformers runs them.

A tiny phi3 with longrope (a factor per rotated frequency, short ones up to the pretraining
context of 8 tokens, long ones beyond) on 3/4 of each head: its RoPE tables equal
transformers' bit for bit below and above that context; one fp32 step's logits, loss and every
gradient equal transformers' at both lengths; the config.json Horizon writes reads back to the
same spec and transformers builds the same RoPE from it; bad factors, and document masks past
that context (where transformers' choice of factors depends on the data), are one-line refusals."""
import json

import pytest
import torch

from horizon_exec.model.rope import rope_tables
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hf_config import spec_from_config_dict
from horizon_sim.specs.hf_export import to_hf_config_dict

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
V, ORIGINAL = 96, 8
FACTORS = 6  # head 16, rotary_factor 0.75: 12 rotated dimensions, 6 frequencies


def _factors(seed: int) -> list:
    return [round(1.0 + 3.0 * x, 4) for x in torch.rand(FACTORS, generator=torch.Generator().manual_seed(seed)).tolist()]


CONFIG = dict(model_type="phi3", architectures=["Phi3ForCausalLM"], vocab_size=V, hidden_size=64,
              intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, original_max_position_embeddings=ORIGINAL, rms_norm_eps=1e-6,
              rope_theta=10000.0, partial_rotary_factor=0.75, pad_token_id=None, sliding_window=None,
              tie_word_embeddings=False, hidden_act="silu",
              rope_scaling={"type": "longrope", "short_factor": _factors(1), "long_factor": _factors(2)})


def _hf(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.hf_tiny import randomized_
    torch.manual_seed(0)
    d = dict(CONFIG)
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    ref = randomized_(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32), 1)
    ref.save_pretrained(tmp_path / "hf")
    return ref


def test_the_config_reads_as_longrope_on_part_of_each_head():
    spec = spec_from_config_dict(dict(CONFIG))
    s = spec.rope_scaling
    assert spec.family == "phi3" and spec.rotary_dim == 12 and spec.hd == 16
    assert s.kind == "longrope" and s.original_max_position == ORIGINAL
    assert s.short_factor == tuple(CONFIG["rope_scaling"]["short_factor"])
    assert s.long_factor == tuple(CONFIG["rope_scaling"]["long_factor"])


@pytest.mark.parametrize("seq", [6, 16], ids=["short", "long"])
def test_tables_equal_transformers_bit_for_bit(tmp_path, seq):
    ref = _hf(tmp_path)
    spec = spec_from_config_dict(json.loads((tmp_path / "hf" / "config.json").read_text()))
    want_cos, want_sin = ref.model.rotary_emb(torch.zeros(1, seq, 4), torch.arange(seq)[None])
    cos, sin = rope_tables(spec, seq, torch.float32, "cpu")
    rd = spec.rotary_dim
    assert torch.equal(cos[:, :rd], want_cos[0]) and torch.equal(sin[:, :rd], want_sin[0])
    assert torch.equal(cos[:, rd:], torch.ones_like(cos[:, rd:])) and not sin[:, rd:].any()
    if seq > ORIGINAL:  # the long factors differ from the short ones: the switch is seen
        short_cos, _ = rope_tables(spec, ORIGINAL, torch.float32, "cpu")
        assert not torch.equal(cos[:ORIGINAL], short_cos)


@pytest.mark.parametrize("seq", [6, 16], ids=["short", "long"])
def test_one_step_equals_transformers(tmp_path, seq):
    from horizon_exec.checkpoints.hf_checkpoint import load_hf, spec_from_hf_dir
    from horizon_exec.runtime.config import TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.policy import exact_policy
    from tests.hf_tiny import assert_step_matches
    ref = _hf(tmp_path)
    spec = spec_from_hf_dir(tmp_path / "hf")
    pol = exact_policy(batch=2, seq=seq, act_ckpt_every=2, optimizer="after", grad_clip=0.0, loss_chunk_tokens=24)
    tr = Trainer(spec, pol, TrainerConfig(random_init=False))
    load_hf(tr, tmp_path / "hf")
    tokens = torch.randint(0, V, (2, seq), generator=torch.Generator().manual_seed(3))
    assert_step_matches(tr, ref, tokens)


def test_the_written_config_reads_back_and_builds_the_same_rope(tmp_path):
    from transformers import AutoConfig
    spec = spec_from_config_dict(dict(CONFIG))
    d = to_hf_config_dict(spec)
    assert spec_from_config_dict(json.loads(json.dumps(d))) == spec
    d.pop("model_type")
    cfg = AutoConfig.for_model("phi3", **d)
    want = AutoConfig.for_model("phi3", **{k: v for k, v in CONFIG.items() if k != "model_type"})
    for k in ("short_factor", "long_factor", "original_max_position_embeddings", "rope_type", "partial_rotary_factor"):
        assert cfg.rope_parameters[k] == want.rope_parameters[k], k


@pytest.mark.parametrize("scaling,msg", [
    ({"type": "longrope", "short_factor": [1.0] * FACTORS}, r"long_factor = None must be a list"),
    ({"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}, r"4 short and 4 long factors; want one "
                                                                               r"per rotated frequency, 6"),
    ({"type": "longrope", "short_factor": [1.0] * 5 + [0.0], "long_factor": [1.0] * FACTORS}, r"must be a finite "
                                                                                             r"number > 0"),
])
def test_bad_factors_are_refused_in_one_line(scaling, msg):
    with pytest.raises(HorizonError, match=msg):
        spec_from_config_dict({**CONFIG, "rope_scaling": scaling})


def test_document_masks_past_the_pretraining_context_are_refused(tmp_path):
    """transformers picks the factors by a batch's longest position, which document masks make
    depend on the data; within the context both pick the short ones."""
    from horizon_exec.runtime.config import TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.policy import exact_policy
    spec = spec_from_config_dict(dict(CONFIG))
    with pytest.raises(HorizonError, match=r"longrope RoPE past its original_max_position_embeddings \(8\) with "
                                           r"document masks is not supported; use --seq <= 8"):
        Trainer(spec, exact_policy(batch=2, seq=16, doc_masks=True), TrainerConfig())
    Trainer(spec, exact_policy(batch=2, seq=8, doc_masks=True), TrainerConfig()).close()
