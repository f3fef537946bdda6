"""build_schedule and check_schedule(): the structure of the step for a grid of policies, weight-load
counts (resident reuse, Belady slot reuse), and validation rejecting broken schedules.

Broken schedules are made from a good one with dataclasses.replace on single ops, so each
rejection is caused by exactly the one change the test names (the unmodified schedule is
checked to validate first)."""
import itertools
import math
from dataclasses import replace

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import (EMBED, Lane, OpKind, Schedule, ScheduleError, build_schedule,
                                  check_schedule)
from horizon_sim.schedule.op import LANE_OF
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

L = 7  # not divisible by 2 or 3: the first backward block is short


def _model(n_layers=L, tied=False):
    return ModelSpec(name="toy", n_layers=n_layers, hidden=64, n_heads=4, n_kv_heads=2,
                     ffn_hidden=160, vocab=320, tied_embeddings=tied)


# precision variants: bf16 compute with a bf16 host working copy; bf16 compute without one
# (loads move fp32 master bytes and cast on the device); all-fp32 compute without one.
PRECISIONS = {
    "bf16+wc": dict(compute_dtype="bf16", working_copy=True, master_dtype="fp32"),  # the whole fp32 master
    "bf16-castdev": dict(compute_dtype="bf16", working_copy=False),
    "fp32": dict(compute_dtype="fp32", grad_dtype="fp32", working_copy=False),
}


def _policy(optimizer="pipelined", **kw):
    clip = dict(grad_clip=0.0) if optimizer == "backward" else {}
    base = dict(batch=4, seq=32, optimizer=optimizer, loss_chunk_tokens=64, **clip)
    base.update(kw)
    return Policy(**base)


def _of(sched, kind, layer=None, micro=None):
    return [op for op in sched.ops if op.kind == kind and (layer is None or op.unit == layer)
            and (micro is None or op.micro == micro)]


def _n_loads(sched):
    return len(_of(sched, OpKind.LOAD_WEIGHTS))


def _compute_ops(sched):
    return [op for op in sched.ops if op.lane == Lane.COMPUTE]


# ---- structure over a grid of policies ----------------------------------------------------
def _check_structure(sched, model, policy):
    check_schedule(sched)  # build_schedule validated already; check_schedule() itself must agree
    Ln, K, mb = model.n_layers, policy.act_ckpt_every, policy.micro_batches
    n_blocks = math.ceil(Ln / K)
    units = [EMBED, *range(Ln), Ln]
    assert [op.id for op in sched.ops] == list(range(len(sched.ops)))
    for op in sched.ops:
        assert op.lane == LANE_OF[op.kind]
        assert all(0 <= d < op.id for d in op.deps), f"{op.label} depends forward in program order"

    count = lambda kind: len(_of(sched, kind))
    assert count(OpKind.FORWARD) == mb * Ln
    assert count(OpKind.BACKWARD) == mb * Ln
    assert count(OpKind.HEAD) == mb
    # RECOMPUTE only when K > 1: the K-1 inner boundaries of every block, per micro-batch.
    assert count(OpKind.RECOMPUTE) == mb * (Ln - n_blocks)
    assert (count(OpKind.RECOMPUTE) > 0) == (K > 1)
    # checkpoint copies only when checkpoints live on the host: one per block, each way.
    host_ck = policy.act_ckpt_on == "host"
    assert count(OpKind.SAVE_CKPT) == (mb * n_blocks if host_ck else 0)
    assert count(OpKind.LOAD_CKPT) == (mb * n_blocks if host_ck else 0)
    assert sorted(op.unit for op in _of(sched, OpKind.SAVE_CKPT, micro=0)) == \
        (list(range(0, Ln, K)) if host_ck else [])
    for kind in (OpKind.EMBED_FWD, OpKind.LOAD_INPUT, OpKind.OFFLOAD_INPUT_GRAD, OpKind.EMBED_BWD):
        assert count(kind) == mb
    assert count(OpKind.OFFLOAD_GRADS) == mb * (Ln + 1)
    assert count(OpKind.GRAD_NORM) == 1

    # exactly one OPTIMIZER per unit (L + 2 units) per step
    opt = _of(sched, OpKind.OPTIMIZER)
    assert sorted(op.unit for op in opt) == sorted(units)
    assert len(opt) == Ln + 2
    # prev_step optimizer ops only (and always) in pipelined mode
    assert all(op.prev_step == (policy.optimizer == "pipelined") for op in opt)
    assert not any(op.prev_step for op in sched.ops if op.kind != OpKind.OPTIMIZER)
    gnorm = _of(sched, OpKind.GRAD_NORM)[0]
    for o in opt:
        if policy.optimizer == "after":
            assert o.id > gnorm.id
        elif policy.optimizer == "backward":
            # right after the last micro-batch's gradient of that unit arrives on the host
            assert o.id < gnorm.id
            arrives = (_of(sched, OpKind.EMBED_BWD, micro=mb - 1) if o.unit == EMBED
                       else _of(sched, OpKind.OFFLOAD_GRADS, o.unit, mb - 1))
            assert arrives[0].id < o.id
        else:  # pipelined: before the first load of that unit's weights in this step
            first_load = min(op.id for op in sched.ops if op.kind in (OpKind.LOAD_WEIGHTS, OpKind.EMBED_FWD)
                             and any(r.endswith(f".{_unit_name(o.unit, Ln)}") for r in op.reads))
            assert o.id < first_load
            assert gnorm.id not in o.deps

    # every compute op finds its own unit's weights in its slot: replay the loads in order
    slot_holds = {}
    last_compute_slot = None
    for op in sched.ops:
        if op.kind == OpKind.LOAD_WEIGHTS:
            assert 0 <= op.slot < policy.slots
            assert op.writes == (f"w{op.slot}",)
            # never into the slot the previous compute op uses, so a load can overlap compute
            assert op.slot != last_compute_slot
            slot_holds[op.slot] = op.unit
        elif op.lane == Lane.COMPUTE:
            assert slot_holds.get(op.slot) == op.unit, f"{op.label} would run with wrong weights"
            assert f"w{op.slot}" in op.reads
            last_compute_slot = op.slot

    # link bytes of a weight load follow the precision policy
    act = 2 if policy.compute_dtype == "bf16" else 4
    per_param = act if (policy.working_copy or policy.compute_dtype == "fp32") else 4
    for op in _of(sched, OpKind.LOAD_WEIGHTS):
        dev_params = model.head_device_params if op.unit == Ln else model.layer_params
        assert op.link_bytes == dev_params * per_param
        src = "wc" if policy.working_copy else "master"
        assert f"{src}.{_unit_name(op.unit, Ln)}" in op.reads
        if op.unit == Ln:  # the tied head streams the embedding matrix from the host store
            assert (f"{src}.emb" in op.reads) == model.tied_embeddings
    for op in _of(sched, OpKind.OFFLOAD_GRADS, Ln):
        assert ("hgrad.emb" in op.writes) == model.tied_embeddings

    # static host store: master and moments of every unit, working copy only when asked
    for u in units:
        n = _unit_name(u, Ln)
        assert sched.buffers[f"master.{n}"].static and sched.buffers[f"moments.{n}"].static
        assert (f"wc.{n}" in sched.buffers) == policy.working_copy


def _unit_name(u, Ln):
    return {EMBED: "emb", Ln: "head"}.get(u, str(u))


GRID = list(itertools.product([1, 2, 3], [2, 3, 4], ["device", "host"],
                              ["after", "backward", "pipelined"]))


@pytest.mark.parametrize("K, slots, act_ckpt_on, optimizer", GRID)
def test_build_validates_and_has_expected_ops(K, slots, act_ckpt_on, optimizer):
    for mb, tied, prec in itertools.product([1, 2], [False, True], PRECISIONS):
        model = _model(tied=tied)
        policy = _policy(optimizer, act_ckpt_every=K, slots=slots, act_ckpt_on=act_ckpt_on, micro_batches=mb,
                         **PRECISIONS[prec])
        _check_structure(build_schedule(model, policy), model, policy)


def test_ckpt_every_larger_than_depth_is_an_error():
    with pytest.raises(HorizonError, match="act_ckpt_every=8 is larger than the model's 7 layers"):
        build_schedule(_model(), _policy(act_ckpt_every=8))
    build_schedule(_model(), _policy(act_ckpt_every=7))  # K = L is allowed: one block


# ---- weight loads per step ------------------------------------------------------------------
@pytest.mark.parametrize("n_layers", [2, 5, 7, 12])
def test_loads_k1_two_slots_is_2L_plus_1_minus_resident_reuse(n_layers):
    """Naively K=1 loads 2L+1 times (L forwards, the head, L backwards). With 2 slots the
    last block's weights are still resident when backward starts (the head used the other
    slot), so exactly one load is saved: 2L."""
    sched = build_schedule(_model(n_layers), _policy(act_ckpt_every=1, slots=2))
    naive = 2 * n_layers + 1
    assert len(_compute_ops(sched)) == naive
    assert _n_loads(sched) == naive - 1
    # the saved load is the last block's backward
    bwd_last = _of(sched, OpKind.BACKWARD, n_layers - 1)[0]
    loads_of_last = _of(sched, OpKind.LOAD_WEIGHTS, n_layers - 1)
    assert len(loads_of_last) == 1 and loads_of_last[0].id < _of(sched, OpKind.HEAD)[0].id < bwd_last.id
    # bytes on the link agree with the count
    w = _model(n_layers).layer_params * 2
    head = _model(n_layers).head_device_params * 2
    assert sum(op.link_bytes for op in _of(sched, OpKind.LOAD_WEIGHTS)) == (2 * n_layers - 1) * w + head


def test_loads_k1_later_micro_batches_reuse_the_first_two_layers():
    """After micro-batch m's backward the two slots hold layers 1 and 0, exactly what
    micro-batch m+1's forward starts with."""
    Ln = 7
    sched = build_schedule(_model(Ln), _policy(act_ckpt_every=1, slots=2, micro_batches=2))
    per_micro = [len(_of(sched, OpKind.LOAD_WEIGHTS, micro=m)) for m in (0, 1)]
    assert per_micro == [2 * Ln, 2 * Ln - 2]


@pytest.mark.parametrize("n_layers", [7, 8, 12])
def test_loads_k3_fewer_than_naive_three_pass(n_layers):
    """K=3: a naive schedule loads once per compute op: L forwards, the head, L - ceil(L/K)
    recomputes and L backwards. Belady reuse keeps the block's last recomputed layer resident
    for its backward, so strictly fewer loads happen."""
    K = 3
    sched = build_schedule(_model(n_layers), _policy(act_ckpt_every=K, slots=2))
    naive = len(_compute_ops(sched))
    assert naive == n_layers + 1 + (n_layers - math.ceil(n_layers / K)) + n_layers
    loads = _n_loads(sched)
    assert loads < naive
    # every block of 3 full layers saves at least one load (its last recomputed layer)
    full_blocks = n_layers // K
    assert loads <= naive - full_blocks
    # more slots never load more
    more = [_n_loads(build_schedule(_model(n_layers), _policy(act_ckpt_every=K, slots=s)))
            for s in (2, 3, 4)]
    assert more == sorted(more, reverse=True) and more[0] == loads


def test_loads_when_every_unit_fits_in_a_slot_each_unit_is_loaded_once():
    Ln = 5
    for K in (1, 2, 3):
        sched = build_schedule(_model(Ln), _policy(act_ckpt_every=K, slots=Ln + 1 + 1))
        layers = sorted(op.unit for op in _of(sched, OpKind.LOAD_WEIGHTS))
        assert layers == list(range(Ln + 1)), K


# ---- validation rejects broken schedules ----------------------------------------------------
@pytest.fixture(scope="module")
def good():
    """K=1, 2 slots, device checkpoints, clean ids to point at."""
    return build_schedule(_model(5), _policy(act_ckpt_every=1, slots=2, act_ckpt_on="device", optimizer="after"))


def _with(sched, op_id, **changes) -> Schedule:
    ops = list(sched.ops)
    ops[op_id] = replace(ops[op_id], **changes)
    return Schedule(ops=tuple(ops), buffers=dict(sched.buffers), meta=sched.meta)


def _drop_dep(sched, op, dep_id) -> Schedule:
    assert dep_id in op.deps, f"{op.label} does not depend on {sched.ops[dep_id].label}"
    return _with(sched, op.id, deps=tuple(d for d in op.deps if d != dep_id))


def test_unmodified_schedule_validates(good):
    check_schedule(good)
    assert good.check() is good


def test_forward_without_its_weight_load_is_rejected(good):
    fwd = _of(good, OpKind.FORWARD, 3)[0]
    load = max((op for op in _of(good, OpKind.LOAD_WEIGHTS) if op.id < fwd.id and op.slot == fwd.slot),
               key=lambda op: op.id)
    assert load.unit == 3
    with pytest.raises(ScheduleError, match=rf"reads 'w{fwd.slot}' without waiting for op {load.id}"):
        check_schedule(_drop_dep(good, fwd, load.id))


def test_offload_grads_without_its_backward_is_rejected(good):
    og = _of(good, OpKind.OFFLOAD_GRADS, 2)[0]
    bwd = _of(good, OpKind.BACKWARD, 2)[0]
    with pytest.raises(ScheduleError, match=r"reads 'dgrad\.2\.m0' without waiting"):
        check_schedule(_drop_dep(good, og, bwd.id))


def test_weight_load_into_a_slot_still_in_use_is_rejected(good):
    """WAR: the first reload of a slot must wait for the compute op that last used it."""
    for load in _of(good, OpKind.LOAD_WEIGHTS):
        users = [op for op in good.ops if op.lane == Lane.COMPUTE and op.id < load.id
                 and op.slot == load.slot]
        if users:
            last_user = users[-1]
            break
    assert last_user.id in load.deps
    with pytest.raises(ScheduleError, match=rf"overwrites 'w{load.slot}' while op {last_user.id}"):
        check_schedule(_drop_dep(good, load, last_user.id))


def test_every_load_after_the_first_use_of_its_slot_waits_for_that_slot(good):
    """Drop the WAR dep of each reloading LOAD_WEIGHTS in turn: every one is essential."""
    n = 0
    for load in _of(good, OpKind.LOAD_WEIGHTS):
        users = [op for op in good.ops if op.lane == Lane.COMPUTE and op.id < load.id
                 and op.slot == load.slot]
        if not users:
            continue
        n += 1
        with pytest.raises(ScheduleError, match="overwrites"):
            check_schedule(_drop_dep(good, load, users[-1].id))
    assert n >= 4


def test_use_after_free_is_rejected(good):
    """Device checkpoints: x.m0.0 lives from forward[0] to backward[0]. An earlier op that
    frees it leaves backward[0] reading freed memory."""
    og_head = _of(good, OpKind.OFFLOAD_GRADS, 5)[0]
    bwd0 = _of(good, OpKind.BACKWARD, 0)[0]
    assert og_head.id < bwd0.id and "x.m0.0" in bwd0.reads
    with pytest.raises(ScheduleError, match=rf"op {bwd0.id} .* reads 'x\.m0\.0' after it was freed"):
        check_schedule(_with(good, og_head.id, frees=og_head.frees + ("x.m0.0",)))


def test_dependency_cycle_is_rejected(good):
    fwd = _of(good, OpKind.FORWARD, 0)[0]
    load = good.ops[fwd.deps[0]]
    assert load.kind == OpKind.LOAD_WEIGHTS
    # the load now waits for the forward that waits for the load
    with pytest.raises(ScheduleError, match="cycle"):
        check_schedule(_with(good, load.id, deps=load.deps + (fwd.id,)))


def test_cycle_through_lane_order_is_rejected(good):
    """A dep on a later op of the same lane is a cycle through FIFO order."""
    first_fwd = _of(good, OpKind.FORWARD, 0)[0]
    later_bwd = _of(good, OpKind.BACKWARD, 0)[0]
    with pytest.raises(ScheduleError, match="cycle"):
        check_schedule(_with(good, first_fwd.id, deps=first_fwd.deps + (later_bwd.id,)))


def test_dependency_on_missing_op_is_rejected(good):
    op = good.ops[3]
    with pytest.raises(ScheduleError, match="depends on op 99999, which does not exist"):
        check_schedule(_with(good, 3, deps=op.deps + (99999,)))
    with pytest.raises(ScheduleError, match="depends on op -1"):
        check_schedule(_with(good, 3, deps=(-1,)))
    with pytest.raises(ScheduleError, match="which does not exist"):
        check_schedule(_with(good, 3, deps=(3,)))  # on itself


def test_unknown_buffer_is_rejected(good):
    fwd = _of(good, OpKind.FORWARD, 1)[0]
    with pytest.raises(ScheduleError, match="unknown buffer 'w9'"):
        check_schedule(_with(good, fwd.id, reads=fwd.reads + ("w9",)))


def test_unbalanced_dynamic_buffer_is_rejected(good):
    og = _of(good, OpKind.OFFLOAD_GRADS, 1)[0]
    assert og.frees == ("dgrad.1.m0",)
    with pytest.raises(ScheduleError, match=r"does not balance.*'dgrad\.1\.m0'"):
        check_schedule(_with(good, og.id, frees=()))


def test_freeing_a_static_buffer_or_twice_is_rejected(good):
    og = _of(good, OpKind.OFFLOAD_GRADS, 1)[0]
    with pytest.raises(ScheduleError, match="frees static buffer 'w0'"):
        check_schedule(_with(good, og.id, frees=og.frees + ("w0",)))
    og0 = _of(good, OpKind.OFFLOAD_GRADS, 0)[0]
    with pytest.raises(ScheduleError, match="not allocated|after it was freed"):
        check_schedule(_with(good, og0.id, frees=og0.frees + ("dgrad.1.m0",)))


def test_ids_out_of_order_are_rejected(good):
    with pytest.raises(ScheduleError, match="ids must be 0..n-1"):
        check_schedule(_with(good, 4, id=40))
