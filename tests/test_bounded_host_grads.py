"""Bounded host gradients (issue 18, one item): with optimizer='backward', policy.max_host_grads
caps how many units' gradients wait on the host for the CPU optimizer; an offload waits until the
oldest waiting one has been applied, like the device side's pending offloads.

- The planner: the waits are dependencies of the Schedule, so the simulated timeline obeys them;
  the host gradients held drop to the bound; the step never gets faster for it.
- The issue's case: dense-120b on an H200 with 1.5 TB at batch 4 x 2048, optimizer backward, no
  working copy, checkpoints on the device, needs 1.47 TiB (160 GiB of waiting gradients) and does
  not fit; bounded to 2 it fits.
- The executor runs the same Schedule: the trained weights are bit for bit those of the unbounded
  run, and every bounded offload started after the update it waited for.
"""
from dataclasses import replace

import pytest
import torch

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import OpKind, build_schedule
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import Policy

SPEC = ModelSpec(n_layers=6, hidden=128, n_heads=2, n_kv_heads=1, ffn_hidden=352, vocab=512)


def _pol(k, **kw):
    return Policy(batch=2, seq=64, optimizer="backward", grad_clip=0.0, max_host_grads=k, **kw)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_bound_holds_in_the_plan(k):
    # a host whose AdamW is 1000x slower than the preset's: the optimizer lags the backward, so
    # without a bound the host holds every block's gradients (the regime the bound is for; at the
    # preset's rate the H100's measured per-op costs give the optimizer time to keep up)
    hw = make_hardware("h100-sxm", "64GiB")
    hw = replace(hw, host=replace(hw.host, adam_Gparams_per_s=hw.host.adam_Gparams_per_s / 1000))
    free, bound = simulate(build_schedule(SPEC, _pol(0)), hw), simulate(build_schedule(SPEC, _pol(k)), hw)
    tl = bound.timeline.set_index("op_id")
    for op in bound.schedule.ops:
        assert all(tl.end_s[d] <= tl.start_s[op.id] + 1e-12 for d in op.deps)
    # bf16 host grads: k blocks' at most, plus one head's and the embedding's (the executor's pool
    # keeps, per size, the most buffers of that size ever live: the head's is a size of its own)
    blocks, head, emb = SPEC.layer_params * 2, SPEC.head_params * 2, SPEC.embedding_params * 2
    assert bound.host.by_role["grads"] <= k * blocks + head + emb
    assert bound.host.by_role["grads"] <= free.host.by_role["grads"]
    # the unbounded step holds all six blocks' grads at once (the optimizer lags)
    assert free.host.by_role["grads"] == 6 * blocks + head + emb > bound.host.by_role["grads"]
    assert bound.summary.step_time_s >= free.summary.step_time_s * (1 - 1e-9)


def test_the_issues_case_fits_with_a_bound():
    hw = make_hardware("h200", "1.5TB")
    base = dict(batch=4, seq=2048, optimizer="backward", grad_clip=0.0, working_copy=False, act_ckpt_on="device")
    free = simulate(build_schedule(model_preset("dense-120b"), Policy(**base)), hw)
    bound = simulate(build_schedule(model_preset("dense-120b"), Policy(**base, max_host_grads=2)), hw)
    assert not free.summary.fits and free.host.by_role["grads"] > 150 * 2**30
    assert bound.summary.fits and bound.host.by_role["grads"] < 16 * 2**30


def test_policy_refuses_a_bound_where_it_cannot_apply():
    with pytest.raises(HorizonError, match="max_host_grads=2 bounds the gradients waiting for optimizer='backward'"):
        Policy(max_host_grads=2)  # pipelined
    with pytest.raises(HorizonError, match="micro_batches=2"):
        Policy(batch=4, micro_batches=2, optimizer="backward", grad_clip=0.0, max_host_grads=2)
    with pytest.raises(HorizonError, match="must be an integer >= 0"):
        Policy(optimizer="backward", grad_clip=0.0, max_host_grads=-1)


@pytest.mark.usefixtures("one_intraop_thread")
def test_the_executor_runs_it_and_trains_the_same():
    from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    fp32 = dict(compute_dtype="fp32", grad_dtype="fp32", working_copy=False)
    toks = [torch.randint(0, SPEC.vocab, (2, 64), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    out = {}
    for k in (0, 1):
        cfg = TrainerConfig(optimizer=OptimizerConfig(lr=1e-2), admission=AdmissionConfig(enabled=False))
        with Trainer(SPEC, _pol(k, **fp32), cfg) as tr:
            for t in toks:
                res = tr.step(t)
            out[k] = {n: v.clone() for n, v in tr.state_dict().items()}
            if k:
                tl = res.timeline.set_index("op_id")
                waits = [(o, d) for o in tr.sched.ops if o.kind == OpKind.OFFLOAD_GRADS for d in o.deps
                         if tr.sched.ops[d].kind == OpKind.OPTIMIZER]
                assert waits  # the bound made offloads wait for updates ...
                for o, d in waits:  # ... and the engine honoured every such wait
                    assert tl.end_s[d] <= tl.start_s[o.id]
    assert all(torch.equal(out[0][n], out[1][n]) for n in out[0])
