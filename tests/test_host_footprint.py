"""The planner's dynamic host footprint is what the executor really holds.

Both backends keep freed dynamic host buffers (host checkpoints, per-step host gradients) in an
exact-size pool, so the memory held is, per size, the most buffers of that size ever live at
once; the planner (horizon_sim/sim/memory.py host_footprint) counts that, not the highest sum
of live buffers, which is less when checkpoints and gradients peak at different times.
"""
import pytest
import torch

from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import build_schedule
from horizon_sim.schedule.op import Space
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.cpu_machine import CPU_HW

SPEC = ModelSpec(n_layers=6, hidden=128, n_heads=4, n_kv_heads=2, ffn_hidden=352, vocab=512)


def _predicted_dynamic_bytes(pol) -> int:
    sched = build_schedule(SPEC, pol)
    host = simulate(sched, CPU_HW).host
    static = sum(b.bytes for b in sched.buffers.values() if b.static and b.space == Space.HOST)
    return host.total_bytes - static - host.by_role["runtime"]


# Modes where the live buffers do not depend on how far one lane runs ahead of another
# (`backward` frees each gradient when its optimizer op ends: a lagging CPU lane holds more).
@pytest.mark.parametrize("kw,pool_above_concurrent", [
    (dict(optimizer="pipelined"), False),                           # grads static: checkpoints only
    (dict(optimizer="after"), True),                                # checkpoints, then every grad
    (dict(optimizer="after", act_ckpt_every=2), True),
    (dict(optimizer="after", act_ckpt_on="device"), False),             # grads only
    (dict(optimizer="after", micro_batches=2, working_copy=False), False),  # fp32 grads, no ckpts
])
def test_planned_dynamic_host_bytes_equal_what_the_pool_holds(kw, pool_above_concurrent):
    pol = Policy(batch=2, seq=64, **kw)
    with Trainer(SPEC, pol) as tr:
        held = []
        for s in range(3):
            tr.step(torch.randint(0, SPEC.vocab, (pol.batch, pol.seq), generator=torch.Generator().manual_seed(s)))
            held.append(tr.backend.pool.held_bytes)
        concurrent = tr.buffers.host_peak
    assert held[0] > 0 and held == [held[0]] * 3  # made in step 1, reused after
    assert _predicted_dynamic_bytes(pol) == held[0]
    # where checkpoints and gradients peak apart, the old model (the concurrent peak) fell short
    assert (held[0] > concurrent) == pool_above_concurrent


@pytest.mark.parametrize("tied,micro,want", [
    (False, 1, lambda m: 0),                                            # bf16 grads land as they are
    (False, 2, lambda m: 2 * (m.layer_params + m.head_params)),         # fp32 accumulators
    (True, 1, lambda m: 2 * m.embedding_params),  # the tied matrix's grad is fp32 on the host: widened
])
def test_a_dma_link_adds_one_stage_per_widened_or_accumulated_gradient_size(tied, micro, want):
    """On CUDA a gradient added into, or widened into, an fp32 host grad first lands in a
    page-locked stage of its link dtype (bf16 here), one pooled block per size; a CPU-driven
    link casts while it copies and needs none."""
    import dataclasses
    spec = dataclasses.replace(SPEC, tied_embeddings=tied)
    sched = build_schedule(spec, Policy(batch=2, seq=64, micro_batches=micro))
    dma = dataclasses.replace(CPU_HW, link=dataclasses.replace(CPU_HW.link, cpu_driven=False))
    staging = {hw.link.cpu_driven: simulate(sched, hw).host.by_role["staging"] for hw in (CPU_HW, dma)}
    assert staging[False] - staging[True] == want(spec)
