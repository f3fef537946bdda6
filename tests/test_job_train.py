"""Issue 39, item 2: `horizon train --job JOB.toml [flags]` trains the job a planner command saved:
the tuned Schedule itself (its digest equal to the job's, printed), every flag given overriding
its field (named when it changes the Schedule), this machine compared with the job's
(--on-other-machine replan, refuse, run), and the arguments a data-parallel launcher hands its
ranks carrying the merged job, not the job again."""
import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from horizon_exec.cli.job_machine import host_ram_GiB
from horizon_exec.cli.job_run import EXPLICIT, apply_job
from horizon_exec.cli.launch_flags import worker_args
from horizon_exec.cli.train_cmd import configure_train_parser
from horizon_sim.cli.main import main
from horizon_sim.cli.policy_args import policy_from_args
from horizon_sim.job.digest import short
from horizon_sim.job.toml import read_job, write_job
from horizon_sim.specs.hardware_io import save_hardware
from tests.cpu_machine import CPU_HW
from tests.test_job_file import _job

ROOT = Path(__file__).resolve().parents[1]
RUN = ["--no-progress", "--eval-batches", "0"]
HERE = replace(CPU_HW, host=replace(CPU_HW.host, ram_GiB=host_ram_GiB(), cores=os.cpu_count()),
               device=replace(CPU_HW.device, hbm_GiB=host_ram_GiB()))
"""CPU_HW with this machine's RAM and cores: the job's machine is this one."""


def horizon(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "horizon_sim.cli.main", *map(str, args)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """`horizon tune --save-job` on a CPU hardware file (not this machine: 16 GiB of RAM)."""
    d = tmp_path_factory.mktemp("job")
    save_hardware(CPU_HW, d / "machine.toml")
    out = horizon("tune", "--model", "tiny", "--hardware", d / "machine.toml", "--max-batch", "4", "--seq", "128",
                  "--workers", "1", "--quiet", "--save-job", d / "tuned.toml")
    assert out.returncode == 0, out.stderr
    assert f"train it: horizon train --job {d / 'tuned.toml'}" in out.stdout
    return d / "tuned.toml"


def test_tune_then_train_runs_the_tuned_schedule(tuned):
    job = read_job(tuned)
    out = horizon("train", "--job", tuned, "--steps", "3", *RUN)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1] == job.planned_line  # "plan: step X s, Y tokens/s, device peak ..., host ..."
    assert f"schedule {short(job.prediction.schedule_digest)}: as planned" in lines
    assert "overrides: --steps 3 (the job's: 10), --eval-batches 0 (the job's: 4)" in lines
    # not the job's machine (16 GiB): planned again for this one, the Schedule unchanged
    assert any(line.startswith("machine: this one differs from the job's: host RAM") for line in lines)
    assert "machine: --on-other-machine replan: the job's policy is planned on this machine's description" in out.stdout
    assert not any("(--hardware " in line for line in lines)  # the run's own plan is not on the job's machine
    assert any(line.startswith("final loss") for line in lines)


def test_an_override_changes_the_schedule_and_the_run_names_it(tuned):
    out = horizon("train", "--job", tuned, "--steps", "1", "--batch", "8", *RUN)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("schedule "))
    assert f"not as planned (the job's {short(read_job(tuned).prediction.schedule_digest)})" in line
    assert line.endswith("changed by --batch: policy batch 8 (the job's: 4)"), line


def test_on_the_jobs_own_machine_it_runs_on_the_jobs_hardware(tmp_path):
    from horizon_sim.specs.policy import Policy
    path = tmp_path / "here.toml"
    write_job(_job(HERE, Policy(batch=2, seq=64)), path)
    out = horizon("train", "--job", path, "--steps", "1", *RUN)
    assert out.returncode == 0, out.stderr
    assert "machine:" not in out.stdout  # nothing differs
    assert "as planned" in out.stdout
    assert "MFU against cpu-core bf16 peak 0.2 TFLOP/s" in out.stdout  # the job's [hardware] is the run's:
    assert f"(--hardware {path})" in out.stdout  # its own plan line is on that machine too


def test_another_machine_is_refused_when_asked(tuned, capsys):
    assert main(["train", "--job", str(tuned), "--on-other-machine", "refuse"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"horizon train: error: --job {tuned}: this machine is not the job's: host RAM")
    assert main(["train", "--model", "tiny", "--on-other-machine", "run"]) == 2  # no job to run
    assert "give --job" in capsys.readouterr().err


def _parsed(*argv) -> argparse.Namespace:
    return configure_train_parser(argparse.ArgumentParser()).parse_args(list(map(str, argv)))


def test_a_flag_given_at_its_default_still_overrides_and_implied_fields_follow(tmp_path):
    from horizon_sim.specs.policy import Policy
    path = tmp_path / "j.toml"
    write_job(_job(HERE, Policy(batch=2, seq=64, grad_clip=1.0)), path)
    a = _parsed("--job", path, "--batch", "4", "--optimizer", "backward")  # 4 is train's default batch
    run = apply_job(a)
    p = policy_from_args(a)
    assert (p.batch, p.seq, p.optimizer) == (4, 64, "backward")
    assert p.grad_clip == 0.0  # the job's clip was its optimizer's default: backward's follows
    assert run.implied == {"grad_clip": "--optimizer"}
    assert run.overrides == ["--batch 4 (the job's: 2)", "--optimizer backward (the job's: pipelined)"]


def test_the_ranks_of_a_launch_get_the_merged_job_not_the_job_again(tmp_path):
    path = tmp_path / "j.toml"
    write_job(_job(HERE), path)
    a = _parsed("--job", path, "--batch", "8")
    apply_job(a)
    assert getattr(a, EXPLICIT) == {"job": "--job", "batch": "--batch"}
    rank = argparse.Namespace(**json.loads(worker_args(a)))  # what dist/launch.py hands each rank
    assert not hasattr(rank, EXPLICIT) and rank.job_applied and rank.batch == 8 and rank.seq == 128
    assert apply_job(rank) is None  # merged once, by the launcher


def test_a_data_parallel_job_launches_its_ranks_on_the_planned_schedule(tmp_path):
    """A job planned for 2 devices launches 2 ranks (CPU ranks over gloo), which run the merged
    arguments: the Schedule the launcher checked is the job's."""
    save_hardware(CPU_HW, tmp_path / "machine.toml")
    plan = horizon("plan", "--model", ROOT / "tests" / "micro_model.json", "--hardware", tmp_path / "machine.toml",
                   "--gpus", "2", "--batch", "2", "--seq", "32", "--no-advice", "--save-job", tmp_path / "dp.toml")
    assert plan.returncode == 0, plan.stderr
    job = read_job(tmp_path / "dp.toml")
    out = horizon("train", "--job", tmp_path / "dp.toml", "--steps", "1", "--oversubscribe", *RUN)
    assert out.returncode == 0, out.stderr
    assert f"schedule {short(job.prediction.schedule_digest)}: as planned" in out.stdout
    assert "2 ranks (1 node(s) x 2 device(s))" in out.stdout
