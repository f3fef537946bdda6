"""Kept activations (issue 27 item 2, Policy.keep_last): the last L layers of the forward keep
their autograd graph on the device and run their backward from it (BACKWARD_SAVED), no
recompute. Checked here:
- the schedule: kept layers have no RECOMPUTE, no checkpoint and one BACKWARD_SAVED per
  micro-batch, reading the SAVED_ACTIVATIONS buffer their FORWARD wrote (Schedule.check
  holds: every dependency derived), in both orders, K 1..3; bad values are one-line errors
  (the CLI exits 2);
- the planner prices it: the device peak grows with L and is flat in depth for a fixed L, the
  FLOPs drop by one forward per kept layer (HFU toward MFU), admission refuses a kept policy
  that does not fit;
- the executor (CPU backend, fp32) trains bit for bit as L = 0 (the saved tensors are the
  values the recompute makes again, from the same inputs and kernels) for L 1, 3, all, K 1
  and 2, M 1 and 2, micro and layer order, optimizer after and pipelined; and as transformers'
  autograd (tests/test_exec_parity.py's check) with every layer kept;
- its measured temporaries stay under kept_work's counts and its measured device peak under
  the planner's bound.
"""
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import Holds, OpKind, build_schedule
from horizon_sim.sim.device_bound import device_peak_bound
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import KEEP_ALL, Policy, exact_policy

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_intraop_thread")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_layer_major import SEQ, VOCAB, spec, train  # noqa: E402

HW = make_hardware("h100-pcie")


def kinds(sched, kind) -> Counter:
    return Counter((op.unit, op.micro) for op in sched.ops if op.kind == kind)


# ---- the schedule ----------------------------------------------------------------------------------

@pytest.mark.parametrize("order,M", [("micro", 1), ("micro", 2), ("layer", 2)])
@pytest.mark.parametrize("K", [1, 2, 3])
@pytest.mark.parametrize("keep", [0, 1, 3, KEEP_ALL])
def test_kept_layers_run_their_backward_from_the_saved_graph(keep, K, order, M):
    m = spec(L=6)
    sched = build_schedule(m, Policy(batch=2 * M, seq=SEQ, micro_batches=M, act_ckpt_every=K, slots=3,
                                     keep_last=keep, mb_order=order))  # checked (Schedule.check)
    kept = range(m.n_layers - (m.n_layers if keep == KEEP_ALL else keep), m.n_layers)
    saved, bwd, rec = (kinds(sched, k) for k in (OpKind.BACKWARD_SAVED, OpKind.BACKWARD, OpKind.RECOMPUTE))
    assert saved == Counter({(u, mb): 1 for u in kept for mb in range(M)})
    assert bwd == Counter({(u, mb): 1 for u in range(m.n_layers) if u not in kept for mb in range(M)})
    assert not any(u in kept for u, _ in rec)
    ckpts = {b.layer for b in sched.buffers.values() if b.holds == Holds.ACT_CHECKPOINT}
    assert not ckpts & set(kept) and (kept.start == 0 or 0 in ckpts)
    for op in sched.ops:
        if op.kind == OpKind.BACKWARD_SAVED:
            (name,) = [n for n in op.reads if sched.buffers[n].holds == Holds.SAVED_ACTIVATIONS]
            fwd = next(o for o in sched.ops if o.kind == OpKind.FORWARD and name in o.writes)
            assert (fwd.unit, fwd.micro) == (op.unit, op.micro) and name in op.frees
            assert sched.buffers[name].bytes > 0
    # the work drops by one forward per kept layer and micro-batch, and the recomputes the
    # K-blocks no longer need (those before the kept layers end where they begin)
    base = build_schedule(m, Policy(batch=2 * M, seq=SEQ, micro_batches=M, act_ckpt_every=K, slots=3, mb_order=order))
    fwd_flops = m.layer_fwd_flops(SEQ * 2, SEQ)
    fewer = sum(kinds(base, OpKind.RECOMPUTE).values()) - sum(rec.values())
    assert sum(o.flops for o in base.ops) - sum(o.flops for o in sched.ops) == pytest.approx(
        (len(kept) * M + fewer) * fwd_flops)


def test_bad_values_are_one_line_errors(capsys):
    with pytest.raises(HorizonError, match=r"keep_last=-2 must be a number of layers >= 0, or -1 \(all\)"):
        Policy(keep_last=-2)
    with pytest.raises(HorizonError, match=r"keep_last=5 is larger than the model's 4 layers; use 0..4 or all"):
        build_schedule(spec(L=4), Policy(batch=2, seq=SEQ, keep_last=5))
    from horizon_sim.cli.main import main
    with pytest.raises(SystemExit) as e:
        main(["plan", "--model", "tiny", "--keep-activations", "some"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--keep-activations: 'some' is not a number of layers >= 0 or 'all'" in err
    assert main(["plan", "--model", "tiny", "--keep-activations", "99"]) == 2
    assert "keep_last=99 is larger than the model's 8 layers" in capsys.readouterr().err


def test_the_flag_reaches_plan_and_tune(capsys):
    import argparse

    from horizon_sim.cli.main import main
    from horizon_sim.cli.policy_args import add_policy_args, policy_from_args
    from horizon_sim.plan.tune import KNOBS, SearchSpace
    p = argparse.ArgumentParser()
    add_policy_args(p)
    assert policy_from_args(p.parse_args(["--keep-activations", "all"])).keep_last == KEEP_ALL
    assert policy_from_args(p.parse_args(["--keep-activations", "3"])).keep_last == 3
    assert policy_from_args(p.parse_args([])).keep_last == 0
    assert "keep_last" in KNOBS and KEEP_ALL in SearchSpace().keep_last
    assert main(["plan", "--model", "tiny", "--keep-activations", "all"]) in (0, 1)
    assert "8 of 8 layers keep activations (no recompute)" in capsys.readouterr().out


# ---- what the planner prices ----------------------------------------------------------------------

def test_device_peak_grows_with_kept_layers_and_is_flat_in_depth():
    m = ModelSpec(n_layers=8, hidden=256, n_heads=8, n_kv_heads=4, ffn_hidden=688, vocab=256)
    pol = Policy(batch=2, seq=256)
    peak = {}
    for L in (12, 24):
        for keep in (0, 1, 2, 4, 8):
            s = simulate(build_schedule(replace(m, n_layers=L), replace(pol, keep_last=keep)), HW).summary
            peak[L, keep] = s.device_peak_bytes
    for L in (12, 24):
        assert peak[L, 0] < peak[L, 1] < peak[L, 2] < peak[L, 4] < peak[L, 8]
    for keep in (0, 1, 2, 4, 8):  # the same kept layers, twice as deep: the same peak
        assert peak[24, keep] == peak[12, keep], keep
    # each kept layer adds about its saved tensors
    from horizon_sim.schedule.kept_work import kept_saved_bytes
    per = kept_saved_bytes(m, 2, 256, 2)
    assert 0.9 * per <= (peak[12, 8] - peak[12, 4]) / 4 <= 1.1 * per


def test_kept_layers_cut_the_step_and_hfu_toward_mfu():
    m = ModelSpec(n_layers=8, hidden=1024, n_heads=8, n_kv_heads=4, ffn_hidden=2816, vocab=1024)
    s0, s_all = (simulate(build_schedule(m, Policy(batch=8, seq=1024, keep_last=k)), HW).summary for k in (0, KEEP_ALL))
    assert s_all.hfu / s_all.mfu < s0.hfu / s0.mfu
    assert s_all.step_time_s < s0.step_time_s


def test_admission_refuses_a_kept_policy_that_does_not_fit():
    from horizon_exec.runtime.admission import DeviceAdmissionError, admit
    from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    m, pol = spec(L=4), exact_policy(batch=2, seq=SEQ)
    kept = replace(pol, keep_last=KEEP_ALL)
    need = {p.keep_last: admit(m, p, build_schedule(m, p), device_budget_bytes=2**40, advise=False).device_need_bytes
            for p in (pol, kept)}
    assert need[KEEP_ALL] > need[0]
    budget = (need[KEEP_ALL] + need[0]) // 2
    admit(m, pol, build_schedule(m, pol), device_budget_bytes=budget, advise=False)
    with pytest.raises(DeviceAdmissionError, match="device memory") as e:
        Trainer(m, kept, TrainerConfig(admission=AdmissionConfig(device_budget_bytes=budget)))
    # its advice names the kept layers to give up (the nearest policy that fits)
    assert "nearest policy that fits (kept layers halved): --keep-activations 2" in str(e.value)


# ---- the executor ----------------------------------------------------------------------------------

CASES = [pytest.param(opt, K, M, order, id=f"{opt}-K{K}-M{M}-{order}") for opt in ("after", "pipelined")
         for K in (1, 2) for M, order in ((1, "micro"), (2, "micro"), (2, "layer"))]


@pytest.mark.parametrize("opt,K,M,order", CASES)
def test_trains_bit_for_bit_as_recompute(opt, K, M, order):
    m = spec(L=4)
    pol = exact_policy(batch=2 * M, seq=SEQ, micro_batches=M, act_ckpt_every=K, optimizer=opt, mb_order=order,
                       loss_chunk_tokens=12)
    want = train(m, pol, steps=2)
    for keep in (1, 3, KEEP_ALL):
        got = train(m, replace(pol, keep_last=keep), steps=2)
        assert got[0] == want[0] and got[1] == want[1], keep  # losses, grad norms
        assert all(torch.equal(got[2][u], want[2][u]) for u in want[2]), keep  # every unit's first gradient
        differ = [n for n in want[3] if not torch.equal(got[3][n], want[3][n])]
        assert not differ, (keep, differ)


def test_every_layer_kept_matches_transformers_autograd():
    from test_exec_parity import check_matches_autograd, parity_spec
    check_matches_autograd(parity_spec(3, False, False), exact_policy(batch=4, seq=SEQ, micro_batches=2,
                                                                       keep_last=KEEP_ALL, loss_chunk_tokens=12))


# a pre-norm, q/k norms, none (norms after), LayerNorms with the parallel residual
@pytest.mark.parametrize("family", ["llama", "qwen3", "olmo2", "gpt_neox"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mb,seq", [(1, 64), (2, 128)])
@pytest.mark.parametrize("hidden,ffn", [(64, 96), (256, 688)])
def test_measured_temporaries_stay_under_kept_works_counts(dtype, mb, seq, hidden, ffn, family):
    """A kept FORWARD's measured temporary peak (its saved tensors and output included) and a
    BACKWARD_SAVED's (its output included) against what the builder charges for them."""
    from horizon_exec.device.arena import DeviceArena
    from horizon_exec.device.memtrack import TransientTracker
    from horizon_exec.model.block import DecoderBlock
    from horizon_exec.model.layout import block_layout
    from horizon_exec.runtime.kept_graph import KeptGraph
    from horizon_sim.schedule import kept_work
    m = ModelSpec(n_layers=2, hidden=hidden, n_heads=8, n_kv_heads=8 if family == "gpt_neox" else 4, ffn_hidden=ffn,
                  vocab=64, family=family)  # GPT-NeoX: multi-head attention only
    a = 2 if dtype == torch.bfloat16 else 4
    gen = torch.Generator().manual_seed(0)
    slot = (torch.randn(m.layer_params, generator=gen) * 0.02).to(dtype)
    x = torch.randn(mb, seq, hidden, generator=gen).to(dtype)
    rope = (torch.randn(seq, m.hd, generator=gen).to(dtype), torch.randn(seq, m.hd, generator=gen).to(dtype))
    arena = DeviceArena(None)
    for t in (slot, x, *rope):  # buffers, not temporaries
        arena.ptrs.add(t.untyped_storage().data_ptr())
    with TransientTracker(arena) as fwd:
        graph = KeptGraph.record(DecoderBlock(m), block_layout(m).views(slot), slot, x, rope)
    dy = torch.randn_like(graph.output)
    arena.ptrs.add(dy.untyped_storage().data_ptr())
    with TransientTracker(arena) as bwd:
        dx, wgrads = graph.backward(dy, slot)
        del wgrads
    out = mb * seq * hidden * a
    saved = kept_work.kept_saved_bytes(m, mb, seq, a)
    assert fwd.peak <= saved + out + kept_work.kept_forward_workspace_bytes(m, mb, seq)
    assert saved <= fwd.peak + out  # what the graph holds is counted, not far over
    assert bwd.peak <= kept_work.saved_backward_workspace_bytes(m, mb, seq, a) + out <= 1.3 * bwd.peak


@pytest.mark.parametrize("compute,order", [("fp32", "micro"), ("bf16", "micro"), ("bf16", "layer")])
def test_measured_device_peak_stays_under_the_planners_bound(compute, order):
    from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    m = spec(L=4)
    pol = Policy(batch=4, seq=SEQ, micro_batches=2, act_ckpt_every=2, compute_dtype=compute, mb_order=order,
                 working_copy=compute != "fp32")
    peaks = {}
    for keep in (0, 2, KEEP_ALL):
        p = replace(pol, keep_last=keep)
        bound = device_peak_bound(build_schedule(m, p))
        with Trainer(m, p, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
            tokens = torch.randint(0, VOCAB, (p.batch, SEQ), generator=torch.Generator().manual_seed(0))
            peaks[keep] = max(tr.step(tokens).device_peak_bytes for _ in range(2))
        assert peaks[keep] <= bound, (keep, peaks, bound)
    assert peaks[0] < peaks[2] < peaks[KEEP_ALL]


def test_weights_come_from_the_slot_the_backward_loads():
    """The slot a kept layer's forward used holds other units before its backward, which may
    run from another slot: a graph that kept the slot's tensors would read another unit's
    weights (autograd's version check does not see it under saved-tensor hooks). With 3 slots
    and 4 layers, units 0 and 1 run their backward from another slot than their forward's."""
    m = spec(L=4)
    pol = exact_policy(batch=2, seq=SEQ, slots=3, keep_last=KEEP_ALL, loss_chunk_tokens=12)
    sched = build_schedule(m, pol)
    fwd = {op.unit: op.slot for op in sched.ops if op.kind == OpKind.FORWARD}
    bwd = {op.unit: op.slot for op in sched.ops if op.kind == OpKind.BACKWARD_SAVED}
    assert [u for u in fwd if fwd[u] != bwd[u]] == [0, 1]
    got, want = train(m, pol, steps=1), train(m, replace(pol, keep_last=0), steps=1)
    assert all(torch.equal(got[2][u], want[2][u]) for u in want[2])
