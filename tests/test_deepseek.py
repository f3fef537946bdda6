"""DeepSeek-V2/V3 (issue 41) beyond what every family passes in tests/test_families.py (there:
each block shape's tensors against transformers', the blocks op by op, what autograd saves, the
temporaries, one fp32 step and --save-hf against transformers):

- a step of a V3 model with YaRN's mscale (in the softmax scale and the tables), a dense first
  block, two micro-batches and kept layers equals transformers' (logits, loss, every gradient);
- a V3 checkpoint carrying the multi-token-prediction layer loads (that layer dropped, and said
  so) and --save-hf writes the model without it;
- a V3 run resumes bit for bit, and two data-parallel ranks train what one rank does with the
  whole batch in two micro-batches;
- the planner counts exactly the parameters transformers instantiates for DeepseekV3Config's
  defaults, and the presets' active parameters are the published ones."""
import json
import sys
from pathlib import Path

import pytest
import torch

from horizon_exec.checkpoints.hf_checkpoint import load_hf, save_hf, spec_from_hf_dir
from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import OpKind
from horizon_sim.specs.hf_config import from_hf_config
from horizon_sim.specs.model_presets import PRESETS
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import assert_step_matches, rel_err
from tests.test_moe_exec import hf_moe

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
sys.path.insert(0, str(Path(__file__).resolve().parent))
V, B, T = 96, 4, 16
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}
BASE = dict(num_hidden_layers=3, hidden_size=64, intermediate_size=160, moe_intermediate_size=32,
            num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
            qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
            first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5, vocab_size=V,
            max_position_embeddings=256, rope_parameters=YARN, rms_norm_eps=1e-6)


def hf_v3(seed: int = 0):
    """A random transformers DeepSeek-V3 (eager experts), every tensor random, its correction bias
    too (test_moe_exec.hf_moe)."""
    return hf_moe("deepseek_v3", BASE, seed)


def _tokens(seed: int = 3):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def test_a_step_with_mscale_two_micro_batches_and_kept_layers_equals_transformers(tmp_path):
    ref = hf_v3()
    ref.save_pretrained(tmp_path / "hf")
    spec = spec_from_hf_dir(tmp_path / "hf")
    assert [s.n_experts for s, _ in spec.block_shapes] == [0, 8] and spec.rope_scaling.mscale_all_dim == 1.0
    pol = exact_policy(batch=B, seq=T, micro_batches=2, act_ckpt_every=2, keep_last=1, mb_order="layer",
                       optimizer="after", grad_clip=0.0, loss_chunk_tokens=24)
    tr = Trainer(spec, pol, TrainerConfig(random_init=False, runtime=RuntimeConfig(device="cpu")))
    assert any(op.kind == OpKind.BACKWARD_SAVED for op in tr.sched.ops)  # the last block's graph is kept
    load_hf(tr, tmp_path / "hf")
    grads = assert_step_matches(tr, ref, _tokens())
    assert grads["model.layers.1.mlp.gate.weight"].norm() > 0 and grads["model.layers.0.mlp.gate_proj.weight"].norm() > 0


def test_the_multi_token_prediction_layer_is_dropped_and_said_so(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    ref = hf_v3()
    ref.save_pretrained(tmp_path / "hub")
    f = next((tmp_path / "hub").glob("*.safetensors"))
    sd = load_file(f)
    # the hub's V3 keeps its MTP module as a layer past the last block (model.layers.61 there)
    extra = {k.replace("model.layers.2.", "model.layers.3."): v.clone() for k, v in sd.items()
             if k.startswith("model.layers.2.")}
    extra["model.layers.3.eh_proj.weight"] = torch.randn(64, 128)
    save_file({**sd, **extra}, str(f), metadata={"format": "pt"})
    tr = Trainer(spec_from_hf_dir(tmp_path / "hub"), exact_policy(batch=B, seq=T),
                 TrainerConfig(random_init=False, runtime=RuntimeConfig(device="cpu")))
    notes = load_hf(tr, tmp_path / "hub")
    assert len(notes) == 1 and "layer(s) 3 beyond the model's 3 blocks" in notes[0]
    with tr:
        with torch.no_grad():
            want = ref(input_ids=_tokens(5)).logits
        assert rel_err(tr.logits(_tokens(5)), want) <= 1e-5
        save_hf(tr, tmp_path / "out")
    saved = load_file(next((tmp_path / "out").glob("*.safetensors")))
    assert not any(k.startswith("model.layers.3.") for k in saved)
    assert saved["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32, experts_implementation="eager")
    with torch.no_grad():
        assert rel_err(back.eval()(input_ids=_tokens(5)).logits, want) <= 1e-5


def test_a_run_resumes_bit_for_bit(tmp_path):
    from tests.test_moe_resume import STEPS, _loop, _state
    from horizon_exec.checkpoints import ckpt as ckpt_mod
    from horizon_exec.data.data import load_dataset
    from horizon_exec.data.tokenize import ByteTokenizer
    from horizon_sim.specs.policy import Policy
    import dist_worker
    spec = dist_worker.spec(False, moe="deepseek")
    K = 4
    ds = load_dataset(None, ByteTokenizer(), seq=32, eval_fraction=0.01)
    pol = Policy(batch=2, seq=32, optimizer="pipelined", grad_clip=1.0)
    tr_u, straight = _loop(ds, pol, spec=spec)
    with tr_u:
        tr_u.runner.block_buffers.set_(1, "mlp.gate.e_score_correction_bias", torch.linspace(-1, 1, 8))
        straight.run()
        want = _state(tr_u)
    tr_i, interrupted = _loop(ds, pol, ckpt_dir=tmp_path, spec=spec)
    with tr_i:
        tr_i.runner.block_buffers.set_(1, "mlp.gate.e_score_correction_bias", torch.linspace(-1, 1, 8))
        interrupted.run(until=K)
    tr_r, resumed = _loop(ds, pol, ckpt_dir=tmp_path, seed=123, spec=spec)  # the bias must come from the checkpoint
    with tr_r:
        assert resumed.resume(tmp_path).name == "step-00000004"
        assert torch.equal(tr_r.runner.block_buffers.host[1]["mlp.gate.e_score_correction_bias"], torch.linspace(-1, 1, 8))
        resumed.run()
        got = _state(tr_r)
    assert [resumed.losses[s] for s in range(K, STEPS)] == [straight.losses[s] for s in range(K, STEPS)]
    assert set(got) == set(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
    assert ckpt_mod.latest_checkpoint(tmp_path).name == "step-00000006"


def test_two_ranks_train_what_one_rank_does_with_two_micro_batches(tmp_path):
    from test_dist_exec import reference, torchrun
    torchrun(tmp_path, "parity", 2, opt="pipelined", moe="deepseek")
    got = torch.load(tmp_path / "master.pt")
    losses = json.loads((tmp_path / "losses.json").read_text())
    whole, whole_losses = reference("pipelined", 2, False, moe="deepseek")
    assert got.shape == whole.shape
    assert (got - whole).abs().max().item() <= 1e-5
    assert losses == pytest.approx(whole_losses, rel=1e-6)


def test_the_planner_counts_what_transformers_builds_for_the_default_config(tmp_path):
    from transformers import AutoModelForCausalLM, DeepseekV3Config
    DeepseekV3Config().save_pretrained(tmp_path)
    spec = from_hf_config(tmp_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(DeepseekV3Config())
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    assert [n for _, n in spec.block_shapes] == [3, 58]


# Published: the DeepSeek-V3 report (arXiv 2412.19437) "671B total, 37B activated"; the DeepSeek-V2
# report (arXiv 2405.04434) "236B total, 21B activated" and V2-Lite "15.7B total, 2.4B activated". The
# activated counts leave the embedding out (a lookup), as the gpt-oss card does; they are rounded to
# the digit shown, so each is held to that rounding.
CARDS = {"deepseek-v3": (671, 37, 0.5), "deepseek-v2": (236, 21, 0.5), "deepseek-v2-lite": (15.7, 2.4, 0.06)}


@pytest.mark.parametrize("name", CARDS)
def test_the_presets_are_the_published_counts(name):
    spec = PRESETS[name]
    total, active, tol = CARDS[name]
    assert spec.total_params / 1e9 == pytest.approx(total, abs=tol)
    assert (spec.active_params - spec.embedding_params) / 1e9 == pytest.approx(active, abs=tol)
