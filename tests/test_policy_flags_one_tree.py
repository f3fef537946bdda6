"""Issue 39, item 5 (the policy's part): every Policy field has one flag, spelled the same, with
the same default and type, in `horizon plan`, `simulate`, `tune` and `train` (all four declare
them in one function, cli/policy_args.py add_policy_args, and read them in one, policy_from_args;
where a command searches the knobs, tune and train, their help says the planner chooses); the job file's [policy] holds every field; docs/job.md lists every field;
`plan`'s printed flags (advice.policy_flags) can say every field."""
import argparse
import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from horizon_sim.cli.main import _parser
from horizon_sim.cli.policy_args import policy_from_args
from horizon_sim.job.toml import job_to_toml
from horizon_sim.plan.advice import _FLAGS, policy_flags
from horizon_sim.specs.policy import Policy
from tests.test_job_file import _job

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("plan", "simulate", "tune", "train")
DEST = {"keep_last": "keep_activations", "split_master": "master_dtype", "working_copy": "no_working_copy"}
"""Policy field -> its flag's dest, where they are not spelled the same."""
NO_FLAG = {"attention": "the planner's model of the attention kernel's memory ('flash' is what the executor "
                        "runs; 'eager' prices a peer's): a job or the Python API sets it"}
ALIASES = {("train", "micro_batches"): {"--grad-accum"}}
"""Second spellings a command accepts for a field (`horizon train --grad-accum N`)."""
MACHINE_DEFAULT = {("train", "compute_dtype")}
"""Defaults a command resolves for the machine it runs on (None in the parser: bf16 or fp32 by the CPU)."""


def _subparser(cmd: str) -> argparse.ArgumentParser:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[cmd]


def _actions(cmd: str, dest: str) -> list:
    return [a for a in _subparser(cmd)._actions if a.dest == dest and a.option_strings
            and a.help != argparse.SUPPRESS]


def _policy_fields():
    return [f.name for f in fields(Policy) if f.name not in NO_FLAG and f.name != "master_dtype"]


@pytest.mark.parametrize("field", _policy_fields())
def test_each_policy_field_has_one_flag_with_one_default(field):
    dest = DEST.get(field, field)
    seen = {}
    for cmd in COMMANDS:
        acts = _actions(cmd, dest)
        spellings = {s for a in acts for s in a.option_strings} - ALIASES.get((cmd, field), set())
        assert len(spellings) == 1, f"{cmd}: {field} has flags {sorted(spellings)}"
        main = next(a for a in acts if spellings & set(a.option_strings))
        default = "machine" if (cmd, field) in MACHINE_DEFAULT else main.default
        seen[cmd] = (spellings.pop(), default, main.type, main.choices)
    flags = {v[0] for v in seen.values()}
    assert len(flags) == 1, f"{field}: {seen}"
    defaults = {v[1] for v in seen.values() if v[1] != "machine"}
    assert len(defaults) == 1, f"{field}: defaults differ: {seen}"
    assert len({(v[2], v[3] and tuple(v[3])) for v in seen.values()}) == 1, f"{field}: types differ: {seen}"


@pytest.mark.parametrize("cmd", COMMANDS)
def test_the_flags_read_into_policys_own_defaults(cmd):
    """No flag given: every command reads the same Policy (train's compute dtype given, its
    default being the machine's)."""
    a = _subparser(cmd).parse_args(["--model", "tiny", "--compute-dtype", "bf16"])
    assert policy_from_args(a) == Policy()


def test_every_field_is_in_the_job_and_its_doc():
    job = tomllib.loads(job_to_toml(_job()))["policy"]
    doc = (ROOT / "docs" / "job.md").read_text()
    for f in fields(Policy):
        assert f.name in job, f"the job's [policy] lacks {f.name}"
        assert re.search(rf"`{f.name}`", doc), f"docs/job.md does not list policy {f.name}"


def test_plans_flags_can_say_every_field():
    """advice.policy_flags (the `plan it:`/`train it:` lines, the nearest-fit advice) names a
    flag for each field a policy can differ in."""
    said = {f for f, _ in _FLAGS} | {"master_dtype", "split_master", "working_copy", "doc_masks"}
    assert said == {f.name for f in fields(Policy)} - set(NO_FLAG)
    p = Policy(doc_masks=True, doc_tokens=512, loss_chunk_tokens=256, seq=4096)
    assert policy_from_args(_subparser("plan").parse_args(["--model", "tiny", *policy_flags(p).split()])) == p
