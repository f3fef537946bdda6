"""Issue 19 item 14: the device peak the planner promises is an upper bound whatever the timing.

Summary.device_peak_bytes is the bound the Schedule's dependencies and FIFO lanes guarantee
(horizon_sim/sim/device_bound.py); the simulated timeline's own peak is beside it
(device_typical_peak_bytes). A late offload raises the real peak above the typical one, never
above the bound: checked in the simulator with a slowed link and random speeds, and in the
executor with its D2H lane slowed down for real.
"""
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_exec.measure.validate.configs import CONFIGS
from horizon_sim.schedule import OpKind, build_schedule
from horizon_sim.sim.device_bound import device_peak_bound
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

HW = make_hardware("h100-pcie")
HW = replace(HW, host=replace(HW.host, disk_GiB=4096.0, disk_read_GBps=7.0, disk_write_GBps=7.0))  # the disk tier's

def _slowed(hw, d2h=1.0, h2d=1.0, cpu=1.0):
    link = replace(hw.link, d2h_GBps=hw.link.d2h_GBps * d2h, h2d_GBps=hw.link.h2d_GBps * h2d)
    host = replace(hw.host, adam_Gparams_per_s=hw.host.adam_Gparams_per_s * cpu)
    return replace(hw, link=link, host=host)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name for c in CONFIGS])
def test_a_late_offload_raises_the_peak_up_to_the_bound_and_no_further(cfg):
    """The validation configurations: with the d2h link 50x slower the simulated peak rises
    (offloads pile up to the backpressure limit) and meets the bound; the typical peak stays
    below it."""
    sched = build_schedule(cfg.model, cfg.policy)
    fast, slow = simulate(sched, HW).summary, simulate(sched, _slowed(HW, d2h=0.02)).summary
    library = int(HW.device.library_workspace_MiB * 2**20)  # cuBLAS workspaces, held all step
    assert fast.device_peak_bytes == slow.device_peak_bytes == device_peak_bound(sched) + library  # timing-free
    assert fast.device_typical_peak_bytes <= slow.device_typical_peak_bytes <= slow.device_peak_bytes
    # and tight: met by a slow link (within 4%: nowc_micro's slow-link timeline peaks 3.7% under the
    # bound since the H100 presets carry measured per-op costs, which reorder its buffers' lives; the
    # others meet it exactly)
    assert slow.device_peak_bytes <= 1.04 * slow.device_typical_peak_bytes


def test_the_issue_case_batch4_k3_is_covered():
    """The issue's batch4_k3: its peak measured 22.9 MiB against 21.7 predicted when an offload
    was late. The bound covers the late-offload peak; the typical one does not."""
    cfg = next(c for c in CONFIGS if c.name == "batch4_k3")
    sched = build_schedule(cfg.model, cfg.policy)
    fast, slow = simulate(sched, HW).summary, simulate(sched, _slowed(HW, d2h=0.02)).summary
    assert fast.device_typical_peak_bytes < slow.device_typical_peak_bytes <= fast.device_peak_bytes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(L=st.integers(2, 10), H=st.sampled_from([128, 256]), batch=st.integers(1, 4), micro=st.sampled_from([1, 2]),
       K=st.integers(1, 4), slots=st.integers(2, 4), where=st.sampled_from(["host", "device"]),
       opt=st.sampled_from(["after", "pipelined", "backward"]), wc=st.booleans(),
       d2h=st.floats(0.001, 10), h2d=st.floats(0.001, 10), cpu=st.floats(0.001, 10))
def test_the_bound_covers_any_simulated_timing(L, H, batch, micro, K, slots, where, opt, wc, d2h, h2d, cpu):
    spec = ModelSpec(n_layers=L, hidden=H, n_heads=4, n_kv_heads=2, ffn_hidden=2 * H, vocab=512)
    pol = Policy(batch=batch * micro, micro_batches=micro, seq=64, act_ckpt_every=min(K, L), slots=slots,
                 act_ckpt_on=where, optimizer=opt, grad_clip=0.0 if opt == "backward" else 1.0, working_copy=wc)
    s = simulate(build_schedule(spec, pol), _slowed(HW, d2h, h2d, cpu)).summary
    assert s.device_typical_peak_bytes <= s.device_peak_bytes


def test_fit_verdict_and_admission_use_the_bound():
    cfg = next(c for c in CONFIGS if c.name == "batch4_k3")
    sched = build_schedule(cfg.model, cfg.policy)
    s = simulate(sched, HW).summary
    assert s.device_typical_peak_bytes < s.device_peak_bytes
    between = (s.device_typical_peak_bytes + s.device_peak_bytes) / 2
    hw = replace(HW, device=replace(HW.device, hbm_GiB=between / 2**30, reserved_GiB=0.0))
    tight = simulate(sched, hw).summary
    assert not tight.fits and "device needs" in tight.why
    from horizon_exec.runtime.admission import admit
    adm = admit(cfg.model, cfg.policy, sched, device_budget_bytes=10**12, advise=False)
    assert (adm.device_by_role["weights"] + adm.device_by_role["constants"]
            + adm.device_by_role["activations_grads_workspaces"]) == s.device_peak_bytes


def test_the_executor_with_a_late_d2h_lane_stays_under_the_bound():
    """The CPU backend with its D2H lane made slow for real (each offload and checkpoint save
    sleeps): the measured device peak (arena buffers + measured temporaries) rises, and stays
    under the bound plus the executor's device constants."""
    cfg = next(c for c in CONFIGS if c.name == "batch4_k3")
    # fp32 compute: the late lane and the bound are the point, not the dtype (torch's bf16 GEMMs
    # are ~60x slower on CPUs without AVX-512); fp32 holds twice the activation bytes
    model, pol = cfg.model, replace(cfg.policy, compute_dtype="fp32", working_copy=False, split_master=False)
    bound = simulate(build_schedule(model, pol), HW).summary.device_peak_bytes  # constants included

    def late(op):
        if op.kind in (OpKind.OFFLOAD_GRADS, OpKind.SAVE_CKPT):
            time.sleep(0.03)
    import torch
    toks = torch.randint(0, model.vocab, (pol.batch, pol.seq), generator=torch.Generator().manual_seed(0))
    with Trainer(model, pol, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        tr.step(toks)  # warm: the first step's peak is every later one's
        normal = tr.step(toks).device_peak_bytes
        tr.engine.hook = late
        slow = tr.step(toks).device_peak_bytes
    assert normal <= slow <= bound, (normal, slow, bound)


def _reference_bound(sched, staging=True) -> int:
    """The module docstring's bound the slow way: ancestor and descendant sets of every op, and
    per compute op (inside it, and in the gap before it, and after the last) the sum of every
    buffer that can be live plus the workspaces of the ops that can run then."""
    from horizon_sim.schedule.check import predecessors
    from horizon_sim.schedule.effects import op_effects
    from horizon_sim.schedule.op import Lane, Space
    n = len(sched.ops)
    preds = predecessors(sched)
    anc = [set() for _ in range(n)]
    for o in range(n):  # program order is a topological order of deps and lanes
        for p in preds[o]:
            anc[o] |= anc[p] | {p}
    desc = [{d for d in range(n) if o in anc[d]} for o in range(n)]
    alloc, free, ws = [0] * n, [0] * n, [0] * n
    for op, e in zip(sched.ops, op_effects(sched)):
        for (sp, role), b in e.alloc.items():
            if sp == Space.DEVICE and role == "workspace" and (op.lane == Lane.COMPUTE or staging):
                ws[op.id] += b
            elif sp == Space.DEVICE and role != "workspace":
                alloc[op.id] += b
        for (sp, role), b in e.free.items():
            if sp == Space.DEVICE and role != "workspace":
                free[op.id] += b
    others = [o for o in sched.ops if o.lane != Lane.COMPUTE]

    def running(excluded):
        lanes = {}
        for o in others:
            if o.id not in excluded:
                lanes[o.lane] = max(lanes.get(o.lane, 0), ws[o.id])
        return sum(lanes.values())
    compute = [o.id for o in sched.ops if o.lane == Lane.COMPUTE]
    best = 0
    for c in compute:
        best = max(best, sum(alloc) - sum(alloc[d] for d in desc[c]) - sum(free[a] for a in anc[c]) + ws[c]
                   + running(anc[c] | desc[c]))
    for prev, nxt in zip([None, *compute], [*compute, None]):
        before = anc[prev] | {prev} if prev is not None else set()
        after = desc[nxt] | {nxt} if nxt is not None else set()
        best = max(best, sum(alloc) - sum(alloc[d] for d in after) - sum(free[a] for a in before)
                   + running(before | after))
    return sched.static_bytes(Space.DEVICE) + best


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(L=st.integers(2, 6), micro=st.sampled_from([1, 2, 3]), K=st.integers(1, 3), slots=st.integers(2, 3),
       where=st.sampled_from(["host", "device"]), opt=st.sampled_from(["after", "pipelined", "backward"]),
       order=st.sampled_from(["micro", "layer"]), keep=st.integers(0, 2), staging=st.booleans())
def test_the_one_pass_bound_is_the_bound_by_definition(L, micro, K, slots, where, opt, order, keep, staging):
    """device_peak_bound carries its sums along the compute lane in one pass; the definition
    recomputes every set for every compute op and gap: the same bytes."""
    spec = ModelSpec(n_layers=L, hidden=128, n_heads=4, n_kv_heads=2, ffn_hidden=256, vocab=512)
    pol = Policy(batch=2 * micro, micro_batches=micro, seq=64, act_ckpt_every=min(K, L), slots=slots,
                 act_ckpt_on=where, optimizer=opt, grad_clip=0.0 if opt == "backward" else 1.0, mb_order=order,
                 keep_last=min(keep, L))
    sched = build_schedule(spec, pol)
    assert device_peak_bound(sched, staging) == _reference_bound(sched, staging)
