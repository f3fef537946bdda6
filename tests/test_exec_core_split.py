"""The executor's side of the core split (horizon_exec/device/core_split.py): --compute-threads
auto|N resolved from the planner's choice, the thread count each lane really runs with, and
training that does not depend on the split in fp32."""
import os
import subprocess
import sys
import threading

import pytest
import torch

from horizon_exec.device.core_split import AUTO, CPU_ESTIMATE, pricing_hardware, resolve_compute_threads, threads_arg
from horizon_exec.device.cpu import CpuBackend
from horizon_exec.errors import ConfigError
from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import Lane, build_schedule
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.test_core_split import MEASURED, _busy_lanes, _idle_lanes

TINY = ModelSpec(name="tiny-split", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=128)
CORES = len(os.sched_getaffinity(0))


def test_auto_follows_the_planners_split():
    assert resolve_compute_threads(AUTO, _idle_lanes(), MEASURED, 2)[0] == 2
    sched, hw = _busy_lanes()
    threads, why = resolve_compute_threads(AUTO, sched, hw, 2)
    assert threads == 1 and why.startswith("auto: compute on 1 of 2 core(s), lanes on the rest")


def test_given_and_fixed_settings_pass_through():
    sched = _idle_lanes()
    assert resolve_compute_threads(3, sched, MEASURED, 4) == (3, "3 (given)")
    assert resolve_compute_threads(None, sched, MEASURED, 2)[0] is None
    assert resolve_compute_threads(AUTO, sched, MEASURED, 2, ranks=2)[0] is None  # a rank's share: cores - 1
    assert resolve_compute_threads(AUTO, sched, MEASURED, 1)[0] is None


def test_another_machines_file_is_priced_on_these_cores():
    hw = pricing_hardware(MEASURED, 4)
    assert hw.host.cores == 4 and not hw.device.thread_speed  # its rows were for 2 cores
    assert pricing_hardware(None, 2).device.bf16_TFLOPs == CPU_ESTIMATE.device.bf16_TFLOPs
    assert pricing_hardware(MEASURED, 2) is MEASURED


@pytest.mark.parametrize("value, words", [("x", "compute_threads='x' must be >= 1 or 'auto'"),
                                          (0, "compute_threads=0 must be >= 1 or 'auto'")])
def test_bad_values_are_refused_in_one_line(value, words):
    with pytest.raises(ConfigError, match=words) as e:
        RuntimeConfig(compute_threads=value)
    assert "\n" not in str(e.value)
    assert threads_arg(" 3 ") == 3 and threads_arg("auto") == AUTO


def test_cli_refuses_a_bad_value_with_exit_2():
    r = subprocess.run([sys.executable, "-m", "horizon_sim.cli.main", "train", "--model", "tiny", "--data", "x",
                        "--compute-threads", "many"], capture_output=True, text=True, cwd=os.getcwd())
    assert r.returncode == 2, r.stderr
    assert "--compute-threads 'many' must be >= 1 or 'auto'" in r.stderr and r.stderr.count("\n") == 1


def test_more_threads_than_cores_is_refused():
    with pytest.raises(HorizonError, match="compute_threads=3 but this process runs on 2 core"):
        CpuBackend(compute_threads=3, cores=[0, 1])


def _lane_threads(tr) -> dict:
    """torch.get_num_threads() in each lane's thread, as its ops saw it."""
    seen, lock = {}, threading.Lock()

    def hook(op):
        with lock:
            seen[op.lane] = torch.get_num_threads()
    tr.engine.hook = hook
    tr.step(torch.randint(0, TINY.vocab, (2, 32)))
    return seen


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores")
@pytest.mark.parametrize("threads", [1, 2])
def test_the_compute_lane_runs_the_threads_it_says(threads):
    cfg = TrainerConfig(runtime=RuntimeConfig(compute_threads=threads), admission=AdmissionConfig(enabled=False))
    with Trainer(TINY, Policy(batch=2, seq=32), cfg) as tr:
        assert tr.backend.compute_threads == threads
        seen = _lane_threads(tr)
    assert seen[Lane.COMPUTE] == threads
    lanes = CORES - threads or 1  # the cores left, or one thread each on compute's
    assert all(n == lanes for lane, n in seen.items() if lane != Lane.COMPUTE), seen


def test_auto_is_the_default_and_says_why():
    with Trainer(TINY, Policy(batch=2, seq=32), TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        want = resolve_compute_threads(AUTO, tr.sched, None, CORES)[0] or max(1, CORES - 1)
        assert tr.backend.compute_threads == want
        assert tr.backend.split_why.startswith("auto: compute on") or CORES < 2


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores")
def test_fp32_training_is_bit_exact_across_splits():
    """fp32 compute and grads: the same weights after two steps with compute on 1 thread (the
    old split) and on 2 (lanes sharing its cores). In bf16 a GEMM's K-split across threads can
    change the rounding, so only fp32 is held to bit equality."""
    pol = Policy(batch=2, seq=32, compute_dtype="fp32", grad_dtype="fp32", working_copy=False)
    toks = [torch.randint(0, TINY.vocab, (2, 32), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    out = {}
    for threads in (1, 2):
        cfg = TrainerConfig(optimizer=OptimizerConfig(lr=1e-2), admission=AdmissionConfig(enabled=False),
                            runtime=RuntimeConfig(compute_threads=threads))
        with Trainer(TINY, pol, cfg) as tr:
            for t in toks:
                tr.step(t)
            out[threads] = {n: v.clone() for n, v in tr.state_dict().items()}
    for n, v in out[1].items():
        assert torch.equal(v, out[2][n]), n


def test_the_driving_thread_runs_its_torch_ops_on_one_thread_while_a_cpu_trainer_lives():
    """libgomp cuts every OpenMP team's spin-wait once the process's team threads outnumber the
    cores, so a team on the thread that drives the trainer made the compute lane's workers sleep
    between kernels (the tiny model's two-thread compute fell from 1.6x one thread's speed to
    ~1.1x): that thread runs its torch ops on one thread from the backend's construction to the
    trainer's close, then has its own count back. Checked in a fresh thread, whose count is its own."""
    got = {}

    def body():
        torch.set_num_threads(2)
        pol = Policy(batch=2, seq=16, optimizer="after")
        with Trainer(TINY, pol, TrainerConfig(runtime=RuntimeConfig(compute_threads=1))) as tr:
            got["built"] = torch.get_num_threads()
            tr.step(torch.randint(0, TINY.vocab, (2, 16)))
            got["stepped"] = torch.get_num_threads()
        got["closed"] = torch.get_num_threads()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert got == {"built": 1, "stepped": 1, "closed": 2}
