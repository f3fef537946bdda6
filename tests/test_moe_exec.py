"""The executor runs mixture-of-experts blocks as transformers does (issue 28): tiny random
Qwen3-MoE (norm_topk_prob true and false), Mixtral and Qwen2-MoE (shared expert) models saved
with save_pretrained and read back through config.json + safetensors; logits, one fp32 step's
loss and every gradient agree with transformers' eager experts (rel err <= 1e-5). The router
aux loss is off here (output_router_logits false); tests/test_moe_aux_loss.py turns it on.
Each case runs the streamed schedule (forward, recompute, backward with K = 2, 2 micro-batches;
one also with kept layers in the layer order).
"""
import pytest
import torch

from horizon_exec.checkpoints.hf_checkpoint import load_hf, spec_from_hf_dir
from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import OpKind
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import assert_step_matches, randomized_, rel_err

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
V, B, T = 96, 4, 16

BASE = dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
            rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu", max_position_embeddings=256,
            num_experts_per_tok=2, output_router_logits=False)

CASES = {
    # name: (model_type, config overrides)
    "qwen3_moe-norm": ("qwen3_moe", dict(num_experts=6, moe_intermediate_size=32, intermediate_size=96,
                                         head_dim=16, norm_topk_prob=True)),
    "qwen3_moe-raw": ("qwen3_moe", dict(num_experts=6, moe_intermediate_size=32, intermediate_size=96,
                                        head_dim=16, norm_topk_prob=False)),
    "mixtral": ("mixtral", dict(num_local_experts=4, intermediate_size=48, sliding_window=None)),
    "qwen2_moe": ("qwen2_moe", dict(num_experts=5, num_experts_per_tok=3, moe_intermediate_size=24,
                                    shared_expert_intermediate_size=40, intermediate_size=96,
                                    norm_topk_prob=False)),
}


def hf_moe(model_type, overrides, seed=0):
    """A random transformers MoE model with eager experts (the reference loop); norm weights,
    biases and the router random too (Qwen's routers start at zero: every choice a tie)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(model_type, **{**BASE, **overrides})
    return randomized_(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, experts_implementation="eager"),
                       seed + 1)


def pair(tmp_path, name, device="cpu", **policy):
    ref = hf_moe(*CASES[name])
    ref.save_pretrained(tmp_path / "hf")
    spec = spec_from_hf_dir(tmp_path / "hf")
    pol = exact_policy(batch=B, seq=T, micro_batches=2, act_ckpt_every=2, optimizer="after", grad_clip=0.0,
                       loss_chunk_tokens=40, **policy)
    tr = Trainer(spec, pol, TrainerConfig(random_init=False, runtime=RuntimeConfig(device=device)))
    load_hf(tr, tmp_path / "hf")
    return tr, ref


@pytest.mark.parametrize("name,policy", [*((n, {}) for n in CASES),
                                         # kept layers run their backward from the saved graph
                                         # (weights re-read from the slot), in the layer order
                                         ("qwen2_moe", dict(keep_last=2, mb_order="layer"))])
def test_logits_and_one_training_step_match_transformers(tmp_path, name, policy):
    tr, ref = pair(tmp_path, name, **policy)
    assert any(op.kind == OpKind.BACKWARD_SAVED for op in tr.sched.ops) == bool(policy)
    assert tr.model.family == CASES[name][0] and tr.model.router_aux_loss_coef == 0
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    ref_grads = assert_step_matches(tr, ref, tokens)
    # every expert and the router trained: the gradients are not trivially zero
    assert all(ref_grads[n].norm() > 0 for n in ref_grads if "mlp." in n)


def test_norm_topk_prob_matters(tmp_path):
    """The same Qwen3-MoE weights without the renormalised top-k give other logits: the
    parity above would fail if the flag were ignored."""
    tr, ref = pair(tmp_path, "qwen3_moe-norm")
    tokens = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(4))
    with tr:
        with torch.no_grad():
            want = ref(input_ids=tokens).logits
        object.__setattr__(tr.model, "norm_topk_prob", False)
        assert rel_err(tr.logits(tokens), want) > 1e-3


@pytest.mark.parametrize("name", list(CASES))
def test_moe_mlp_equals_transformers_block_bit_for_bit_in_bf16(tmp_path, name):
    """The MLP half alone, in bf16, against the family's sparse block: equal bit for bit (the
    same kernels in the same order, Mixtral's fp32 routing weights included)."""
    from horizon_exec.model.moe_block import moe_mlp
    ref = hf_moe(*CASES[name])
    ref.config.save_pretrained(tmp_path)
    spec = spec_from_hf_dir(tmp_path)
    block = ref.model.layers[0].mlp.to(torch.bfloat16)
    w = {f"mlp.{n}": p.detach() for n, p in block.named_parameters()}
    h = torch.randn(2, T, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(moe_mlp(spec, w, h), block(h))
