"""Issue 39, item 1: a job file's training side ([run], [optimizer], [data], [outputs]) holds what
`horizon train` uses by default. Those defaults are train's flags' (horizon_exec/cli/train_cmd.py),
which horizon_sim must not import: the job's sections restate them, and this test holds the two
equal, so a default changed on one side fails here until the other follows."""
import argparse
from dataclasses import fields

from horizon_exec.checkpoints.hf_checkpoint import SAVE_DTYPES
from horizon_exec.cli.job_run import job_args
from horizon_exec.cli.train_cmd import configure_train_parser
from horizon_sim.job import sections
from horizon_sim.job.sections import DataSection, OptimizerSection, OutputsSection, RunSection
from horizon_sim.units import parse_size
from tests.test_job_file import _job

TRAIN_SIDE = (RunSection, OptimizerSection, DataSection, OutputsSection)


def test_the_train_side_defaults_are_horizon_trains():
    flags = configure_train_parser(argparse.ArgumentParser()).parse_args(["--model", "tiny"])
    job = job_args(_job())  # a job at its sections' defaults, as the train flags it sets
    names = {f.name for cls in TRAIN_SIDE for f in fields(cls)}
    checked = 0
    for dest, value in job.items():
        field = {"ckpt_interval": "save_every", "save_shard_size": "save_shard_bytes"}.get(dest, dest)
        if field not in names:
            continue  # the model, machine and policy: the planner's, not train's defaults
        want = getattr(flags, dest)
        if dest == "save_shard_size":
            value, want = parse_size(value), parse_size(want)
        assert value == want, f"job default {field}={value!r}, horizon train's {dest}={want!r}"
        checked += 1
    assert checked == len(names)  # every train-side field has its flag


def test_the_save_dtypes_are_the_executors():
    assert sections.SAVE_DTYPES == tuple(SAVE_DTYPES)
