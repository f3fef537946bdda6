"""The ZeRO-3 peer's gradient path and optimizer step as DeepSpeed's code runs them (issue 26):
pin_memory pages the gradient buffers and never the fetched parameters, the host passes around
the Adam, v0.6-v0.7's boundary copy cast on the host (into fresh pages), a tied head's gradient held for the
embedding's, partition_grads' device temporaries, the embedding fetched for its backward, and
the reuse distance counted along the trace of module visits. Planner only, no clocks."""
import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.peer.compare import plan_zero3
from horizon_sim.peer.zero3_builder import build_zero3_schedule
from horizon_sim.peer.zero3_counts import largest_tensor
from horizon_sim.peer.zero3_grad_path import NORM_PART_ELEMS, partition_grads_temporaries
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.schedule.op import EMBED, OpKind
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec


def small(L=4, H=256, V=512, tied=False):
    return ModelSpec(name=f"s{L}", n_layers=L, hidden=H, n_heads=4, n_kv_heads=2, ffn_hidden=688, vocab=V,
                     tied_embeddings=tied)


def link_ops(s, kind):
    return [op for op in s.ops if op.kind == kind]


def test_pin_memory_off_pages_the_gradient_copies_not_the_fetches():
    m, base = small(H=1024, V=4096), dict(batch=2, seq=64)
    s = build_zero3_schedule(m, Zero3Policy(**base, pin_memory=False))
    assert link_ops(s, OpKind.LOAD_WEIGHTS) and not any(op.pageable for op in link_ops(s, OpKind.LOAD_WEIGHTS))
    assert all(op.pageable for k in (OpKind.OFFLOAD_GRADS, OpKind.RELOAD_GRADS) for op in link_ops(s, k))
    pinned = build_zero3_schedule(m, Zero3Policy(**base))
    assert not any(op.pageable for op in pinned.ops)
    # the pageable copies run at the link's pageable rate: the fetches take as long either way
    hw = make_hardware("a100-80gb", "256GiB")
    slow, fast = plan_zero3(m, hw, Zero3Policy(**base, pin_memory=False)), plan_zero3(m, hw, Zero3Policy(**base))
    dur = lambda r, k: float(r.timeline[r.timeline.kind == k].dur_s.sum())  # noqa: E731
    assert dur(slow, "offload_grads") > 2 * dur(fast, "offload_grads")
    assert dur(slow, "load_weights") == pytest.approx(dur(fast, "load_weights"), rel=1e-6)
    # and the host sits in each: every backward after an offload waits for it (one bucket a unit)
    per_unit = build_zero3_schedule(m, Zero3Policy(**base, pin_memory=False, reduce_bucket_params=1))
    by_id = {op.id: op for op in per_unit.ops}
    bwd = [op for op in per_unit.ops if op.kind == OpKind.BACKWARD]
    assert all(any(by_id[d].kind == OpKind.RELOAD_GRADS for d in op.deps) for op in bwd[1:])


def test_the_optimizer_step_is_three_host_passes_per_unit():
    m = small()
    s = build_zero3_schedule(m, Zero3Policy(batch=2, seq=64))
    passes = [op for op in s.ops if op.kind == OpKind.HOST_PASS]
    opt = [op for op in s.ops if op.kind == OpKind.OPTIMIZER]
    assert len(passes) == 2 * len(opt)
    n = sum(op.params for op in opt)
    assert sum(op.host_bytes for op in opt) == 28 * n  # the Adam: fp32 gradient, master and moments
    assert sum(op.host_bytes for op in passes) == (8 + 4 + 2) * n  # the unscale; the cast into the bf16 partition
    # unscale, Adam, cast, in that order, unit by unit
    for u in {op.unit for op in opt}:
        kinds = [op.kind for op in s.ops if op.unit == u and op.kind in (OpKind.HOST_PASS, OpKind.OPTIMIZER)]
        assert kinds == [OpKind.HOST_PASS, OpKind.OPTIMIZER, OpKind.HOST_PASS]


def test_v06_v07_cast_the_boundary_gradient_on_the_host():
    m, base = small(), dict(batch=2, seq=64)
    grads = lambda s: sum(op.link_bytes for op in link_ops(s, OpKind.OFFLOAD_GRADS))  # noqa: E731
    dev = build_zero3_schedule(m, Zero3Policy(**base))
    host = build_zero3_schedule(m, Zero3Policy(**base, host_cast_at_boundary=True))
    n = m.total_params
    assert grads(dev) == (2 + 4) * n and grads(host) == (2 + 2) * n  # bf16 down, then fp32 (device) or bf16 (host)
    assert sum(op.host_bytes for op in link_ops(host, OpKind.OFFLOAD_GRADS)) == (2 + 4) * n
    # ... into a bf16 temporary PyTorch allocates for that copy (copy_kernel_cuda's empty_like),
    # fresh pages each time; 0.19's path lands in buffers made once
    assert sum(op.fault_bytes for op in link_ops(host, OpKind.OFFLOAD_GRADS)) == 2 * n
    assert sum(op.fault_bytes for op in dev.ops) == 0
    with pytest.raises(HorizonError, match="host_cast_at_boundary"):
        Zero3Policy(fp32_grad_copy=False, host_cast_at_boundary=True)
    with pytest.raises(HorizonError, match="zero2-offload"):
        Zero3Policy(offload_param=False, host_cast_at_boundary=True)


def test_fresh_pages_are_written_at_the_first_touch_rate():
    """The boundary's fresh temporary costs its bytes at first_touch_GBps on a host core: the
    step grows by about their sum over the step's offloads when that rate halves, and a plan
    without fresh pages does not move."""
    from dataclasses import replace

    m, base = small(L=8, H=512, V=512), dict(batch=1, seq=64, pin_memory=False)
    hw = make_hardware("a100-40gb", "500GB")
    slow_hw = replace(hw, host=replace(hw.host, first_touch_GBps=hw.host.first_touch_GBps / 2))
    host = Zero3Policy(**base, host_cast_at_boundary=True)
    fault = sum(op.fault_bytes for op in build_zero3_schedule(m, host).ops)
    extra = fault / (hw.host.first_touch_GBps * 1e9)  # the halved rate costs the same again
    grown = plan_zero3(m, slow_hw, host).summary.step_time_s - plan_zero3(m, hw, host).summary.step_time_s
    assert fault > 0 and grown == pytest.approx(extra, rel=0.05)
    dev = Zero3Policy(**base)
    assert plan_zero3(m, slow_hw, dev).summary.step_time_s == plan_zero3(m, hw, dev).summary.step_time_s
    with pytest.raises(HorizonError, match="first_touch_GBps"):
        replace(hw.host, first_touch_GBps=0.0)


def test_a_tied_heads_gradient_waits_for_the_embeddings_and_goes_down_once():
    m = small(tied=True)
    s = build_zero3_schedule(m, Zero3Policy(batch=2, seq=64, reduce_bucket_params=1, fp32_grad_copy=False))
    offs = link_ops(s, OpKind.OFFLOAD_GRADS)
    assert sum(op.link_bytes for op in offs) == 4 * m.total_params  # the tied matrix once
    head_grad = next(n for n, b in s.buffers.items() if n.startswith("dgrad.") and b.unit == m.n_layers)
    freed_by = next(op for op in s.ops if head_grad in op.frees)
    assert freed_by is offs[-1] and "dgrad.emb.m0" in freed_by.frees  # with the embedding's, last
    assert not any(b.unit == m.n_layers for op in offs[:-1] for b in (s.buffers[n] for n in op.frees))


def test_partition_grads_temporaries_follow_the_largest_tensor():
    m = small(V=4096)
    z = Zero3Policy(batch=2, seq=64)
    big = largest_tensor(m, EMBED)
    assert big == 4096 * 256
    # the device copy back from the host buffer (2 bytes) and the norm's fp64 copy (8)
    assert partition_grads_temporaries(m, z, [0, EMBED], last=True) == big * (2 + 8)
    assert partition_grads_temporaries(m, z, [0], last=False) == largest_tensor(m, 0) * 2
    # v0.5.7's path: no host buffer, the fp64 norm or the fp32 cast on its way down
    off = Zero3Policy(batch=2, seq=64, fp32_grad_copy=False)
    assert partition_grads_temporaries(m, off, [0], last=True) == largest_tensor(m, 0) * 8
    assert partition_grads_temporaries(m, off, [0], last=False) == 0
    # a tensor above the norm's part: the fp64 copy is of one part; 0.19's fp32 cast is of all of it
    huge = ModelSpec(name="h", n_layers=1, hidden=8192, n_heads=64, n_kv_heads=8, ffn_hidden=28672, vocab=200_000)
    big = 8192 * 200_000
    host = Zero3Policy(batch=2, seq=64, host_cast_at_boundary=True)
    assert partition_grads_temporaries(huge, host, [EMBED], last=True) == 2 * big + 8 * NORM_PART_ELEMS
    assert partition_grads_temporaries(huge, z, [EMBED], last=True) == 2 * big + 4 * big
    big = largest_tensor(m, EMBED)
    s = build_zero3_schedule(m, z)
    assert max(op.workspace_bytes for op in link_ops(s, OpKind.OFFLOAD_GRADS)) == big * (2 + 8)


def test_the_embedding_comes_back_for_its_backward_and_stays_until_its_gradient_goes():
    m = small()
    s = build_zero3_schedule(m, Zero3Policy(batch=2, seq=64))
    loads = [op for op in link_ops(s, OpKind.LOAD_WEIGHTS) if op.unit == EMBED]
    first_bwd = next(op.id for op in s.ops if op.kind == OpKind.BACKWARD)
    assert len(loads) == 2 and loads[1].id > first_bwd
    assert loads[1].writes[0] in link_ops(s, OpKind.OFFLOAD_GRADS)[-1].frees


def test_the_reuse_distance_counts_every_visit_of_the_trace():
    """DeepSpeed keeps a layer for its backward when its next use is within max_reuse_distance
    parameters of module visits: the head twice (forward, backward), each later layer twice
    with checkpointing (recompute, backward). A distance that covers the last layer's and the
    head's visits keeps the last layer only."""
    m = small(L=6)
    n, head = m.layer_params, m.head_device_params

    def kept(reuse, ckpt=True):
        s = build_zero3_schedule(m, Zero3Policy(batch=1, seq=64, act_ckpt=ckpt, max_reuse_distance_params=reuse))
        head_op = next(op.id for op in s.ops if op.kind == OpKind.HEAD)
        again = {op.unit for op in link_ops(s, OpKind.LOAD_WEIGHTS) if op.id > head_op}
        return [u for u in range(m.n_layers) if u not in again]
    assert kept(2 * head) == [] and kept(2 * head + 1) == [5]
    # layer 4's next use is 3 layers' visits and the head's two away: layer 5's forward, its
    # recompute and its backward (once without checkpointing: 2 layers' visits)
    assert kept(2 * head + 3 * n) == [5] and kept(2 * head + 3 * n + 1) == [4, 5]
    assert kept(2 * head + 3 * n, ckpt=False) == [4, 5]
