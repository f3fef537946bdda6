"""Issue 39, item 1: the job file. `horizon plan|simulate|tune --save-job` writes one TOML file
(docs/job.md) that reads back to equal sections and writes back to the same text; a hand-edited
bad value is one line naming the file and the key (exit 2); the Schedule's digest is the same in
every process; tune prints the `horizon train` line that reproduces its best row. Torch-free."""
import json
import os
import shlex
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from horizon_sim.job.build import job_from_plan, plan_policy
from horizon_sim.job.digest import model_digest, schedule_digest
from horizon_sim.job.sections import DataSection, OptimizerSection, OutputsSection, RunSection
from horizon_sim.job.toml import job_to_toml, read_job, write_job
from horizon_sim.specs.hardware_io import save_hardware
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.specs.layout import Layout
from horizon_sim.specs.policy import Policy
from tests.cpu_machine import CPU_HW

ROOT = Path(__file__).resolve().parents[1]


def _job(hw=CPU_HW, policy=Policy(batch=4, seq=128), **sections):
    model = load_model("tiny")
    r, split = plan_policy(model, hw, policy)
    return replace(job_from_plan(source="tiny", model=model, hardware=hw, result=r, split=split), **sections)


@pytest.fixture(scope="module")
def hw_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("hw") / "machine.toml"
    save_hardware(CPU_HW, path)
    return str(path)


@pytest.mark.parametrize("case", ["cpu-defaults", "gpu-cluster-edited"])
def test_a_job_file_round_trips(tmp_path, case):
    if case == "cpu-defaults":
        job = _job()
    else:  # measured tables, a data-parallel machine, every train-side field set, a None left out
        hw = make_hardware("h200", "1.5TB", layout=Layout(8, 2))
        job = _job(hw, Policy(batch=8, seq=256, optimizer="backward", grad_clip=0.0, keep_last=-1,
                              compute_dtype="fp32", grad_dtype="fp32", working_copy=False),
                   run=RunSection(steps=500, seed=7),
                   optimizer=OptimizerSection(lr=2e-5, warmup_steps=20, min_lr=1e-6, weight_decay=0.1),
                   data=DataSection(data="sft.jsonl", tokenizer="tok/", eval_every=50),
                   outputs=OutputsSection(ckpt_dir="ckpt", save_every=100, save_hf="out", log_file="log.jsonl"))
    path = tmp_path / "job.toml"
    write_job(job, path)
    text = path.read_text()
    back = read_job(path)
    assert back == job
    assert job_to_toml(back) == text
    assert "null" not in text and "None" not in text
    if case == "cpu-defaults":
        assert "min_lr" not in text and "ckpt_dir" not in text  # None: left out, reads back as None
        assert back.optimizer.min_lr is None and back.outputs.ckpt_dir is None
    else:
        assert "[hardware.cluster]" in text and back.hardware.cluster.layout == Layout(8, 2)
        assert back.hardware.device.gemm_TFLOPs == job.hardware.device.gemm_TFLOPs


def test_plan_and_simulate_save_the_job_they_planned(tmp_path, hw_file, capsys):
    argv = ["--model", "tiny", "--hardware", hw_file, "--batch", "4", "--seq", "128", "--act-ckpt-every", "2"]
    assert main(["plan", *argv, "--no-advice", "--save-job", str(tmp_path / "plan.toml")]) == 0
    out = capsys.readouterr().out
    job = read_job(tmp_path / "plan.toml")
    assert f"horizon train --job {tmp_path / 'plan.toml'}" in out
    assert job.policy == Policy(batch=4, seq=128, act_ckpt_every=2, loss_kernel="fused")  # the CPU backend's
    assert job.model.source == "tiny" and job.model.digest == model_digest(load_model("tiny"))
    assert job.hardware == CPU_HW  # the file's machine, not the one priced at a core split
    assert job.prediction.compute_threads == 2 and job.prediction.fits
    assert f"step {job.prediction.step_time_s:.3f} s" in out  # the prediction plan printed
    assert main(["simulate", *argv, "--save-job", str(tmp_path / "sim.toml")]) == 0
    assert job_to_toml(read_job(tmp_path / "sim.toml")) == job_to_toml(job)


def test_an_unwritable_job_path_is_refused_before_planning(tmp_path, capsys):
    assert main(["plan", "--model", "tiny", "--save-job", str(tmp_path / "no" / "job.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--save-job" in err and "does not exist" in err
    assert main(["tune", "--model", "tiny", "--save-job", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


BAD = {  # (line to find, its replacement) -> words the one-line error must hold
    ("[policy]", "[polcy]"): "unknown key 'polcy' (did you mean 'policy'?)",
    ("batch = 4", "bach = 4"): "unknown key 'bach' in [policy] (did you mean 'batch'?)",
    ("steps = 10", "steps = \"ten\""): "[run] steps = 'ten': must be an integer",
    ("optimizer = \"pipelined\"", "optimizer = \"sideways\""): "policy optimizer='sideways'; allowed: after",
    ("doc_masks = false", "doc_masks = \"no\""): "[policy] doc_masks = 'no': must be true or false",
    ("beta2 = 0.95", "beta2 = 1.5"): "[optimizer] beta2 = 1.5: must lie in [0, 1)",
    ("save_dtype = \"bf16\"", "save_dtype = \"fp8\""): "[outputs] save_dtype = 'fp8': allowed: fp32, bf16",
    ("lr = 0.0003", "lr = 0.0003\nlr_max = 1"): "unknown key 'lr_max' in [optimizer]",
    ("hbm_GiB = 16.0", "hbm_gib = 16.0"): "unknown key 'hbm_gib' in [device] (did you mean 'hbm_GiB'?)",
    ("digest = ", "#digest = "): "[model] is missing key 'digest'",
    ("version = 1", "version = 9"): "version = 9; this Horizon reads version 1",
    ("seq = 128", "seq = 128\nseq = 256"): "Cannot overwrite a value",
}


@pytest.mark.parametrize("edit", list(BAD), ids=[b for _, b in BAD])
def test_a_bad_hand_edit_is_one_line_naming_the_file_and_key(tmp_path, capsys, edit):
    path = tmp_path / "job.toml"
    write_job(_job(), path)
    old, new = edit
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(HorizonError, match=f"^job file {str(path)!r}"):
        read_job(path)
    assert main(["train", "--job", str(path)]) == 2  # refused before anything is loaded
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"horizon train: error: job file {str(path)!r}") and BAD[edit] in err, err


def test_the_schedule_digest_is_the_same_in_every_process():
    """A hash seed changes set and dict-of-str orders: the digest must not follow it."""
    code = ("from horizon_sim.job.digest import schedule_digest; from horizon_sim.schedule import build_schedule; "
            "from horizon_sim.specs.hf_config import load_model; from horizon_sim.specs.policy import Policy; "
            "print(schedule_digest(build_schedule(load_model('tiny'), Policy(batch=4, seq=128, keep_last=2))))")
    digests = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                              env=dict(os.environ, PYTHONHASHSEED=seed)).stdout.strip() for seed in ("1", "2")}
    from horizon_sim.schedule import build_schedule
    here = schedule_digest(build_schedule(load_model("tiny"), Policy(batch=4, seq=128, keep_last=2)))
    assert digests == {here}
    assert schedule_digest(build_schedule(load_model("tiny"), Policy(batch=8, seq=128, keep_last=2))) != here


def test_tune_saves_its_best_row_and_prints_the_train_line_that_reproduces_it(tmp_path, hw_file, capsys):
    import argparse

    from horizon_exec.cli.train_cmd import configure_train_parser
    from horizon_exec.cli.train_flags import run_config
    path = tmp_path / "j.toml"
    assert main(["tune", "--model", "tiny", "--hardware", hw_file, "--max-batch", "4", "--seq", "128", "--workers", "1",
                 "--quiet", "--grad-clip", "0", "--json", "--save-job", str(path)]) == 0
    res = json.loads(capsys.readouterr().out)
    best = Policy.from_dict(res["best_policy"])
    assert read_job(path).policy == best and res["job"] == str(path)
    row = res["best"]  # the printed best row is this policy
    assert (row["batch"], row["optimizer"], row["keep_last"]) == (best.batch, best.optimizer, best.keep_last)
    line = res["train_command"]  # without --save-job, the line tune prints
    assert line.startswith("horizon train --model tiny --hardware ")
    ns = configure_train_parser(argparse.ArgumentParser()).parse_args(shlex.split(line)[2:])
    assert run_config(ns).policy == best  # exactly the best row, whatever this machine's train defaults


@settings(max_examples=int(os.environ.get("HORIZON_FUZZ_EXAMPLES", "40")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_edit_of_a_job_reads_or_is_one_line(data):
    """Any value in any key of any table (as tests/fuzz_strategies.py draws them): the job reads,
    or is refused with one HorizonError line; never another exception."""
    import tomllib

    from horizon_sim.job.sections import SECTIONS
    from horizon_sim.job.toml import job_from_dict
    from tests.fuzz_strategies import mutate, one_line_or_ok
    base = tomllib.loads(job_to_toml(_FUZZ_JOB))
    name = data.draw(st.sampled_from([*SECTIONS, "top level"]), label="table")
    if name == "top level":
        doc = mutate(base, data)
    else:
        keys = [f.name for f in fields(SECTIONS[name])]
        doc = dict(base, **{name: mutate(base[name], data, keys=keys)})
    one_line_or_ok(job_from_dict, doc, "job")


_FUZZ_JOB = _job(optimizer=OptimizerSection(min_lr=1e-5), outputs=OutputsSection(ckpt_dir="c", save_every=5))
