"""gpt-oss (issue 41) beyond what every family passes in tests/test_families.py (there: the
tensors transformers builds, the block op by op, what autograd saves, the temporaries, one fp32
step and --save-hf against transformers):

- the MoE MLP half in bf16 equals transformers' GptOssMLP bit for bit (router, clamped SwiGLU,
  biases, the interleaved gate|up columns);
- a step with YaRN RoPE as gpt-oss configures it and the router load-balancing loss equals
  transformers' (logits, loss, the aux loss, every gradient);
- a checkpoint whose experts are stored as the hub's are (MXFP4 blocks and scales, with its
  quantization_config) loads in transformers and in Horizon to the same logits, Horizon says it
  dequantized them, and --save-hf writes a full-precision folder transformers loads;
- the planner counts exactly the parameters transformers instantiates for GptOssConfig's
  defaults, and the presets' active parameters are the model card's."""
import json

import pytest
import torch

from horizon_exec.checkpoints import hf_mxfp4
from horizon_exec.checkpoints.hf_checkpoint import load_hf, save_hf, spec_from_hf_dir
from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hf_config import from_hf_config, spec_from_config_dict
from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.model_presets import PRESETS
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import assert_step_matches, rel_err
from tests.test_moe_exec import hf_moe

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
V, B, T = 96, 2, 16
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
        "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0}
BASE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
            vocab_size=V, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-6,
            sliding_window=6, max_position_embeddings=256, swiglu_limit=0.5, rope_parameters=YARN,
            tie_word_embeddings=False)


def hf_gpt_oss(seed: int = 0, **over):
    """A random transformers gpt-oss model (eager experts), every tensor random (test_moe_exec.hf_moe)."""
    return hf_moe("gpt_oss", {**BASE, **over}, seed)


def trainer_on(folder, **policy):
    spec = spec_from_hf_dir(folder)
    pol = exact_policy(batch=B, seq=T, act_ckpt_every=2, optimizer="after", grad_clip=0.0, loss_chunk_tokens=24,
                       **policy)
    return Trainer(spec, pol, TrainerConfig(random_init=False, runtime=RuntimeConfig(device="cpu")))


def _tokens(seed: int = 3):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def test_the_mlp_equals_transformers_bit_for_bit_in_bf16(tmp_path):
    from horizon_exec.model.gpt_oss_experts import gpt_oss_mlp
    ref = hf_gpt_oss()
    ref.config.save_pretrained(tmp_path)
    spec = spec_from_hf_dir(tmp_path)
    block = ref.model.layers[0].mlp.to(torch.bfloat16)
    w = {f"mlp.{n}": p.detach() for n, p in block.named_parameters()}
    h = 3 * torch.randn(2, T, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with torch.no_grad():
        want = block(h)[0]
        got = gpt_oss_mlp(spec, w, h)
    assert torch.equal(got, want)
    gate_up = torch.stack([x @ w["mlp.experts.gate_up_proj"][e] for e in range(4) for x in (h.view(-1, 64),)])
    assert (gate_up[..., ::2] > 0.5).any() and (gate_up[..., 1::2].abs() > 0.5).any()  # both clamps bite


def test_a_step_with_yarn_and_the_aux_loss_equals_transformers(tmp_path):
    ref = hf_gpt_oss(output_router_logits=True, router_aux_loss_coef=0.5)
    ref.save_pretrained(tmp_path / "hf")
    tr = trainer_on(tmp_path / "hf")
    assert tr.model.rope_scaling.kind == "yarn" and not tr.model.rope_scaling.truncate
    assert tr.model.router_aux_loss_coef == 0.5 and tr.model.layer_windows == (6, 0)
    load_hf(tr, tmp_path / "hf")
    tokens = _tokens()
    with torch.no_grad():
        out = ref(input_ids=tokens, labels=tokens)
    results, step = [], tr.step
    tr.step = lambda *a, **k: results.append(step(*a, **k)) or results[-1]
    grads = assert_step_matches(tr, ref, tokens)
    assert results[0].aux_loss == pytest.approx(out.aux_loss.item(), rel=1e-5)
    assert all(grads[n].norm() > 0 for n in grads if "sinks" in n or "router" in n)


def _write_mxfp4_checkpoint(ref, folder) -> int:
    """Save ref as the hub's gpt-oss checkpoints are saved: every expert stack as MXFP4 blocks and
    scales, the config with quantization_config; ref's own stacks set to what the blocks hold.
    Returns the stacks written."""
    from safetensors.torch import save_file
    folder.mkdir()
    tensors, stacks = {}, 0
    for name, p in ref.named_parameters():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = hf_mxfp4.quantize(p.detach().transpose(1, 2).contiguous())  # stored (E, out, in)
            with torch.no_grad():
                p.copy_(hf_mxfp4.held(blocks, scales))
            tensors[name + hf_mxfp4.BLOCKS], tensors[name + hf_mxfp4.SCALES] = blocks, scales
            stacks += 1
        else:
            tensors[name] = p.detach().clone()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = ref.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(cfg))
    return stacks


def test_an_mxfp4_checkpoint_loads_as_in_transformers_and_saves_unquantized(tmp_path):
    from transformers import AutoModelForCausalLM
    ref = hf_gpt_oss()
    stacks = _write_mxfp4_checkpoint(ref, tmp_path / "hub")
    tokens = _tokens(7)
    hub = AutoModelForCausalLM.from_pretrained(tmp_path / "hub", dtype=torch.float32,
                                               experts_implementation="eager").eval()
    with torch.no_grad():
        want = hub(input_ids=tokens).logits
        assert rel_err(ref(input_ids=tokens).logits, want) <= 1e-6  # transformers dequantized what we wrote
    tr = trainer_on(tmp_path / "hub")
    notes = load_hf(tr, tmp_path / "hub")
    assert len(notes) == 1 and f"{stacks} MXFP4 expert stacks dequantized" in notes[0]
    with tr:
        assert rel_err(tr.logits(tokens), want) <= 1e-5
        save_hf(tr, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in saved
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32,
                                                experts_implementation="eager").eval()
    with torch.no_grad():
        assert rel_err(back(input_ids=tokens).logits, want) <= 1e-5


def test_mxfp4_is_refused_outside_gpt_oss_and_a_disagreeing_top_k_by_name():
    from tests.hf_tiny import tiny_spec
    d = to_hf_config_dict(tiny_spec("llama"))
    with pytest.raises(HorizonError, match="mxfp4.*gpt_oss checkpoints only"):
        spec_from_config_dict({**d, "quantization_config": {"quant_method": "mxfp4"}})
    g = to_hf_config_dict(PRESETS["gpt-oss-20b"])
    assert spec_from_config_dict({**g, "experts_per_token": 4, "initial_context_length": 4096}) == \
        PRESETS["gpt-oss-20b"]  # the original release's duplicate keys, read and checked
    with pytest.raises(HorizonError, match="experts_per_token = 2 and num_experts_per_tok = 4 disagree"):
        spec_from_config_dict({**g, "experts_per_token": 2})


def test_the_planner_counts_what_transformers_builds_for_the_default_config(tmp_path):
    from transformers import AutoModelForCausalLM, GptOssConfig
    GptOssConfig().save_pretrained(tmp_path)
    spec = from_hf_config(tmp_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(GptOssConfig())
    assert spec.total_params == sum(p.numel() for p in model.parameters()) == PRESETS["gpt-oss-120b"].total_params
    assert spec.rope_scaling.kind == "yarn" and spec.layer_windows == (128, 0) * 18


# The gpt-oss model card (OpenAI, arXiv 2508.10925, table 1): total 116.83B / 20.91B, active per
# token 5.13B / 3.61B, which counts the unembedding but not the embedding (a lookup, no FLOPs).
CARD_B = {"gpt-oss-120b": (116.83, 5.13), "gpt-oss-20b": (20.91, 3.61)}


@pytest.mark.parametrize("name", CARD_B)
def test_the_presets_are_the_model_cards(name):
    spec = PRESETS[name]
    total, active = CARD_B[name]
    assert spec.total_params / 1e9 == pytest.approx(total, abs=0.005)
    assert (spec.active_params - spec.embedding_params) / 1e9 == pytest.approx(active, rel=0.01)
