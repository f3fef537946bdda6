"""Admission control (issue 7): before allocating anything the executor asks the planner what
the run needs and refuses, with needed vs available, the breakdown by role and what to change,
when it does not fit; `--no-admission` / AdmissionConfig(enabled=False) skips the check."""
import argparse

from dataclasses import replace

import pytest
import torch

import horizon_exec.runtime.assemble as assemble_mod
from horizon_exec.procfs import mem_available_bytes
from horizon_exec.runtime.admission import AdmissionError, admit, store_padding_bytes
from horizon_exec.errors import DeviceBudgetError
from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.cli.policy_args import add_policy_args, policy_from_args
from horizon_sim.schedule import build_schedule
from horizon_sim.schedule.op import Holds, Space
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

SPEC = ModelSpec(n_layers=4, hidden=128, n_heads=4, n_kv_heads=2, ffn_hidden=256, vocab=256)
POL = Policy(batch=2, seq=32, optimizer="pipelined")
HOST_ROLES = ("master", "moments", "working_copy", "grads", "staging", "act_checkpoints", "scalars", "runtime")


pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _no_allocation(monkeypatch):
    """Make any allocation of the trainer fail loudly: admission must refuse before it."""
    def boom(*a, **k):
        raise AssertionError("allocated before admission refused")
    monkeypatch.setattr(assemble_mod, "make_backend", boom)
    monkeypatch.setattr(assemble_mod, "HostStore", boom)


def test_host_budget_below_the_need_is_refused_before_allocating(monkeypatch):
    need = admit(SPEC, POL, build_schedule(SPEC, POL)).host_need_bytes
    _no_allocation(monkeypatch)
    with pytest.raises(AdmissionError) as e:
        Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(host_budget_bytes=need // 2)))
    adm, msg = e.value.admission, str(e.value)
    first = msg.splitlines()[0]
    assert first.startswith("the run does not fit in host RAM: host RAM needs ")
    assert "available (host budget), short by" in first
    assert adm.host_available_bytes == need // 2 and adm.host_need_bytes > adm.host_available_bytes
    assert not adm.host_fits and adm.device_fits  # CPU backend: no separate device limit
    # the breakdown by role, then what to change
    assert all(r in adm.host_by_role for r in HOST_ROLES)
    for word in ("master", "moments", "working copy", "grads", "runtime", "device on cpu backend"):
        assert word in msg
    assert "to change:" in msg and "--host-budget" in msg and "--no-admission" in msg
    assert not isinstance(e.value, DeviceBudgetError)


def test_device_budget_below_the_need_is_refused(monkeypatch):
    sched = build_schedule(SPEC, POL)
    need = admit(SPEC, POL, sched).device_need_bytes
    _no_allocation(monkeypatch)
    with pytest.raises(AdmissionError) as e:
        Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(device_budget_bytes=need - 1)))
    assert isinstance(e.value, DeviceBudgetError)  # what the arena would have raised, only later
    adm = e.value.admission
    assert not adm.device_fits and adm.device_available_bytes == need - 1
    assert "device memory needs" in str(e.value).splitlines()[0]
    # the device breakdown: weight slots, the activation/gradient/workspace peak, constants
    slots = [b for b in sched.buffers.values() if b.holds == Holds.WEIGHT_SLOT]
    assert adm.device_by_role["weights"] == POL.slots * sched.meta.slot_bytes == sum(b.bytes for b in slots)
    # the constants: RoPE tables (seq x head_dim, bf16) and the step's labels (batch x seq, int64)
    assert adm.device_by_role["constants"] == 2 * POL.seq * SPEC.hd * 2 + POL.batch * POL.seq * 8
    assert adm.device_by_role["constants"] + adm.device_by_role["weights"] == sched.static_bytes(Space.DEVICE)


def test_the_advice_names_a_policy_that_then_fits():
    """Short by less than the working copy: the nearest fit splits the master (it saves what
    dropping the copy would, and keeps the bf16 link), and that policy is admitted; where the
    native kernels cannot run, the copy is dropped instead. The model is large enough (7M params,
    a 14 MB copy) that the margin dwarfs the drift of the process's measured runtime footprint
    between the calls (with 0.7M params it did not: the test failed when run alone)."""
    from horizon_exec.optim import native
    spec = ModelSpec(n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=512, vocab=8192)
    whole = replace(POL, split_master=False)  # the whole fp32 master (the default splits it)
    sched = build_schedule(spec, whole)
    adm = admit(spec, whole, sched, host_budget_bytes=2**40)
    budget = adm.host_need_bytes - adm.host_by_role["working_copy"] // 2
    with pytest.raises(AdmissionError) as e:
        admit(spec, whole, sched, host_budget_bytes=budget)
    advice = e.value.admission.advice
    if native.kernels() is not None:
        assert advice[0].startswith("nearest policy that fits (split master): --master-dtype split"), advice
        split = Policy(batch=2, seq=32, optimizer="pipelined", split_master=True)
        assert admit(spec, split, build_schedule(spec, split), host_budget_bytes=budget).fits
    else:
        assert advice[0].startswith("nearest policy that fits (no working copy): --no-working-copy"), advice
    lean = Policy(batch=2, seq=32, optimizer="pipelined", working_copy=False)
    assert admit(spec, lean, build_schedule(spec, lean), host_budget_bytes=budget).fits


def test_bf16_moments_are_advised_only_where_they_can_run():
    """Short by a third of the moments (8/3 bytes per parameter): more than the moves that
    leave training as it is can save (the working copy is 2), less than bf16 moments do (4).
    The nearest fit takes bf16 moments (runnable with the native AdamW kernel) and that policy
    is admitted; without the kernel they are never advised. The model is large enough (7M
    params) that these savings dwarf the drift of the process's measured runtime footprint."""
    from horizon_exec.optim import native
    if native.adamw() is None:
        pytest.skip(native.status())
    spec = ModelSpec(n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=512, vocab=8192)
    sched = build_schedule(spec, POL)
    adm = admit(spec, POL, sched, host_budget_bytes=2**40)
    budget = adm.host_need_bytes - adm.host_by_role["moments"] // 3
    with pytest.raises(AdmissionError) as e:
        admit(spec, POL, sched, host_budget_bytes=budget)
    first = e.value.admission.advice[0]
    assert first.startswith("nearest policy that fits (") and "bf16 moments" in first, first
    parser = argparse.ArgumentParser()
    add_policy_args(parser, defaults=POL)
    lean = policy_from_args(parser.parse_args(first.split(": ", 1)[1].split(" (host")[0].split()))
    assert lean.states_dtype == "bf16" and lean.optimizer == POL.optimizer  # one lossy change only
    assert admit(spec, lean, build_schedule(spec, lean), host_budget_bytes=budget).fits
    with native.use(None, "unavailable: building adamw.c with 'cc' failed: no cc"):
        # the budget again from this moment's need: the process's measured runtime footprint moves
        # between admissions (a worker that ran other tests before may hand pages back meanwhile)
        again = admit(spec, POL, sched, host_budget_bytes=2**40)
        with pytest.raises(AdmissionError) as e:
            admit(spec, POL, sched, host_budget_bytes=again.host_need_bytes - again.host_by_role["moments"] // 3)
    assert not any("bf16 moments" in line for line in e.value.admission.advice)


def test_what_fits_is_admitted_and_the_breakdown_matches_the_store():
    with Trainer(SPEC, POL) as tr:
        adm = tr.admission
        assert adm.fits and adm.host_source.startswith("MemAvailable")
        assert adm.host_available_bytes >= mem_available_bytes()
        # the static roles + page padding are exactly the host store the trainer allocated
        static = sum(adm.host_by_role[r] for r in ("master", "moments", "working_copy", "grads", "scalars"))
        assert static + store_padding_bytes(tr.sched) == tr.store.nbytes
        assert adm.host_by_role["master"] == 2 * SPEC.total_params  # the default split master's low halves
        # the measured device peak is close to the admitted need (both depend on how the lanes'
        # timing overlaps: the planner orders events by preset speeds, not this machine's)
        res = tr.step(torch.randint(0, SPEC.vocab, (POL.batch, POL.seq)))
        assert res.device_peak_bytes <= 1.1 * adm.device_need_bytes
        assert adm.host_by_role["device_on_cpu_backend"] == adm.device_need_bytes


def test_admission_false_skips_the_check():
    with Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(host_budget_bytes=1, enabled=False))) as tr:
        assert tr.admission is None
        tr.step(torch.randint(0, SPEC.vocab, (POL.batch, POL.seq)))


def test_horizon_train_host_budget_exits_2_and_no_admission_runs(capsys):
    argv = ["train", "--model", "tiny", "--steps", "1", "--batch", "2", "--seq", "32", "--no-progress",
            "--eval-batches", "0"]
    assert main(argv + ["--host-budget", "64MiB"]) == 2
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("horizon train: error: the run does not fit in host RAM: host RAM needs")
    assert "of 64.0 MiB available (host budget), short by" in first
    assert "  host:   master" in err and "to change:" in err
    assert main(argv + ["--host-budget", "64MiB", "--no-admission"]) == 0
    assert "final loss" in capsys.readouterr().out
    assert main(argv) == 0
    assert "admission: fits: host RAM needs" in capsys.readouterr().out
