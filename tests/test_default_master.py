"""The default master (issue 27 item 4): the exact split master wherever it can be, the whole
fp32 master elsewhere (horizon_sim/specs/policy.py split_possible).

- Policy() with no master given resolves to the split master under bf16 compute with the
  working copy, and to the whole fp32 master without them; an explicit master_dtype is kept
  as given ('fp32': the whole master, as older schedules and checkpoints mean it).
- The Python API (Policy, Policy.from_choices) and the CLI flags make the same policy, and
  what a policy records (to_dict, schedule JSON) is the resolved master, never a sentinel.
- The planned host RAM drops by exactly 2 bytes per parameter against `--master-dtype fp32`.
(The executor side, a default run against an fp32-master run: test_exec_default_master.)
"""
import json
from dataclasses import replace

import pytest

from horizon_sim.cli.main import main
from horizon_sim.cli.plan_cmd import configure
from horizon_sim.cli.policy_args import policy_from_args
from horizon_sim.errors import HorizonError
from horizon_sim.plan import plan
from horizon_sim.plan.advice import policy_flags
from horizon_sim.schedule import build_schedule
from horizon_sim.schedule.serialize import from_json, to_json
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import PRESETS
from horizon_sim.specs.policy import Policy

TOY = ModelSpec(name="toy", n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=160, vocab=320)


@pytest.mark.parametrize("given,choice", [
    ({}, "split"),
    (dict(optimizer="backward", grad_clip=0.0, micro_batches=2, batch=4, mb_order="layer"), "split"),
    (dict(disk_tier="moments"), "split"),
    (dict(disk_tier="moments+low"), "split"),
    (dict(states_dtype="bf16", grad_dtype="bf16"), "split"),
    (dict(working_copy=False), "fp32"),                                   # the split is the copy
    (dict(compute_dtype="fp32", grad_dtype="fp32", working_copy=False), "fp32"),  # and it is bf16
    (dict(master_dtype="fp32"), "fp32"),                                  # asked for: the whole master
    (dict(split_master=False), "fp32"),
    (dict(master_dtype="bf16", working_copy=False), "bf16"),
    (dict(master_dtype="fp32", split_master=True), "split"),              # the explicit split, as before
])
def test_the_default_master_is_split_where_it_can_be(given, choice):
    p = Policy(**given)
    assert p.master_choice == choice
    assert isinstance(p.split_master, bool) and p.master_dtype in ("fp32", "bf16")  # resolved, no sentinel
    unnamed = {k: v for k, v in given.items() if k not in ("master_dtype", "split_master")}
    assert p.master_is_default == (p == Policy(**unnamed))  # what it gets with no master named


@pytest.mark.parametrize("flags,choices", [
    ([], {}),
    (["--no-working-copy"], dict(working_copy=False)),
    (["--compute-dtype", "fp32"], dict(compute_dtype="fp32")),
    (["--master-dtype", "fp32"], dict(master="fp32")),
    (["--master-dtype", "split"], dict(master="split")),
    (["--master-dtype", "bf16"], dict(master="bf16")),
    (["--optimizer", "backward", "--disk-tier", "moments+low"], dict(optimizer="backward", disk_tier="moments+low")),
])
def test_the_cli_and_the_python_api_make_the_same_policy(flags, choices):
    import argparse
    p = argparse.ArgumentParser()
    configure(p)
    got = policy_from_args(p.parse_args(flags))
    assert got == Policy.from_choices(**choices)
    if "master" not in choices and "compute_dtype" not in choices:  # no master named: Policy's own default
        assert got == Policy(**{k: v for k, v in choices.items()}, grad_clip=got.grad_clip)
    # the advice's flags for the policy rebuild it from the defaults
    assert policy_from_args(p.parse_args(policy_flags(got).split())) == got


def test_policy_flags_name_the_master_only_where_it_is_not_the_default():
    d = Policy()
    assert policy_flags(replace(d, working_copy=False, split_master=False), d) == "--no-working-copy"
    assert policy_flags(Policy(master_dtype="fp32"), d) == "--master-dtype fp32"
    assert policy_flags(d, Policy(master_dtype="fp32")) == "--master-dtype split"
    # base named the whole master: its flag stays in force, so turning the copy off needs none
    assert policy_flags(Policy(master_dtype="fp32", working_copy=False), Policy(master_dtype="fp32")) == \
        "--no-working-copy"


def test_what_a_policy_records_is_the_resolved_master_and_old_records_read_as_written():
    d = Policy().to_dict()
    assert (d["master_dtype"], d["split_master"]) == ("fp32", True)
    assert Policy.from_dict(d) == Policy()
    sched = from_json(to_json(build_schedule(TOY, Policy(batch=2, seq=64))))
    assert sched.meta.policy.split_master and json.loads(to_json(sched))["meta"]["policy"]["split_master"] is True
    # written before the split master existed: master_dtype named, split_master not: the whole master
    old = {k: v for k, v in Policy(master_dtype="fp32").to_dict().items() if k != "split_master"}
    assert Policy.from_dict(old).master_choice == "fp32"


def test_a_split_that_cannot_be_is_a_one_line_error_naming_the_way_out():
    with pytest.raises(HorizonError, match="split_master=True .* working_copy=False .* --master-dtype fp32"):
        replace(Policy(), working_copy=False)   # a copy of the default keeps its split
    with pytest.raises(HorizonError, match="moments\\+low' puts a split master's low halves on disk; here the "
                                           "master is fp32"):
        Policy(disk_tier="moments+low", master_dtype="fp32")


@pytest.mark.parametrize("model,gpu,ram", [("llama-3.1-8b", "rtx-4090", "128GB"), ("dense-120b", "h200", "1.5TB")])
def test_the_planned_host_ram_drops_two_bytes_a_parameter(model, gpu, ram):
    m, hw = PRESETS[model], make_hardware(gpu, ram)
    default, whole = plan(m, hw, Policy()), plan(m, hw, Policy(master_dtype="fp32"))
    assert whole.summary.host_bytes - default.summary.host_bytes == 2 * m.total_params
    assert default.host.by_role["master"] == 2 * m.total_params  # the low halves; the high halves are the copy


def test_plan_prints_the_resolved_master(capsys):
    assert main(["plan", "--model", "tiny", "--gpu", "rtx-4090", "--ram", "64GB", "--no-advice"]) == 0
    assert "fp32 split (bf16 working copy + 16-bit low half)" in capsys.readouterr().out
    assert main(["plan", "--model", "tiny", "--gpu", "rtx-4090", "--ram", "64GB", "--no-advice",
                 "--master-dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "master fp32," in out and "fp32 split" not in out
    assert main(["plan", "--model", "tiny", "--master-dtype", "split", "--no-working-copy"]) == 2
    err = capsys.readouterr().err
    assert "drop --no-working-copy" in err and "Traceback" not in err
