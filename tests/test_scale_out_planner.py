"""Data parallel in the planner (issue 16, first part): the cluster in the HardwareSpec, the
collective ops in one rank's Schedule, their costs and the node's host footprint.

- A single device's Schedule has no collective and no node-shared buffer (its ops and buffers
  are the ones it always had: tests/test_schedule.py and the hand-worked step still hold).
- Collective ops obey their dependencies in the simulated timeline, for every optimizer mode,
  micro-batching, tied embeddings and layouts of devices and nodes.
- The node's host footprint: master and moments 12 bytes per parameter over M nodes, the
  working copy 2 bytes once per node, every rank's own buffers N times.
- With a free network, more nodes never slow the step and scale tokens/s at least linearly
  (each rank updates a smaller share of the model); a slow one becomes the bottleneck.
"""
import dataclasses
import itertools
import json
import tomllib

import pytest

from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import OpKind, build_schedule
from horizon_sim.schedule.op import COLLECTIVES, Holds, Lane
from horizon_sim.schedule.serialize import from_json, to_json
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.cluster import SINGLE, ClusterSpec, make_cluster
from horizon_sim.specs.hardware_io import hardware_from_dict, hardware_to_toml
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.layout import Layout
from horizon_sim.specs.policy import Policy

SPEC = ModelSpec(n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=688, vocab=4096)
NEW_KINDS = {OpKind.REDUCE_SCATTER, OpKind.HOST_REDUCE, *COLLECTIVES}


def _hw(gpus, nodes, free_network=False):
    hw = make_hardware("h100-sxm", "4TB", layout=Layout(gpus, nodes))
    if free_network:
        c = hw.cluster
        hw = dataclasses.replace(hw, cluster=dataclasses.replace(
            c, fabric_GBps=1e9 if c.layout.devices_per_node > 1 else 0.0, fabric_latency_us=0.0,
            net_GBps=1e9 if c.layout.nodes > 1 else 0.0, net_latency_us=0.0))
    return hw


def test_one_device_has_no_collectives():
    for opt in ("after", "backward", "pipelined"):
        s = build_schedule(SPEC, Policy(batch=2, seq=64, optimizer=opt, grad_clip=0 if opt == "backward" else 1))
        assert not {o.kind for o in s.ops} & NEW_KINDS
        assert not any(b.node_shared for b in s.buffers.values())
        assert s.meta.layout == Layout(1, 1)


CASES = list(itertools.product([(2, 1), (1, 2), (4, 2)], ["after", "backward", "pipelined"], [1, 2], [False, True]))


@pytest.mark.parametrize("layout,opt,mb,tied", CASES)
def test_collectives_obey_dependencies(layout, opt, mb, tied):
    n, m = layout
    spec = dataclasses.replace(SPEC, tied_embeddings=tied)
    pol = Policy(batch=2 * mb, seq=64, micro_batches=mb, optimizer=opt, grad_clip=0 if opt == "backward" else 1)
    sched = build_schedule(spec, pol, Layout(n, m))
    assert from_json(to_json(sched)) == sched
    kinds = [o.kind for o in sched.ops]
    if n > 1:
        assert OpKind.REDUCE_SCATTER in kinds and OpKind.HOST_REDUCE in kinds
    if m > 1:
        units = spec.n_layers + 2
        assert kinds.count(OpKind.NET_REDUCE_SCATTER) == units and kinds.count(OpKind.NET_ALL_GATHER) == units
    assert kinds.count(OpKind.NORM_ALL_REDUCE) == 1
    # with several ranks per node, no rank loads a unit before every rank has updated its slice
    assert kinds.count(OpKind.UPDATE_BARRIER) == (kinds.count(OpKind.OPTIMIZER) if n > 1 else 0)
    for o in sched.ops:
        if o.kind == OpKind.LOAD_WEIGHTS and n > 1:
            for src in o.reads:
                writers = [p for p in sched.ops if p.id < o.id and src in p.writes]
                if writers and any(w.kind == OpKind.OPTIMIZER for w in writers):
                    assert writers[-1].kind == OpKind.UPDATE_BARRIER, o.label
    r = simulate(sched, _hw(n, m))
    end = dict(zip(r.timeline.op_id, r.timeline.end_s))
    start = dict(zip(r.timeline.op_id, r.timeline.start_s))
    for op in sched.ops:
        assert all(end[d] <= start[op.id] + 1e-12 for d in op.deps), op.label
    for o in sched.ops:  # each unit's gradient is reduced before its update uses it
        if o.kind == OpKind.OPTIMIZER and not o.prev_step:
            g = next(b for b in o.reads if sched.buffers[b].holds == Holds.HOST_GRAD)
            reducers = [p for p in sched.ops if p.id < o.id and g in p.writes
                        and p.kind in (OpKind.NET_REDUCE_SCATTER, OpKind.HOST_REDUCE)]
            if m > 1 or (n > 1 and sched.buffers[g].unit in (-1, spec.n_layers) and
                         (sched.buffers[g].unit == -1 or tied)):
                assert reducers, o.label
    lanes = set(r.summary.lane_busy)
    assert (Lane.FABRIC.value in lanes) == (n > 1) and (Lane.NET.value in lanes)


@pytest.mark.parametrize("n,m", [(1, 1), (4, 1), (2, 4), (8, 8)])
def test_host_footprint_is_the_nodes(n, m):
    pol = Policy(batch=2, seq=64, master_dtype="fp32")  # the whole fp32 master, sharded
    r = simulate(build_schedule(SPEC, pol, Layout(n, m)), _hw(n, m))
    by = r.host.by_role
    units = [SPEC.embedding_params, *[SPEC.layer_params] * SPEC.n_layers, SPEC.head_params]
    assert by["master"] == sum(-(-p // m) for p in units) * 4
    assert by["moments"] == sum(-(-p // m) for p in units) * 8
    assert by["working_copy"] == SPEC.total_params * 2               # once per node, whatever n and m
    assert by["runtime"] == n * 4 * 2**30                            # a process per device
    one = simulate(build_schedule(SPEC, pol), _hw(1, 1)).host.by_role
    assert by["act_checkpoints"] == n * one["act_checkpoints"]       # each rank keeps its own batch's


@pytest.mark.parametrize("opt", ["after", "backward", "pipelined"])
def test_with_a_free_network_more_nodes_never_slow_the_step(opt):
    pol = Policy(batch=4, seq=128, optimizer=opt, grad_clip=0 if opt == "backward" else 1)
    for n in (1, 4):
        base = simulate(build_schedule(SPEC, pol, Layout(n, 1)), _hw(n, 1, free_network=True)).summary
        for m in (2, 8):
            r = simulate(build_schedule(SPEC, pol, Layout(n, m)), _hw(n, m, free_network=True))
            s = r.summary
            assert s.step_time_s <= base.step_time_s * (1 + 1e-9)
            assert s.tokens_per_s >= m * base.tokens_per_s * (1 - 1e-9)


def test_the_overlap_plot_shows_the_collective_lanes():
    from horizon_sim.report.gantt import plot_overlap
    r = simulate(build_schedule(SPEC, Policy(batch=2, seq=64), Layout(2, 2)), _hw(2, 2))
    fig = plot_overlap(r)
    ticks = [t.get_text().split("\n")[0] for t in fig.axes[0].get_yticklabels()]
    assert ticks == ["h2d", "compute", "d2h", "cpu", "fabric", "net"]


def test_the_network_can_be_the_bottleneck():
    pol = Policy(batch=1, seq=64)
    hw = make_hardware("h100-sxm", "4TB", layout=Layout(1, 8), cluster="gh200-nodes")
    slow = dataclasses.replace(hw, cluster=dataclasses.replace(hw.cluster, net_GBps=0.01))
    s = simulate(build_schedule(SPEC, pol, Layout(1, 8)), slow).summary
    assert s.bottleneck == "network between nodes" and s.exposed_network_s > 0.5 * s.step_time_s


def test_cluster_spec_checks_and_files():
    with pytest.raises(HorizonError, match="need fabric_GBps > 0"):
        ClusterSpec(layout=Layout(2))
    with pytest.raises(HorizonError, match="need net_GBps > 0"):
        ClusterSpec(layout=Layout(1, 2))
    with pytest.raises(HorizonError, match="devices_per_node=0 must be a whole number"):
        ClusterSpec(layout=Layout(0))
    with pytest.raises(HorizonError, match="devices_per_host_link=4 is more than devices_per_node=2"):
        ClusterSpec(layout=Layout(2), fabric_GBps=10, devices_per_host_link=4)
    with pytest.raises(HorizonError, match="unknown cluster 'hgx-h10'.*did you mean"):
        make_cluster("h100-sxm", Layout(8), "hgx-h10")
    hw = make_hardware("a100-80gb", "1TB", layout=Layout(8, 4))
    assert hw.cluster.name == "hgx-a100" and hw.cluster.ranks == 32
    assert hardware_from_dict(tomllib.loads(hardware_to_toml(hw))) == hw
    single = make_hardware("a100-80gb", "1TB")
    assert "[cluster]" not in hardware_to_toml(single) and single.cluster == SINGLE
    with pytest.raises(HorizonError, match="schedule was built for 1 node"):
        simulate(build_schedule(SPEC, Policy(batch=1, seq=64)), hw)


def test_several_nodes_need_the_working_copy():
    with pytest.raises(HorizonError, match="2 nodes need the bf16 working copy"):
        build_schedule(SPEC, Policy(batch=1, seq=64, working_copy=False), Layout(1, 2))


def test_plan_cli(capsys):
    rc = main(["plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--ram", "1TB", "--gpus", "8", "--nodes", "2",
               "--json", "--no-advice"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ranks"] == 16 and out["devices_per_node"] == 8 and out["nodes"] == 2
    assert out["scaling_efficiency"] > 0 and "net" in out["lane_busy"] and "fabric" in out["lane_busy"]
    for argv, msg in ((["--gpus", "0"], "--gpus 0: use a whole number from 1 to 64"),
                      (["--gpu", "gh200", "--gpus", "2"], "cluster gh200-nodes has one device per node"),
                      (["--nodes", "2", "--no-working-copy"], "2 nodes need the bf16 working copy"),
                      (["--gpus", "2", "--cluster", "nvlink"], "unknown cluster 'nvlink'")):
        assert main(["plan", *argv]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err


def test_the_executor_refuses_a_schedule_for_another_layout():
    """A Schedule built for 2 devices is one rank's step of a 2-rank run: a process that is not
    part of such a run refuses it (tests/test_dist_exec.py runs it on 2 ranks)."""
    pytest.importorskip("torch")
    from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    pol = Policy(batch=1, seq=16)
    with pytest.raises(HorizonError, match=r"one rank's step of 1 node\(s\) x 2 device\(s\); this run has 1 node\(s\) x 1 device\(s\)"):
        Trainer(SPEC, pol, TrainerConfig(admission=AdmissionConfig(enabled=False)),
                schedule=build_schedule(SPEC, pol, Layout(2)))


def test_search_verbs_take_the_layout(capsys):
    """min-ram on 2 nodes x 2 devices answers per node, and plan agrees that it fits there."""
    assert main(["min-ram", "--model", "qwen2.5-0.5b", "--gpu", "h100-sxm", "--gpus", "2", "--nodes", "2",
                 "--json"]) == 0
    ram = json.loads(capsys.readouterr().out)["ram_bytes"]
    assert main(["plan", "--model", "qwen2.5-0.5b", "--gpu", "h100-sxm", "--gpus", "2", "--nodes", "2",
                 "--ram", str(ram), "--json", "--no-advice"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True


def test_the_search_cache_tells_layouts_apart():
    from horizon_sim.plan.runner import Runner
    pol = Policy(batch=2, seq=64)
    with Runner(1) as runner:
        one = runner.one(SPEC, _hw(1, 1), pol)
        four = runner.one(SPEC, _hw(2, 2), pol)
    assert four.host_bytes != one.host_bytes and four.tokens_per_s > one.tokens_per_s


def test_sweep_grids_take_layouts():
    from horizon_sim.plan.plan import plan
    from horizon_sim.plan.grid import parse_grid
    from horizon_sim.plan.sweep import sweep
    grid = parse_grid({"models": ["qwen2.5-0.5b"], "gpus": ["h100-sxm"], "ram": ["64GiB"], "gpus_per_node": [1, 2],
                       "nodes": [1, 2], "policy": {"batch": [2], "seq": [256]}})
    assert grid.layouts == ((1, 1), (1, 2), (2, 1), (2, 2)) and len(grid) == 4
    df = sweep(grid, workers=1)
    assert sorted(zip(df.devices_per_node, df.nodes)) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    row = df[(df.devices_per_node == 2) & (df.nodes == 2)].iloc[0]
    r = plan("qwen2.5-0.5b", make_hardware("h100-sxm", "64GiB", layout=Layout(2, 2)), Policy(batch=2, seq=256))
    assert row.tokens_per_s == pytest.approx(r.summary.tokens_per_s) and row.host_bytes == r.summary.host_bytes
    with pytest.raises(HorizonError, match="gh200 with gpus_per_node 2, nodes 1: cluster gh200-nodes"):
        parse_grid({"models": ["tiny"], "gpus": ["gh200"], "ram": ["1TB"], "gpus_per_node": [2]})
    with pytest.raises(HorizonError, match="nodes value 0 must be a whole number from 1 to 4096"):
        parse_grid({"models": ["tiny"], "gpus": ["h200"], "ram": ["1TB"], "nodes": [0]})


def test_gpus_on_a_calibrated_cpu_file_share_its_cores():
    """`horizon plan --hardware machine.toml --gpus 2` on a CPU-backend file: two processes share
    the machine's cores (specs/cpu_ranks.py), which benchmarks/scaling.py checks against runs;
    a GPU file keeps its own cluster."""
    import argparse

    from horizon_sim.cli.hardware_args import with_cluster
    from tests.cpu_machine import CPU_HW
    hw = with_cluster(CPU_HW, argparse.Namespace(gpus=2, nodes=None, cluster=None))
    assert (hw.cluster.layout.devices_per_node, hw.host.compute_contention, hw.host.lane_cores) == (2, 1.0, 1.0)
    assert hw.host.adam_Gparams_per_s == 2 * CPU_HW.host.adam_Gparams_per_s
    gpu = with_cluster(_hw(1, 1), argparse.Namespace(gpus=2, nodes=None, cluster=None))
    assert gpu.host == _hw(1, 1).host
