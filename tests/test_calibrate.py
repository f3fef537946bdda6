"""`horizon calibrate` and the model of the machine behind it: the quick calibration writes a
loadable hardware file with sane numbers; the template's work and temporaries counted in
schedule/work.py match what the executor really does (kernel by kernel, byte for byte); the
measured tables interpolate; lanes sharing a core slow each other as processor sharing says.
No wall-clock assertions."""
import math
import time

import pytest
import torch

from horizon_exec.device.compute_dtype import default_compute_dtype
from horizon_exec.measure.calibrate.host import ADAM_TRAFFIC_BYTES, bus_capacity_GBps
from horizon_exec.measure.calibrate.kernel_threads import kernels
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.schedule import OpKind, build_schedule, work
from horizon_sim.sim.costs import CostModel, RateTable
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware import ADAPTER_OVERHEAD_KINDS, MOE_OVERHEAD_KINDS, TRACKED_OVERHEAD_KINDS, DeviceSpec
from horizon_sim.specs.layout import Layout
from horizon_sim.specs.hardware_io import hardware_to_toml, load_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


@pytest.fixture(scope="module")
def quick_hw(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "machine.toml"
    # the CPU backend's file, also on a GPU box (module-scoped: before conftest's per-test patch)
    assert main(["calibrate", "--quick", "--device", "cpu", "-o", str(path)]) == 0
    return path


def test_quick_calibration_writes_a_loadable_sane_spec(quick_hw):
    hw = load_hardware(quick_hw)
    assert hardware_to_toml(hw) == quick_hw.read_text()  # round trip, tables included
    d, l, h = hw.device, hw.link, hw.host
    for v in (d.bf16_TFLOPs, d.fp32_TFLOPs, d.hbm_GBps, d.reduce_GBps, l.h2d_GBps, l.d2h_GBps,
              h.dram_GBps, h.thread_GBps, h.adam_Gparams_per_s, h.runtime_overhead_GiB, h.ram_GiB):
        assert math.isfinite(v) and v > 0
    assert 0 < d.matmul_efficiency <= 1 and l.cpu_driven and 0 < h.lane_cores <= h.cores
    layouts = {r[1] for r in d.gemm_TFLOPs if r[0] == "bf16"}
    assert layouts == {"nt", "nn", "tn"} and all(r[5] > 0 for r in d.gemm_TFLOPs)
    assert d.attention_TFLOPs and all(r[3] > 0 and r[4] > 0 for r in d.attention_TFLOPs)
    assert len(d.masked_attention_TFLOPs) == len(d.attention_TFLOPs)
    # attention is measured in the dtype `horizon train` computes in here by default (fp32 on a
    # CPU without bf16 matrix instructions) as well as in the planner's bf16, so a default run is
    # priced from its own kernels' rows, not from bf16's or from a peak
    run_dtype = default_compute_dtype("cpu")[0]
    for table in (d.attention_TFLOPs, d.masked_attention_TFLOPs):
        assert {r[0] for r in table} == {"bf16", run_dtype}
    assert all(r[3] > 0 and r[4] > 0 for r in d.masked_attention_TFLOPs)
    # gloo over loopback, measured: one device as calibrated, its rates serve --gpus N
    c = hw.cluster
    assert c.layout == Layout(1, 1) and c.fabric_GBps > 0 and c.fabric_latency_us >= 0
    from argparse import Namespace

    from horizon_sim.cli.hardware_args import with_cluster
    two = with_cluster(hw, Namespace(gpus=2, nodes=None, cluster=None)).cluster
    assert two.layout.devices_per_node == 2 and two.fabric_GBps == c.fabric_GBps
    kinds = dict(d.op_overhead_us)
    # an MoE row that measures <= 0 on a noisy machine is left out (absent = 0): the expert's
    # cost, a dozen kernels forward and thirty backward, does not
    assert {"forward", "backward", "head", "recompute", "forward_expert", "backward_expert"} <= set(kinds)
    assert set(kinds) <= {"forward", "backward", "head", "recompute", "head_chunk", *MOE_OVERHEAD_KINDS,
                          *ADAPTER_OVERHEAD_KINDS, *TRACKED_OVERHEAD_KINDS}
    # tracking every op on every run costs Python work per kernel: a row where it came out dearer
    assert all(kinds[k] > kinds[k.removesuffix("_tracked")] for k in TRACKED_OVERHEAD_KINDS if k in kinds)
    assert all(v > 0 for v in kinds.values())
    # the bus carries what AdamW was measured moving alone (calibrate/host.py bus_capacity_GBps)
    assert h.dram_GBps >= ADAM_TRAFFIC_BYTES * h.adam_Gparams_per_s
    # a model simulates on it, with every compute term present
    sched = build_schedule(ModelSpec(n_layers=2, hidden=128, n_heads=2, n_kv_heads=1, ffn_hidden=352, vocab=256),
                           Policy(batch=1, seq=64))
    r = simulate(sched, hw)
    assert r.summary.step_time_s > 0
    terms = CostModel(hw, "bf16", sched.meta).compute_terms(next(o for o in sched.ops if o.kind == OpKind.BACKWARD))
    assert all(terms[k] > 0 for k in ("overhead", "gemm", "attention", "elementwise"))


@pytest.mark.parametrize("H, heads, kv, F, V, B, T, chunk, dtype, win, docs, qk", [
    (256, 4, 2, 640, 256, 2, 64, 1024, "bf16", 0, False, False),     # forward peak at the MLP, backward in the MLP's backward
    (512, 8, 8, 1376, 2048, 1, 64, 32, "bf16", 0, False, False),     # few tokens: the backward peak is in the first norm's backward
    (384, 6, 2, 1024, 512, 2, 48, 64, "bf16", 0, False, False),      # ... or in the second norm's; two loss chunks
    (128, 4, 2, 352, 300, 2, 32, 1024, "fp32", 0, False, False),
    (256, 4, 2, 640, 256, 2, 64, 1024, "bf16", 16, False, False),    # a sliding window: the mask kept for backward
    (128, 4, 2, 352, 300, 2, 256, 1024, "fp32", 32, True, False),    # window and documents, fp32
    (64, 2, 1, 128, 256, 4, 512, 1024, "bf16", 0, True, False),      # documents: the forward peak at the attention call
    (32, 2, 1, 64, 256, 4, 1024, 4096, "bf16", 0, True, False),      # ... and the backward's too (its forward-with-grad)
    (384, 6, 2, 1024, 512, 2, 48, 64, "bf16", 0, False, True),     # Qwen3 q/k norms: priced from the block
    (128, 4, 2, 352, 300, 2, 32, 1024, "fp32", 16, False, True),   # description alone (schedule/work.py unchanged)
])
def test_workspace_formulas_equal_the_measured_temporaries(H, heads, kv, F, V, B, T, chunk, dtype, win, docs, qk):
    spec = ModelSpec(n_layers=2, hidden=H, n_heads=heads, n_kv_heads=kv, ffn_hidden=F, vocab=V, family="qwen3" if qk else "llama",
                     layer_windows=(win, win) if win else ())
    kw = dict(compute_dtype="fp32", grad_dtype="fp32", working_copy=False) if dtype == "fp32" else {}
    pol = Policy(batch=B, seq=T, act_ckpt_every=2, loss_chunk_tokens=chunk, doc_masks=docs, **kw)
    a = 4 if dtype == "fp32" else 2
    d = None
    if docs:  # three documents per sequence
        d = torch.zeros(B, T, dtype=torch.int64)
        d[:, T // 3:] += 1
        d[:, T // 2:] += 1
    with Trainer(spec, pol) as tr:
        tl = tr.step(torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0)), docs=d).timeline
    mask = work.mask_bytes(B, T, docs) if (docs or win) else 0
    for kind in ("forward", "recompute", "backward", "head"):
        measured = set(tl[tl.kind == kind].temp_peak_bytes)
        if kind == "head":
            want = work.head_temp_peak_bytes(spec, B * T, chunk, a)
        else:
            want = work.block_temp_peak_bytes(spec, B, T, a, kind == "backward", mask)
        assert measured == {want}, kind
    # and the schedule charges them as workspace beside the op's output buffer
    op = next(o for o in build_schedule(spec, pol).ops if o.kind == OpKind.BACKWARD)
    assert op.workspace_bytes == work.block_temp_peak_bytes(spec, B, T, a, True, mask) - B * T * H * a


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_thread_scaling_kernels_compute_in_the_dtype_asked(dtype):
    """calibrate times each kernel kind's thread scaling in the dtype a default run computes in:
    without bf16 instructions a bf16 GEMM gains nothing from a second thread and an fp32 one
    nearly doubles, so a bf16 figure would price an fp32 run's split wrongly."""
    fns = kernels(True, dtype)
    assert fns["gemm"]().dtype == dtype and fns["elementwise"]().dtype == dtype
    fns["attention"]()  # runs forward and backward in that dtype


def test_rate_table_is_exact_at_measured_shapes_and_between_them_elsewhere():
    rows = [("bf16", "nt", 128.0, 128.0, 128.0, 0.05), ("bf16", "nt", 512.0, 512.0, 512.0, 0.2),
            ("bf16", "nn", 512.0, 512.0, 512.0, 0.1), ("fp32", "nt", 512.0, 512.0, 512.0, 0.09)]
    t = RateTable(rows, "bf16", key_len=2)
    assert t.rate("nt", (512, 512, 512)) == 0.2 and t.rate("nt", (128, 128, 128)) == 0.05
    assert 0.05 < t.rate("nt", (256, 256, 256)) < 0.2
    assert 0.05 < t.rate("nt", (8192, 8192, 8192)) <= 0.2  # never beyond the measured values
    assert t.rate("nn", (300, 300, 300)) == pytest.approx(0.1)
    assert not RateTable(rows, "fp16", key_len=2)


def test_an_unmeasured_shape_takes_its_nearest_measured_shapes_not_the_whole_table():
    """The rate between measured shapes comes from the nearest ones: a cell of 8 slow small
    shapes is not pulled up by a couple of hundred fast large ones far away (weighting every
    point gave the H200 table's 64-row GEMM 3x the rate of its 512-row neighbours)."""
    corners = [("bf16", "nt", float(m), float(n), float(k), 0.01)
               for m in (128, 256) for n in (128, 256) for k in (128, 256)]
    far = [("bf16", "nt", float(m), float(n), float(k), 1.0)
           for m in (4096, 8192, 16384) for n in (4096, 8192, 16384, 32768) for k in (4096, 8192, 16384, 32768)] * 4
    t = RateTable(corners + far, "bf16", key_len=2)
    assert t.rate("nt", (181, 181, 181)) == pytest.approx(0.01, rel=1e-9)
    assert 0.01 < t.rate("nt", (1024, 1024, 1024)) < 1.0


def test_a_gemm_is_timed_after_an_untimed_call_over_several_calls(monkeypatch):
    """gemm_times calls each shape once untimed, then at least GEMM_MIN_CALLS times (up to
    GEMM_MAX_CALLS while under GEMM_TIMED_S), and gemm_rates takes each shape's median visit."""
    from horizon_exec.measure.calibrate import kernels as K
    calls = {}

    class Instant:  # a GEMM that costs nothing: the loop runs to its call limit
        def __init__(self, layout, m, n, k, dtype, device, pool_bytes):
            self.shape = (layout, m, n, k)

        def __call__(self):
            calls[self.shape] = calls.get(self.shape, 0) + 1

    monkeypatch.setattr(K, "ColdOperands", Instant)
    shapes = [("nt", 128, 128, 128), ("nn", 256, 128, 64)]
    times = K.gemm_times(shapes, torch.bfloat16, "cpu")
    assert set(times) == set(shapes) and calls == {s: 1 + K.GEMM_MAX_CALLS for s in shapes}
    s = shapes[0]
    flops = 2.0 * 128 ** 3
    rates = K.gemm_rates([{s: 1.0}, {s: 1.0}, {s: 10.0}])  # one visit on a busy machine
    assert rates[s] == pytest.approx(flops / 1e12)


@pytest.mark.parametrize("rows, match", [
    ([("bf16", "nt", 128, 128)], "must have 6 cells"),
    ([("bf16", "nt", 128, 128, 128, -1.0)], "TFLOPS=-1.0"),
    ([("", "nt", 128, 128, 128, 0.1)], "dtype=''"),
    ("fast", "must be a list of rows"),
])
def test_bad_measured_tables_raise(rows, match):
    from horizon_sim.errors import HorizonError
    with pytest.raises(HorizonError, match=match):
        DeviceSpec(name="d", hbm_GiB=8, bf16_TFLOPs=1, fp32_TFLOPs=1, hbm_GBps=10, default_link="l",
                   gemm_TFLOPs=rows)


@pytest.mark.parametrize("reported,preset", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA H200", "h200"), ("NVIDIA GH200 480GB", "gh200"),  # not h200: words, not substrings
    ("NVIDIA L40S", "l40s"), ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("Tesla V100-SXM2-16GB", None), ("NVIDIA H100 NVL", None),
])
def test_cuda_calibration_names_the_preset_of_the_gpu(reported, preset):
    """calibrate --device cuda takes the datasheet peak from the preset torch's device name
    matches (the measured GEMMs give the efficiency against it)."""
    from horizon_exec.measure.calibrate.cuda import preset_for
    got = preset_for(reported)
    assert (got.name if got else None) == preset


def test_cuda_calibration_timing_runs_with_events_faked(monkeypatch):
    """calibrate --device cuda's event-timed GEMM and attention helpers have never run on a
    GPU here: run them on CPU tensors, CUDA events faked by the host clock, so a wrong call
    or shape fails here first. Rates must be positive and finite."""
    import horizon_exec.measure.calibrate.cuda as cc

    class HostClockEvent:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self, stream=None):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

        def elapsed_time(self, end):  # ms, as torch.cuda.Event's
            return (end.t - self.t) * 1e3

    monkeypatch.setattr(torch.cuda, "Event", HostClockEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    shapes = [("nt", 64, 96, 32), ("nn", 64, 32, 96), ("tn", 96, 32, 64)]
    rates = cc.gemm_table(shapes, torch.float32, "cpu")
    fwd, bwd = cc.attention_rates(64, 16, torch.float32, "cpu")
    assert set(rates) == set(shapes)
    assert all(0 < r < math.inf for r in [*rates.values(), fwd, bwd])


def test_busy_latency_samples_are_host_ops_alone_next_to_compute():
    """Only host-lane ops that started while compute ran and that no other host lane's op
    overlapped (the simulator models that sharing itself): a hand-made timeline."""
    import pandas as pd
    from horizon_exec.measure.calibrate.contention import alone_next_to_compute
    rows = [  # op_id, lane, start, end
        (0, "compute", 0.0, 10.0),
        (1, "h2d", 1.0, 2.0),     # alone next to compute: kept
        (2, "d2h", 3.0, 5.0),     # overlaps op 3 on another host lane: dropped
        (3, "cpu", 4.0, 6.0),     # overlaps op 2: dropped
        (4, "h2d", 6.5, 7.0),     # kept (touches nothing)
        (5, "h2d", 7.0, 7.5),     # same lane as 4, back to back: kept
        (6, "cpu", 11.0, 12.0),   # compute idle when it started: dropped
        (7, "d2h", 9.5, 11.0),    # started under compute, runs past it, alone: kept
    ]
    tl = pd.DataFrame(rows, columns=["op_id", "lane", "start_s", "end_s"])
    assert [r.op_id for r in alone_next_to_compute(tl)] == [1, 4, 5, 7]


@pytest.mark.parametrize("split", [False, True])
def test_the_planned_update_runs_at_the_measured_adam_rate(split):
    """A calibrated host's AdamW, planned alone, takes its parameters over the measured rate: the
    bus it shares is at least what the update moves (on an H200 box the copy loop read 98.9 GB/s
    and AdamW ran at 5.42 G params/s = 152 GB/s; capped at 98.9 the update was planned at 0.557 s
    for 0.390 s measured). ADAM_TRAFFIC_BYTES is what the Schedule counts for the measured layout."""
    from dataclasses import replace

    from tests.cpu_machine import CPU_HW
    adam = 5.42
    host = replace(CPU_HW.host, adam_Gparams_per_s=adam, dram_GBps=bus_capacity_GBps(98.9, adam),
                   op_latency_us=0.0, lane_cores=0.0)
    hw = replace(CPU_HW, host=host)
    m = ModelSpec(n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=512, vocab=512)
    pol = Policy(batch=1, seq=64, master_dtype="fp32", split_master=split)
    sched = build_schedule(m, pol)
    op = next(o for o in sched.ops if o.kind == OpKind.OPTIMIZER and o.params)
    costs = CostModel(hw, pol.compute_dtype, sched.meta)
    assert costs.alone_s(op) == pytest.approx(op.params / (adam * 1e9), rel=1e-9)
    if not split:  # the layout calibrate measures: the Schedule's bytes are ADAM_TRAFFIC_BYTES
        assert op.host_bytes == ADAM_TRAFFIC_BYTES * op.params
    capped = CostModel(replace(hw, host=replace(host, dram_GBps=98.9)), pol.compute_dtype, sched.meta)
    assert capped.alone_s(op) > 1.3 * costs.alone_s(op)


def test_a_fixed_cost_noise_measured_at_zero_is_left_out_of_the_hardware_file():
    """On a busy machine the eight-chunk head can time no slower than the one-chunk one: its
    per-chunk cost clamps to 0, which a hardware file refuses (its rows are > 0, absent = 0).
    Calibration keeps only the rows above 0 (measured_rows), on the CPU as on CUDA."""
    from dataclasses import replace

    from horizon_exec.measure.calibrate.overheads import (HEAD8_POLICY, TINY_POLICY, head_chunk_us, head_id,
                                                          measured_rows)
    from horizon_sim.errors import HorizonError
    from horizon_sim.specs.hardware_presets import make_hardware
    us = {"forward": 30.0, "head_chunk": head_chunk_us({head_id(TINY_POLICY): [0.010]},
                                                       {head_id(HEAD8_POLICY): [0.009]})}
    assert us["head_chunk"] == 0.0
    dev = make_hardware("h100-sxm", "512GiB").device
    with pytest.raises(HorizonError, match="head_chunk"):
        replace(dev, op_overhead_us=tuple(sorted(us.items())))
    assert replace(dev, op_overhead_us=tuple(sorted(measured_rows(us).items()))).op_overhead_us == (("forward", 30.0),)


def test_calibrate_says_when_the_machine_moved_while_the_grid_was_timed():
    """Each round's visit of the GEMM grid against the median visit: a round 1.3x slower than
    the others is named (the rates are the medians, the plans carry the spread); visits at one
    speed, and a single round, say nothing. The warm-up visit is not a round's."""
    from horizon_exec.measure.calibrate.cpu import _moved_text
    from horizon_exec.measure.calibrate.kernels import visit_speeds
    base = {("nn", 128, 128, 128): 1e-4, ("nt", 512, 512, 512): 4e-3}
    slow = {s: t * 1.3 for s, t in base.items()}
    assert visit_speeds([base, slow, base]) == pytest.approx([1.0, 1 / 1.3, 1.0])
    text = _moved_text([slow, base, slow, base])
    assert "the GEMM grid's 3 visits ran at 0.77x-1.00x their median" in text
    assert _moved_text([slow, base, base, base]) == ""  # the warm-up visit's speed does not count
    assert _moved_text([base, slow]) == ""  # one round: nothing to compare
