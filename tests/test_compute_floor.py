"""benchmarks/compute_floor.py: the least GEMM and attention work of a step, which bounds the
ratio exec_vs_autograd.py can show. It must not depend on the policy's memory knobs (a
recompute is not part of the least work), must lie under every planned step of the same
shape, and must say why where the machine's file cannot price the thread count."""
from dataclasses import replace

import pytest

from benchmarks.compute_floor import compute_floor
from horizon_sim.schedule import build_schedule
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.core_split import split_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import KEEP_ALL, Policy
from tests.cpu_machine import CPU_HW

MODEL = ModelSpec(name="floor", n_layers=4, hidden=256, n_heads=4, n_kv_heads=4, ffn_hidden=688, vocab=512)
HW = replace(CPU_HW, device=replace(CPU_HW.device, compute_threads=1, thread_speed=((1, 1.0, 0.95), (2, 1.8, 0.6))))
KEEP = Policy(batch=4, seq=256, compute_dtype="fp32", working_copy=False, keep_last=KEEP_ALL)
RECOMPUTE = replace(KEEP, keep_last=0, act_ckpt_every=2, micro_batches=2)


def test_the_floor_is_the_same_whatever_the_policy_recomputes():
    keep, recompute = compute_floor(MODEL, KEEP, HW, 2), compute_floor(MODEL, RECOMPUTE, HW, 2)
    assert keep.why == "" and keep.seconds > 0
    assert recompute.seconds == pytest.approx(keep.seconds)


@pytest.mark.parametrize("policy", [KEEP, RECOMPUTE], ids=["keep-all", "recompute"])
def test_every_planned_step_is_above_its_floor(policy):
    planned = simulate(build_schedule(MODEL, policy), split_hardware(HW, 2)).summary.step_time_s
    assert compute_floor(MODEL, policy, HW, 2).seconds < planned


def test_more_threads_lower_the_floor_by_the_files_scaling_exactly():
    """No fixed cost is in the floor, so it scales by the file's 2-thread speed (1.8x)."""
    one, two = compute_floor(MODEL, KEEP, HW, 1), compute_floor(MODEL, KEEP, HW, 2)
    assert one.seconds / two.seconds == pytest.approx(1.8)


def test_a_thread_count_the_file_does_not_price_says_why():
    floor = compute_floor(MODEL, KEEP, HW, 3)
    assert floor.seconds == 0.0 and "compute threads 3" in floor.why
