"""The router load-balancing loss (issue 28): an MoE config with output_router_logits true
trains with loss = CE + router_aux_loss_coef * aux, as transformers' load_balancing_loss_func
defines aux (model/router_aux.py).

- one micro-batch: logits, the loss (aux included), the reported aux and every fp32 gradient
  equal transformers' for Qwen3-MoE, Mixtral and Qwen2-MoE (streamed: forward, recompute,
  backward with K = 2); the coefficient is large enough that the aux visibly moves gradients;
- two micro-batches, in the micro and the layer order, with recomputed and with kept layers:
  the loss and every gradient equal the reference Horizon defines, built from transformers:
  the token-mean CE of the whole batch + coef * the mean over micro-batches of
  load_balancing_loss_func on each micro-batch's router logits.
"""
import importlib

import pytest
import torch

from horizon_exec.checkpoints.hf_checkpoint import load_hf, spec_from_hf_dir
from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import OpKind
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import assert_step_matches, hf_grads, rel_err
from tests.test_moe_exec import CASES, hf_moe

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
V, B, T = 96, 4, 16
COEF = 0.5  # transformers' default 0.001 moves gradients by less than the tolerance


def pair(tmp_path, name, device="cpu", **policy):
    mt, over = CASES[name]
    ref = hf_moe(mt, {**over, "output_router_logits": True, "router_aux_loss_coef": COEF})
    ref.save_pretrained(tmp_path / "hf")
    spec = spec_from_hf_dir(tmp_path / "hf")
    assert spec.router_aux_loss_coef == COEF
    pol = exact_policy(batch=B, seq=T, act_ckpt_every=2, optimizer="after", grad_clip=0.0, loss_chunk_tokens=40,
                       **{"micro_batches": 1, **policy})
    tr = Trainer(spec, pol, TrainerConfig(random_init=False, runtime=RuntimeConfig(device=device)))
    load_hf(tr, tmp_path / "hf")
    return tr, ref


def recorded(tr) -> list:
    """The StepResults of tr.step, as they come."""
    results, step = [], tr.step
    tr.step = lambda *a, **k: results.append(step(*a, **k)) or results[-1]
    return results


def per_micro_reference(micro_batches: int, seen: dict):
    """transformers' model with the aux loss averaged over micro-batches (Horizon's definition):
    CE over the whole batch + coef * mean_m load_balancing_loss_func(micro-batch m's rows)."""
    def ref_grads(ref, tokens):
        aux_of = importlib.import_module(type(ref).__module__).load_balancing_loss_func
        ref.zero_grad()
        out = ref(input_ids=tokens, output_router_logits=True)
        ce = ref.loss_function(out.logits, tokens, ref.config.vocab_size)
        rows = tokens.numel() // micro_batches  # micro-batch m: sequences m*mb .. (m+1)*mb - 1
        aux = sum(aux_of(tuple(g[m * rows:(m + 1) * rows] for g in out.router_logits), ref.num_experts,
                         ref.num_experts_per_tok) for m in range(micro_batches)) / micro_batches
        loss = ce + ref.router_aux_loss_coef * aux
        loss.backward()
        seen["aux"] = aux.item()
        return loss.item(), {n: p.grad.clone() for n, p in ref.named_parameters()}
    return ref_grads


def _tokens():
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", ["qwen3_moe-norm", "mixtral", "qwen2_moe"])
def test_one_step_with_the_aux_loss_matches_transformers(tmp_path, name):
    tr, ref = pair(tmp_path, name)
    results, tokens = recorded(tr), _tokens()
    with torch.no_grad():
        out = ref(input_ids=tokens, labels=tokens)
    ref_grads = assert_step_matches(tr, ref, tokens)  # transformers' own loss: CE + coef * aux
    assert results[0].aux_loss == pytest.approx(out.aux_loss.item(), rel=1e-5)
    assert results[0].loss == pytest.approx(out.loss.item(), rel=1e-5)
    # the aux loss moves the router's gradients well beyond the tolerance: it is not ignored
    ref.config.output_router_logits = False
    _, no_aux = hf_grads(ref, tokens)
    assert rel_err(no_aux["model.layers.0.mlp.gate.weight"], ref_grads["model.layers.0.mlp.gate.weight"]) > 1e-2


@pytest.mark.parametrize("name,policy", [
    ("qwen3_moe-norm", dict(mb_order="micro")),                 # forward, recompute, backward per micro-batch
    ("qwen3_moe-norm", dict(mb_order="layer")),                 # every micro-batch's forward first
    ("qwen2_moe", dict(mb_order="layer", keep_last=2)),         # kept layers: backward from the saved graph
    ("mixtral", dict(mb_order="micro", keep_last=1)),
])
def test_two_micro_batches_match_the_per_micro_batch_reference(tmp_path, name, policy):
    tr, ref = pair(tmp_path, name, micro_batches=2, **policy)
    assert any(op.kind == OpKind.BACKWARD_SAVED for op in tr.sched.ops) == ("keep_last" in policy)
    # 3 layers, K = 2: a layer is recomputed unless the last two keep theirs (layer 0 is a checkpoint)
    assert any(op.kind == OpKind.RECOMPUTE for op in tr.sched.ops) == (policy.get("keep_last", 0) < 2)
    results, tokens, seen = recorded(tr), _tokens(), {}
    want = assert_step_matches(tr, ref, tokens, ref_grads=per_micro_reference(2, seen))
    assert results[0].aux_loss == pytest.approx(seen["aux"], rel=1e-5)
    # the per-micro-batch mean is not the whole batch's aux: the reference above is the one that fits
    _, whole = hf_grads(ref, tokens)
    assert rel_err(whole["model.layers.0.mlp.gate.weight"], want["model.layers.0.mlp.gate.weight"]) > 1e-3


def test_eval_loss_is_cross_entropy_alone(tmp_path):
    """Eval reports the token losses' sum: the aux (not a per-token loss) is not in it."""
    tr, ref = pair(tmp_path, "qwen3_moe-norm")
    tokens = _tokens()
    with tr, torch.no_grad():
        out = ref(input_ids=tokens, output_router_logits=False, labels=tokens)
        loss_sum, n = tr.eval_loss(tokens)
    assert loss_sum / n == pytest.approx(out.loss.item(), rel=1e-5)
