"""The CPU backend's core split as the planner prices and chooses it (horizon_sim/specs/core_split.py,
horizon_sim/plan/core_split.py): deterministic, from simulated busy fractions, never timing."""
import tomllib
from dataclasses import replace

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.plan.core_split import choose_split, price_split
from horizon_sim.schedule import build_schedule
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.core_split import split_hardware, thread_speeds
from horizon_sim.specs.hardware_io import hardware_from_dict, hardware_to_toml
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.cpu_machine import CPU_HW

MODEL = ModelSpec(name="split", n_layers=4, hidden=256, n_heads=4, n_kv_heads=4, ffn_hidden=688, vocab=512)
# calibrated at 1 compute thread of 2 cores; 2 threads: 1.8x alone, but at the pace of the
# thread sharing a core with a busy lane (0.6x) while one runs
MEASURED = replace(CPU_HW, device=replace(CPU_HW.device, compute_threads=1,
                                          thread_speed=((1, 1.0, 0.95), (2, 1.8, 0.6))))


def _idle_lanes():
    """Compute-heavy: many tokens per parameter, so the lanes (copies, optimizer) idle."""
    return build_schedule(MODEL, Policy(batch=8, seq=512))


def _busy_lanes():
    """Lane-heavy: few tokens and a slow optimizer, so the lanes run most of the step."""
    return build_schedule(MODEL, Policy(batch=1, seq=16)), replace(
        MEASURED, host=replace(MEASURED.host, adam_Gparams_per_s=0.002))


def test_idle_lanes_lend_their_core_to_compute():
    split = choose_split(_idle_lanes(), MEASURED)
    assert split.compute_threads == 2 and split.cores == 2 and split.measured
    one, two = split.prices
    assert one.lane_cores_busy < 0.3 and two.step_s < one.step_s


def test_busy_lanes_keep_their_core():
    sched, hw = _busy_lanes()
    split = choose_split(sched, hw)
    assert split.compute_threads == 1
    assert split.prices[0].lane_cores_busy > 0.5
    assert "lanes on the rest" in split.line()


def test_the_predicted_step_uses_the_splits_rates():
    """Compute-bound step: 2 threads' predicted step is the 1-thread one sped up by about 1.8
    (the per-op fixed costs do not scale); the split's spec is what simulate prices."""
    sched = _idle_lanes()
    one, two = (price_split(sched, MEASURED, t) for t in (1, 2))
    assert 1.3 < one.step_s / two.step_s <= 1.8
    assert simulate(sched, split_hardware(MEASURED, 2)).summary.step_time_s == pytest.approx(two.step_s)
    hw2 = split_hardware(MEASURED, 2)
    assert hw2.device.bf16_TFLOPs == pytest.approx(1.8 * MEASURED.device.bf16_TFLOPs)
    assert hw2.host.compute_contention == pytest.approx(1.8 / 0.6 - 1)
    assert hw2.host.lane_cores == pytest.approx(2 / 3)  # one lane thread among 2 busy compute threads
    hw1 = split_hardware(MEASURED, 1)
    assert hw1.device.bf16_TFLOPs == MEASURED.device.bf16_TFLOPs and hw1.host.lane_cores == 1


def test_each_kernel_kind_scales_by_its_own_row():
    """With thread_kernel_speed, a split scales GEMM, attention and elementwise/loss rates each by
    its own figure against the file's own split (not the block's ALONE, which holds dispatch
    that threads do not shorten); the block's SHARED still sets the contention."""
    hw = replace(MEASURED, device=replace(MEASURED.device, attention_TFLOPs=(("bf16", 512, 64, 0.5, 0.25),),
                                          loss_ns_per_logit=2.0,
                                          thread_kernel_speed=((1, 1.0, 1.0, 1.0), (2, 1.9, 1.95, 2.2))))
    d1, d2 = hw.device, split_hardware(hw, 2).device
    assert d2.bf16_TFLOPs == pytest.approx(1.9 * d1.bf16_TFLOPs)
    assert [r[5] for r in d2.gemm_TFLOPs] == pytest.approx([1.9 * r[5] for r in d1.gemm_TFLOPs])
    assert d2.attention_TFLOPs[0][3:] == pytest.approx((1.95 * 0.5, 1.95 * 0.25))
    assert d2.elementwise_GBps == pytest.approx(2.2 * d1.elementwise_GBps)
    assert d2.loss_ns_per_logit == pytest.approx(2.0 / 2.2)
    assert split_hardware(hw, 2).host.compute_contention == pytest.approx(1.8 / 0.6 - 1)
    assert split_hardware(hw, 1).device.gemm_TFLOPs == d1.gemm_TFLOPs
    # and so a compute-bound step gains more than the block's 1.8x said
    sched = _idle_lanes()
    assert price_split(sched, hw, 2).step_s < price_split(sched, MEASURED, 2).step_s
    assert hardware_from_dict(tomllib.loads(hardware_to_toml(hw))) == hw
    with pytest.raises(HorizonError, match="thread_kernel_speed: row .* must have 4 cells"):
        replace(hw.device, thread_kernel_speed=((2, 1.9, 1.95),))


def test_old_files_get_estimated_scaling():
    """A file without thread_speed (calibrated before it) still reads and prices 1..cores."""
    speeds = thread_speeds(CPU_HW)
    assert sorted(speeds) == [1, 2] and not speeds[2].measured
    assert speeds[2].alone == 2.0 and speeds[2].shared == 1.0
    assert not choose_split(_idle_lanes(), CPU_HW).measured


def test_unpriced_thread_count_is_refused():
    with pytest.raises(HorizonError, match="compute threads 3: the hardware file prices 1, 2"):
        split_hardware(MEASURED, 3)


def test_thread_speed_round_trips_and_is_checked():
    assert hardware_from_dict(tomllib.loads(hardware_to_toml(MEASURED))) == MEASURED
    with pytest.raises(HorizonError, match="thread_speed: THREADS=0"):
        replace(MEASURED.device, thread_speed=((0, 1.0, 1.0),))
    with pytest.raises(HorizonError, match="compute_threads=-1 must be a whole number"):
        replace(MEASURED.device, compute_threads=-1)


def _plan_json(capsys, tmp_path, hw, *extra):
    import json

    from horizon_sim.cli.main import main
    path = tmp_path / "machine.toml"
    path.write_text(hardware_to_toml(hw))
    assert main(["plan", "--hardware", str(path), "--model", "tiny", "--batch", "8", "--seq", "512",
                 "--no-advice", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_prices_the_split_train_would_run(capsys, tmp_path):
    """`horizon plan` on a calibrated CPU file predicts the step at the split `horizon train`'s
    default (auto) runs, and at a given count when asked: the same figures choose_split priced."""
    auto = _plan_json(capsys, tmp_path, MEASURED)
    by_threads = auto["core_split"]["step_s_by_threads"]
    assert auto["core_split"]["compute_threads"] == 2 and auto["core_split"]["measured"]
    assert auto["step_time_s"] == pytest.approx(by_threads["2"]) and by_threads["1"] > by_threads["2"]
    one = _plan_json(capsys, tmp_path, MEASURED, "--compute-threads", "1")
    assert one["core_split"]["compute_threads"] == 1 and one["step_time_s"] == pytest.approx(by_threads["1"])


def test_plan_refuses_a_split_it_cannot_price(capsys, tmp_path):
    from horizon_sim.cli.main import main
    path = tmp_path / "machine.toml"
    path.write_text(hardware_to_toml(MEASURED))
    assert main(["plan", "--hardware", str(path), "--model", "tiny", "--compute-threads", "3"]) == 2
    assert "compute threads 3: the hardware file prices 1, 2" in capsys.readouterr().err
    assert main(["plan", "--model", "tiny", "--compute-threads", "2"]) == 2  # a GPU preset: no cores to split
    assert "only a CPU-backend hardware file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse's own exit for a malformed value
        main(["plan", "--hardware", str(path), "--model", "tiny", "--compute-threads", "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "'0': use 'auto'" in err and "Traceback" not in err
