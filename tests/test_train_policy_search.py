"""Issue 39, item 4 (the policy half): `horizon train` without policy flags trains the planner's
choice, the policy `horizon tune` ranks first for the same model, batch, sequence and machine;
each policy flag given pins its knob in both; --no-search keeps Policy's defaults; a resumed run
keeps its checkpoint's policy; on the CPU backend the planner counts the device in host RAM."""
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from horizon_exec.checkpoints.ckpt import recorded_policy
from horizon_sim.plan.outcome import Outcome
from horizon_sim.plan.pinned import KNOB_DESTS, pinned_space
from horizon_sim.plan.runner import Runner
from horizon_sim.plan.tune import tune
from horizon_sim.specs.hardware_io import save_hardware
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import Policy
from tests.cpu_machine import CPU_HW

ROOT = Path(__file__).resolve().parents[1]
SHAPE = ["--model", "tiny", "--batch", "4", "--seq", "128", "--compute-dtype", "bf16"]
MICRO = ["--model", ROOT / "tests" / "micro_model.json", "--batch", "2", "--seq", "32", "--compute-dtype", "bf16"]
"""One layer, hidden 64: where what is tested is not what the search picks, the fastest runs."""


def horizon(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "horizon_sim.cli.main", *map(str, args)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=timeout)


def _native():
    from horizon_exec.optim import native
    if native.adamw() is None:  # the split master (train's default) needs it; tune would still pick it
        pytest.skip("no native AdamW kernel here: train's default master differs from tune's")


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    path = tmp_path_factory.mktemp("hw") / "cpu.toml"
    save_hardware(CPU_HW, path)
    return path


def _trained(tmp_path, machine, *flags, steps=1, shape=SHAPE) -> tuple[subprocess.CompletedProcess, Policy]:
    out = horizon("train", *shape, "--hardware", machine, "--steps", steps, "--no-progress", "--eval-batches", "0",
                  "--ckpt-dir", tmp_path / "ckpt", *flags)
    assert out.returncode == 0, out.stderr
    return out, Policy.from_dict(recorded_policy(tmp_path / "ckpt"))


def test_train_without_policy_flags_trains_tunes_best_row(tmp_path, machine):
    """The policy the run trained (its checkpoint's record) is tune's best_policy, field for field."""
    _native()
    out, trained = _trained(tmp_path, machine)
    tuned = horizon("tune", *SHAPE, "--hardware", machine, "--workers", "1", "--quiet", "--json")
    assert tuned.returncode == 0, tuned.stderr
    best = Policy.from_dict(json.loads(tuned.stdout)["best_policy"])
    assert trained == best
    line = next(x for x in out.stdout.splitlines() if x.startswith("policy: the planner's choice"))
    assert "pinned by" not in line
    assert best != replace(Policy(batch=4, seq=128), split_master=True)  # the search changed something here
    said = out.stdout.split("policy: predicted", 1)[1].splitlines()[0]
    assert "tokens/s" in said
    # the search ranks on the file's own split; what it says is the step at the split the run
    # takes, the figure its plan line (and its closing comparison) predicts
    import re
    step_ms = re.search(r"([\d.]+) ms a step on (\d+) compute thread", said)
    assert step_ms and f"plan: step {step_ms.group(1)} ms" in out.stdout
    assert f"compute on {step_ms.group(2)} of" in out.stdout


def test_flags_given_pin_their_knobs_and_the_search_covers_the_rest(tmp_path, machine):
    """--act-ckpt-every 2 --optimizer after: the run keeps both, says they pinned it, and still
    searches the rest (tiny keeps the activations of its last layers: the defaults keep none)."""
    _native()
    out, trained = _trained(tmp_path, machine, "--act-ckpt-every", "2", "--optimizer", "after")
    assert (trained.act_ckpt_every, trained.optimizer) == (2, "after")
    assert "pinned by --act-ckpt-every, --optimizer" in out.stdout
    assert trained.keep_last != 0


def test_no_search_trains_the_listed_defaults(tmp_path, machine):
    out, trained = _trained(tmp_path, machine, "--no-search", shape=MICRO)
    assert "policy: the planner's choice" not in out.stdout
    from horizon_exec.model.xent import default_loss_kernel  # the machine's: fused where the native kernel builds
    d = Policy.from_choices(batch=2, seq=32, compute_dtype="bf16", master=trained.master_choice,
                            loss_kernel=default_loss_kernel("cpu"))
    assert trained == d


def test_a_resumed_run_keeps_its_checkpoints_policy(tmp_path, machine):
    """The same command line plus --resume, without the flags the first run pinned: the run
    takes the checkpoint's policy (the search's own choice would be refused by the resume)."""
    first, trained = _trained(tmp_path, machine, "--slots", "3", "--act-ckpt-on", "device", steps=2, shape=MICRO)
    out = horizon("train", *MICRO, "--hardware", machine, "--steps", 3, "--no-progress", "--eval-batches", "0",
                  "--ckpt-dir", tmp_path / "ckpt", "--resume")
    assert out.returncode == 0, out.stderr
    assert "policy: the checkpoint's" in out.stdout and "resumed from" in out.stdout
    assert Policy.from_dict(recorded_policy(tmp_path / "ckpt")) == trained
    from horizon_sim.specs.hf_config import load_model
    model = load_model(str(ROOT / "tests" / "micro_model.json"))
    base = replace(trained, slots=2, act_ckpt_on="host")
    with Runner(workers=1) as r:  # what a fresh run's search picks is not the checkpoint's policy
        fresh = tune(model, CPU_HW, 32, base=base, space=pinned_space(base, {}, n_layers=1, batch=2), runner=r).best
    assert fresh != trained


@pytest.mark.parametrize("knob,value", [("micro_batches", 2), ("act_ckpt_every", 4), ("keep_last", 2),
                                        ("slots", 3), ("act_ckpt_on", "device"), ("optimizer", "after"),
                                        ("working_copy", False), ("split_master", False), ("mb_order", "layer")])
def test_each_pinned_knob_keeps_its_value_in_tunes_best(knob, value):
    """Each knob's flag pins it: tune's best has the pinned value whatever the search prefers."""
    model = model_preset("tiny")
    fields = {knob: value}
    if knob == "working_copy":
        fields["split_master"] = False  # no copy, no split (Policy.from_choices makes that choice)
    if knob == "mb_order":
        fields["micro_batches"] = 2
    base = replace(Policy(batch=4, seq=128), **fields)
    given = {KNOB_DESTS[knob]} | ({"micro_batches"} if knob == "mb_order" else set())
    space = pinned_space(base, given, n_layers=model.n_layers, batch=4)
    with Runner(workers=1) as r:
        best = tune(model, CPU_HW, 128, base=base, space=space, runner=r).best
    assert getattr(best, knob) == value, best


def test_a_pinned_bound_on_host_grads_holds_with_the_backward_optimizer():
    model = model_preset("tiny")
    base = Policy(batch=4, seq=128, optimizer="backward", grad_clip=0.0, max_host_grads=2)
    space = pinned_space(base, {"max_host_grads", "optimizer"}, n_layers=model.n_layers, batch=4)
    assert space.max_host_grads == (2,) and space.micro_batches == (1,)
    with Runner(workers=1) as r:
        best = tune(model, CPU_HW, 128, base=base, space=space, runner=r).best
    assert (best.max_host_grads, best.optimizer, best.micro_batches) == (2, "backward", 1)


def test_on_the_cpu_backend_the_device_is_host_ram():
    """A policy whose host footprint fits the RAM alone, but not with its device peak, which on
    the CPU backend is host RAM too, does not fit there; on a GPU machine it does."""
    gib = 2**30
    o = Outcome(tokens_per_s=1.0, step_time_s=1.0, device_peak_bytes=6 * gib, host_bytes=12 * gib)
    assert not o.fits(CPU_HW)  # 16 GiB of RAM: 12 + 6 does not fit
    gpu = replace(CPU_HW, device=replace(CPU_HW.device, name="h100"))
    assert o.fits(gpu)


def test_a_gpu_launch_of_several_ranks_plans_without_asking_cuda(monkeypatch):
    """The launcher of a data-parallel GPU run must not create a CUDA context (it would hold
    device memory while its ranks train): the device memory is the description's. One process
    asks CUDA for what is free, as its admission does."""
    import horizon_exec.runtime.admission as adm
    from horizon_exec.train.policy_search import plan_policy
    from horizon_sim.specs.hardware_presets import make_hardware
    from horizon_sim.specs.layout import Layout

    asked = []
    monkeypatch.setattr(adm, "cuda_free_bytes", lambda device: asked.append(device) or 40 * 2**30)
    hw = make_hardware("h100-pcie", "512GiB")
    model, base = model_preset("tiny"), Policy(batch=4, seq=128)
    two = plan_policy(model, base, set(), hw, device="cuda", layout=Layout(2))
    assert not asked and two.policy is not None
    assert two.hardware.device.hbm_GiB == pytest.approx(hw.device_bytes_usable / 2**30)
    one = plan_policy(model, base, set(), hw, device="cuda", layout=Layout(1))
    assert asked == ["cuda"] and one.hardware.device.hbm_GiB == pytest.approx(40)
