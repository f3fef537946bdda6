"""bf16 training (fp32 master weights and Adam moments on the host, bf16 working copy, bf16
device weights, activations and link gradients) tracks an autograd bf16 baseline.

Baseline: transformers' LlamaForCausalLM with fp32 parameters run under
torch.autocast("cpu", bfloat16), whole-model autograd, clip_grad_norm_ and fp32
torch.optim.AdamW: the standard mixed-precision recipe. It is not bit-comparable (autocast
keeps the residual stream, norms and the loss in fp32 where the executor streams bf16), so
the check is statistical: over 50 steps of a learnable synthetic language, the loss at the
end (mean of the last 5 steps, each step a different batch) is within 1% of the baseline's
and both fall well below the initial ln(V). The same holds with the Adam moments in bf16
(`states_dtype="bf16"`, the native AdamW kernel: fp32 math, moments stored rounded).
"""
import dataclasses
import math

import pytest
import torch

from horizon_exec.model.hf import copy_to_hf, hf_model
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

V, T, B, STEPS = 128, 32, 4, 50
LR, BETAS, CLIP = 3e-3, (0.9, 0.95), 1.0


pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _batches():
    """A first-order Markov chain in which each token has 3 possible successors (entropy
    ln 3 ~ 1.1 nats), served as random windows: learnable, so the loss must fall."""
    g = torch.Generator().manual_seed(0)
    succ = torch.randint(0, V, (V, 3), generator=g)
    choice = torch.randint(0, 3, (20000,), generator=g)
    stream = [0]
    for c in choice.tolist():
        stream.append(int(succ[stream[-1], c]))
    stream = torch.tensor(stream)
    starts = torch.randint(0, len(stream) - T, (STEPS, B), generator=g)
    return [torch.stack([stream[s:s + T] for s in row.tolist()]) for row in starts]


def test_bf16_loss_tracks_autocast_baseline():
    spec = ModelSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=V)
    pol = Policy(batch=B, seq=T, act_ckpt_every=2, slots=2, optimizer="pipelined", grad_clip=CLIP)
    assert (pol.compute_dtype, pol.grad_dtype, pol.master_dtype, pol.working_copy) == ("bf16", "bf16", "fp32", True)
    batches = _batches()
    with Trainer(spec, pol, TrainerConfig(optimizer=OptimizerConfig(lr=LR, betas=BETAS), seed=0)) as tr:
        ref = hf_model(spec)
        copy_to_hf(tr, ref)
        ours = [tr.step(tok).loss for tok in batches]
    cfg = TrainerConfig(optimizer=OptimizerConfig(lr=LR, betas=BETAS), seed=0)
    with Trainer(spec, dataclasses.replace(pol, states_dtype="bf16"), cfg) as tr:
        assert tr.store.moments(0)[0].dtype == torch.bfloat16
        ours_bf16_moments = [tr.step(tok).loss for tok in batches]
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=BETAS, weight_decay=0.0)
    base = []
    for tok in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ref(input_ids=tok, labels=tok).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        base.append(loss.item())
    assert ours[0] == pytest.approx(base[0], rel=1e-2)
    end_ours, end_base = sum(ours[-5:]) / 5, sum(base[-5:]) / 5
    assert end_ours == pytest.approx(end_base, rel=0.01), (ours[-5:], base[-5:])
    assert end_ours < 0.6 * math.log(V) and end_base < 0.6 * math.log(V)
    assert ours_bf16_moments[0] == ours[0]  # the same weights before any update
    end_b = sum(ours_bf16_moments[-5:]) / 5
    assert end_b == pytest.approx(end_base, rel=0.01), (ours_bf16_moments[-5:], base[-5:])
