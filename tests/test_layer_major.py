"""Layer-major micro-batching (issue 27 item 1, Policy.mb_order='layer').

While a unit's weights are resident every micro-batch passes it, so each unit's weights cross
the link twice per step (forward, backward) whatever the micro-batches, and its gradients are
summed on the device and offloaded once. Checked here:
- the order's structure: LOAD_WEIGHTS at most twice per unit (M-scaled in the micro order), one
  OFFLOAD_GRADS per unit (M in the micro order), the forward unit-major, and one micro-batch
  gives the micro order's step exactly;
- the planner prices it: fewer link bytes, a device peak that grows with M (the micro order's
  does not), and admission refuses a layer-major run that does not fit the device;
- the executor (CPU backend, fp32) trains bit for bit as the micro order does, for optimizer
  after/pipelined/backward, K 1 and 2, M 2 and 3, untied embeddings; tied, the embedding's
  gradient adds the same terms in another order (every micro-batch's head before any
  embedding scatter), so it and what follows agree to rounding, every other unit's first
  gradient bit for bit;
- its measured device peak stays under the planner's bound;
- data parallel: 2 ranks train what one rank does (two one-rank nodes: bit for bit as the
  micro order on the same ranks; two ranks of a node reduce-scatter the summed gradients, so
  the fp32 sums are added in another order).
"""
import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import OpKind, build_schedule
from horizon_sim.sim.device_bound import device_peak_bound
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy, exact_policy

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_intraop_thread")

ROOT = Path(__file__).resolve().parents[1]
SEQ, VOCAB = 16, 128
HW = make_hardware("h100-pcie")


def spec(L=4, tied=False):
    return ModelSpec(n_layers=L, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab=VOCAB, tied_embeddings=tied)


def layer(pol: Policy) -> Policy:
    return replace(pol, mb_order="layer")


def per_unit(sched, kind) -> Counter:
    return Counter(op.unit for op in sched.ops if op.kind == kind)


def h2d_bytes(sched, kind=OpKind.LOAD_WEIGHTS) -> int:
    return sum(op.link_bytes for op in sched.ops if op.kind == kind)


# ---- the order ----------------------------------------------------------------------------------

@pytest.mark.parametrize("K,slots", [(1, 2), (2, 2), (3, 3)])
@pytest.mark.parametrize("M", [2, 3])
def test_weights_cross_twice_and_grads_leave_once_per_unit(K, slots, M):
    m = spec(L=6)
    pol = Policy(batch=2 * M, seq=SEQ, micro_batches=M, act_ckpt_every=K, slots=slots)
    micro, lay = build_schedule(m, pol), build_schedule(m, layer(pol))  # both checked (Schedule.check)
    units = range(m.n_layers + 1)
    loads = per_unit(lay, OpKind.LOAD_WEIGHTS)
    assert all(1 <= loads[u] <= 2 for u in units), loads
    assert all(per_unit(lay, OpKind.OFFLOAD_GRADS)[u] == 1 for u in units)
    # the micro order streams the model again for every micro-batch (the slots keep at most
    # `slots` units resident from one to the next) and offloads once per micro-batch
    for mb in range(M):
        assert sum(op.kind == OpKind.LOAD_WEIGHTS and op.micro == mb for op in micro.ops) >= len(units) - slots
    assert all(per_unit(micro, OpKind.OFFLOAD_GRADS)[u] == M for u in units)
    # unit-major forward: every micro-batch passes block u before any passes block u + 1
    fwd = [(op.unit, op.micro) for op in lay.ops if op.kind == OpKind.FORWARD]
    assert fwd == sorted(fwd) == [(u, mb) for u in range(m.n_layers) for mb in range(M)]
    # the same work: compute ops, FLOPs and checkpoint traffic; only the weights' and grads' traffic shrinks
    for kind in (OpKind.FORWARD, OpKind.RECOMPUTE, OpKind.BACKWARD, OpKind.HEAD, OpKind.LOAD_CKPT):
        assert sum(per_unit(lay, kind).values()) == sum(per_unit(micro, kind).values())
    assert sum(op.flops for op in lay.ops) == sum(op.flops for op in micro.ops)
    assert h2d_bytes(lay) < h2d_bytes(micro) and h2d_bytes(lay, OpKind.OFFLOAD_GRADS) * M == h2d_bytes(
        micro, OpKind.OFFLOAD_GRADS)


def test_later_micro_batches_add_into_the_units_device_sum():
    """The op fields say it: micro-batch 0's BACKWARD writes the unit's sum (fp32, micro None),
    the others read it too (the executor adds what an op reads), the one offload frees it."""
    sched = build_schedule(spec(), layer(exact_policy(batch=6, seq=SEQ, micro_batches=3, act_ckpt_every=2)))
    for u in range(spec().n_layers + 1):
        grads = [op for op in sched.ops if op.unit == u and op.kind in (OpKind.BACKWARD, OpKind.HEAD)]
        (total,) = {n for op in grads for n in op.writes if sched.buffers[n].holds.value == "device_grad"}
        b = sched.buffers[total]
        assert (b.micro, b.dtype) == (None, "fp32")
        assert [total in op.reads for op in grads] == [False, True, True]
        (off,) = [op for op in sched.ops if op.unit == u and op.kind == OpKind.OFFLOAD_GRADS]
        assert total in off.reads and total in off.frees and off.id > grads[-1].id


def test_one_micro_batch_is_the_micro_orders_step():
    pol = Policy(batch=2, seq=SEQ, act_ckpt_every=2)
    assert build_schedule(spec(), layer(pol)).ops == build_schedule(spec(), pol).ops


def test_the_order_is_checked_and_reaches_the_cli_and_tune():
    with pytest.raises(HorizonError, match=r"mb_order='diagonal'; allowed: micro, layer"):
        Policy(mb_order="diagonal")
    import argparse

    from horizon_sim.cli.policy_args import add_policy_args, policy_from_args
    from horizon_sim.plan.tune import KNOBS, SearchSpace
    p = argparse.ArgumentParser()
    add_policy_args(p)
    assert policy_from_args(p.parse_args(["--mb-order", "layer"])).mb_order == "layer"
    assert policy_from_args(p.parse_args([])).mb_order == "micro"
    assert "mb_order" in KNOBS and SearchSpace().mb_order == ("micro", "layer")
    with pytest.raises(HorizonError, match="mb_order"):
        SearchSpace(mb_order=("diagonal",))


# ---- what the planner prices ----------------------------------------------------------------------

def test_link_bytes_stay_flat_in_micro_batches_and_device_peak_grows():
    """Fixed micro-batch size, M = 1, 2, 4: the layer order's weight loads stay at two passes
    (the micro order's grow with M) while its device peak grows with M (every micro-batch's
    boundaries live at once; the micro order's stays put)."""
    m = spec(L=8)
    out = {}
    for order in ("micro", "layer"):
        for M in (1, 2, 4):
            s = build_schedule(m, Policy(batch=2 * M, seq=SEQ, micro_batches=M, act_ckpt_on="device", mb_order=order))
            out[order, M] = h2d_bytes(s), simulate(s, HW).summary.device_peak_bytes
    assert out["layer", 1] == out["micro", 1]
    assert out["layer", 1][0] == out["layer", 2][0] == out["layer", 4][0]
    assert out["micro", 4][0] > out["micro", 2][0] > out["micro", 1][0]
    assert out["layer", 4][1] > out["layer", 2][1] > out["layer", 1][1]
    assert out["micro", 4][1] - out["micro", 2][1] == 4 * SEQ * 8  # the step's labels (batch x seq int64)


def test_admission_refuses_a_layer_major_run_that_does_not_fit():
    from horizon_exec.runtime.admission import DeviceAdmissionError, admit
    from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    m, pol = spec(), exact_policy(batch=8, seq=SEQ, micro_batches=4, act_ckpt_on="device")
    need = {p.mb_order: admit(m, p, build_schedule(m, p), device_budget_bytes=2**40, advise=False).device_need_bytes
            for p in (pol, layer(pol))}
    assert need["layer"] > need["micro"]
    budget = (need["layer"] + need["micro"]) // 2
    admit(m, pol, build_schedule(m, pol), device_budget_bytes=budget, advise=False)
    with pytest.raises(DeviceAdmissionError, match="device memory"):
        Trainer(m, layer(pol), TrainerConfig(admission=AdmissionConfig(device_budget_bytes=budget)))


# ---- the executor ----------------------------------------------------------------------------------

def test_host_grads_stay_as_they_cross_the_link_in_the_layer_order():
    """The layer order writes each unit's host gradient once (its device sum), so it keeps
    grad_dtype; the micro order adds micro-batches into fp32. The embedding's scatter-add runs
    per micro-batch on the host in both orders: fp32."""
    from horizon_sim.schedule import Holds
    m, pol = spec(L=4), Policy(batch=6, seq=SEQ, micro_batches=3)
    micro, lay = (build_schedule(m, p) for p in (pol, layer(pol)))
    dtypes = {o: {b.unit: b.dtype for b in s.of(Holds.HOST_GRAD)} for o, s in (("micro", micro), ("layer", lay))}
    assert set(dtypes["micro"].values()) == {"fp32"}
    assert dtypes["layer"] == {u: "fp32" if u == -1 else pol.grad_dtype for u in dtypes["micro"]}
    grads = {o: simulate(s, HW).host.by_role["grads"] for o, s in (("micro", micro), ("layer", lay))}
    assert grads["micro"] - grads["layer"] == 2 * (m.total_params - m.embedding_params)


def test_bf16_host_grads_lose_nothing_in_the_layer_order(monkeypatch):
    """What crosses the link is grad_dtype already: storing it so trains exactly what an fp32
    host gradient does (bf16 compute, masters compared bit for bit)."""
    from horizon_sim.schedule import declare
    m, pol = spec(L=3), layer(Policy(batch=4, seq=SEQ, micro_batches=2, optimizer="after"))
    kept = train(m, pol, steps=2)
    init = declare.Declarations.__init__

    def fp32_host_grads(self, *a, **kw):
        init(self, *a, **kw)
        self.host_grad_dtype = "fp32"
    monkeypatch.setattr(declare.Declarations, "__init__", fp32_host_grads)
    wide = train(m, pol, steps=2)
    assert all(wide[2][u].dtype == torch.float32 for u in wide[2]) and kept[2][0].dtype == torch.bfloat16
    assert kept[0] == wide[0] and kept[1] == wide[1]
    differ = [n for n in kept[3] if not torch.equal(kept[3][n], wide[3][n])]
    assert not differ, differ


def train(m, pol, steps=3):
    """Losses, grad norms, every unit's first host gradient (as the optimizer got it) and the
    master weights after `steps` steps (pipelined: flushed)."""
    from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.schedule import Holds
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    first_grads = {}
    with Trainer(m, pol, TrainerConfig(optimizer=OptimizerConfig(lr=1e-3), seed=3)) as tr:
        def snapshot(op):  # the CPU lane, just before the op: the unit's host grad is final
            if op.kind == OpKind.OPTIMIZER and op.unit not in first_grads:
                first_grads[op.unit] = tr.buffers.find(Holds.HOST_GRAD, unit=op.unit).clone()
        tr.engine.hook = snapshot
        runs = [tr.step(torch.randint(0, VOCAB, (pol.batch, SEQ), generator=gen)) for _ in range(steps)]
        tr.flush()
        return ([r.loss for r in runs], [r.grad_norm for r in runs], first_grads,
                {n: t.clone() for n, t in tr.state_dict().items()})


def test_backward_prices_writing_its_gradients_in_each_order():
    """A backward's hbm_bytes include writing its weight gradients (bf16, as autograd returns
    them): copy_ into a bf16 buffer (2 + 2 bytes a parameter) in the micro order; in the layer
    order copy_ into the fp32 sum (2 + 4) for the first micro-batch and add_ into it (2 + 4 + 4)
    for the others."""
    m = spec()
    pol = Policy(batch=4, seq=SEQ, micro_batches=2)
    P = m.layer_params

    def bwd(sched):
        return {op.micro: op.hbm_bytes for op in sched.ops if op.kind == OpKind.BACKWARD and op.unit == 1}
    micro, lay = bwd(build_schedule(m, pol)), bwd(build_schedule(m, layer(pol)))
    assert micro[0] == micro[1]
    assert lay[0] - micro[0] == 2 * P and lay[1] - lay[0] == 4 * P


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


CASES = [pytest.param(opt, K, M, id=f"{opt}-K{K}-M{M}") for opt in ("after", "pipelined") for K in (1, 2)
         for M in (2, 3)] + [pytest.param("backward", 2, 2, id="backward-K2-M2")]


@pytest.mark.parametrize("opt,K,M", CASES)
def test_untied_trains_bit_for_bit_as_the_micro_order(opt, K, M):
    m = spec(L=4)
    pol = exact_policy(batch=2 * M, seq=SEQ, micro_batches=M, act_ckpt_every=K, optimizer=opt,
                       grad_clip=0.0 if opt == "backward" else 1.0, loss_chunk_tokens=12)
    want, got = train(m, pol), train(m, layer(pol))
    assert got[0] == want[0] and got[1] == want[1]  # losses, grad norms
    assert set(got[2]) == set(want[2]) and all(torch.equal(got[2][u], want[2][u]) for u in want[2])
    assert set(got[3]) == set(want[3])
    differ = [n for n in want[3] if not torch.equal(got[3][n], want[3][n])]
    assert not differ, differ


@pytest.mark.parametrize("opt,K,M", [c for c in CASES if c.values[0] != "backward"])
def test_tied_differs_from_the_micro_order_only_by_the_embeddings_sum_order(opt, K, M):
    m = spec(L=4, tied=True)
    pol = exact_policy(batch=2 * M, seq=SEQ, micro_batches=M, act_ckpt_every=K, optimizer=opt, loss_chunk_tokens=12)
    want, got = train(m, pol), train(m, layer(pol))
    assert got[0][0] == want[0][0]  # the first step's loss: the same forward
    assert got[0] == pytest.approx(want[0], rel=1e-6) and got[1] == pytest.approx(want[1], rel=1e-6)
    from horizon_sim.schedule.op import EMBED
    for u, g in want[2].items():
        if u == EMBED:
            assert _rel(got[2][u], g) <= 1e-6
        else:
            assert torch.equal(got[2][u], g), u
    worst = max(_rel(got[3][n], t) for n, t in want[3].items())
    assert worst <= 1e-5


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_measured_device_peak_stays_under_the_planners_bound(compute):
    """The device sum (fp32), the head's temporary and the offload's narrowing are priced: the
    measured peak (arena buffers + measured temporaries) stays under the bound, above the
    micro order's. A wide vocabulary makes the head's gradients most of the peak, so the
    bound is tight (within 10 KB here; without the head's temporary it fell 1 MB short)."""
    from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    m = replace(spec(L=4), vocab=4096)
    pol = Policy(batch=6, seq=SEQ, micro_batches=3, act_ckpt_every=2, compute_dtype=compute,
                 working_copy=compute != "fp32")
    peaks = {}
    for p in (pol, layer(pol)):
        bound = device_peak_bound(build_schedule(m, p))  # no library workspace: the CPU backend has none
        with Trainer(m, p, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
            tokens = torch.randint(0, m.vocab, (p.batch, SEQ), generator=torch.Generator().manual_seed(0))
            peaks[p.mb_order] = max(tr.step(tokens).device_peak_bytes for _ in range(2))
        assert peaks[p.mb_order] <= bound, (p.mb_order, peaks, bound)
    assert peaks["layer"] > peaks["micro"]


# ---- data parallel ----------------------------------------------------------------------------------

sys.path.insert(0, str(ROOT / "tests"))
import dist_worker  # noqa: E402
from test_dist_exec import torchrun  # noqa: E402


def one_rank(order: str, micro_batches: int):
    """One rank, the whole global batch in `micro_batches` micro-batches, in this process."""
    from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    pol = dist_worker.policy(1, "pipelined", micro_batches, mb_order=order)
    with Trainer(dist_worker.spec(False), pol, TrainerConfig(optimizer=OptimizerConfig(lr=1e-3),
                                                             admission=AdmissionConfig(enabled=False))) as tr:
        losses = [tr.step(t).loss for t in dist_worker.batches()]
        tr.flush()
        return torch.cat([tr.gather_master(u) for u in tr.units]), losses


def ranks(out: Path, order: str, nproc: int, nnodes: int):
    out.mkdir()
    torchrun(out, "parity", nproc, nnodes, opt="pipelined", micro=2, order=order)
    return torch.load(out / "master.pt"), json.loads((out / "losses.json").read_text())


@pytest.mark.parametrize("nproc,nnodes", [(2, 1), (1, 2)])
def test_two_ranks_train_what_one_rank_does(tmp_path, nproc, nnodes):
    """Each rank: 2 micro-batches of 1 sequence, layer order. Against one rank with the whole
    batch in 4 micro-batches (layer order): the same gradients summed in another order, within
    1e-6 as tests/test_dist_exec.py holds the micro order. Two one-rank nodes reduce the host
    gradients, which the layer order leaves as the micro order does: bit for bit equal to it."""
    got, losses = ranks(tmp_path / "layer", "layer", nproc, nnodes)
    whole, whole_losses = one_rank("layer", 4)
    assert (got - whole).abs().max().item() <= 1e-6
    assert losses == pytest.approx(whole_losses, rel=1e-6)
    if nnodes == 2:
        micro, micro_losses = ranks(tmp_path / "micro", "micro", nproc, nnodes)
        assert torch.equal(got, micro) and losses == micro_losses
