"""Issue 29: the run's configuration in one place. The train CLI reads its flags once into a
RunConfig of frozen, self-checking parts (train/config.py, runtime/config.py); a Python caller
builds the same types and hears the same rules in its own names; the policy the flags describe
is Policy.from_choices', so CLI and Python API agree."""
import argparse
import dataclasses
import math

import pytest

from horizon_exec.cli.train_cmd import configure_train_parser
from horizon_exec.cli.train_flags import FLAGS, run_config
from horizon_exec.errors import ConfigError
from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.engine import DEFAULT_OP_TIMEOUT_S
from horizon_exec.runtime.trainer import Trainer
from horizon_exec.train.config import CheckpointConfig, LRScheduleConfig, OutputsConfig
from horizon_sim.cli.policy_args import add_policy_args, policy_from_args
from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

SPEC = ModelSpec(n_layers=1, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=256)


def _flags(*argv):
    a = configure_train_parser(argparse.ArgumentParser()).parse_args(["--model", "tiny", *argv])
    a.compute_dtype = a.compute_dtype or "fp32"
    return a


def test_the_flags_give_the_run_their_defaults_once():
    cfg = run_config(_flags())
    t = cfg.trainer
    assert t.optimizer == OptimizerConfig(lr=3e-4, betas=(0.9, 0.95))
    assert t.runtime == RuntimeConfig(timeout_s=DEFAULT_OP_TIMEOUT_S) and t.admission == AdmissionConfig()
    assert (t.seed, t.random_init, cfg.steps) == (0, True, 10)
    assert cfg.lr_schedule.schedule(cfg.steps).to_dict() == {"peak": 3e-4, "total_steps": 10, "warmup_steps": 0,
                                                          "min_lr": 3e-4 / 10}
    assert cfg.checkpoints == CheckpointConfig() and cfg.outputs == OutputsConfig()
    assert cfg.policy.loss_chunk_tokens == 1024 and cfg.policy.compute_dtype == "fp32"
    loop = cfg.loop_config(None)
    assert (loop.steps, loop.eval_batches, loop.keep_ckpts, loop.progress) == (10, 4, 2, True)


def test_the_flags_reach_their_fields():
    cfg = run_config(_flags("--lr", "1e-3", "--beta2", "0.99", "--seed", "7", "--op-timeout", "30",
                            "--host-budget", "1GiB", "--no-admission", "--ckpt-dir", "ck", "--save-every", "2",
                            "--resume", "--save-hf", "out", "--save-shard-size", "1MB", "--no-progress",
                            "--init-from", "x", "--disk-tier", "moments", "--disk-dir", "/tmp", "--disk-io",
                            "buffered"))
    t = cfg.trainer
    assert t.optimizer.betas == (0.9, 0.99) and cfg.lr_schedule.peak == t.optimizer.lr == 1e-3 and t.seed == 7
    assert t.runtime.timeout_s == 30 and t.runtime.disk_dir == "/tmp" and t.runtime.disk_method == "buffered"
    assert t.admission == AdmissionConfig(enabled=False, host_budget_bytes=1 << 30) and not t.random_init
    assert cfg.checkpoints == CheckpointConfig(ckpt_dir="ck", save_every=2, resume="")
    assert cfg.outputs == OutputsConfig(save_hf="out", save_shard_bytes=10**6, progress=False)
    assert run_config(_flags("--merge-into", "merged")).outputs.save_hf == "merged"  # (its other name)


@pytest.mark.parametrize("make,python,flags", [
    (lambda: TrainerConfig(seed=-1), "seed=-1 must be an integer in [0, 2**64)", "--seed -1 must lie in [0, 2**64)"),
    (lambda: RuntimeConfig(timeout_s=math.inf), "timeout_s=inf must be a positive number of seconds",
     "--op-timeout inf must be a positive number of seconds"),
    (lambda: RuntimeConfig(compute_threads=0), "compute_threads=0 must be >= 1", "--compute-threads 0 must be >= 1"),
    (lambda: RuntimeConfig(on_nonfinite="retry"), "on_nonfinite='retry': use one of skip, stop",
     "--on-nonfinite 'retry': use one of skip, stop"),
    (lambda: RuntimeConfig(device="tpu"), "device 'tpu' is not supported", "--device: device 'tpu' is not"),
    (lambda: OptimizerConfig(eps=0.0), "AdamW eps=0.0 must be", "--eps 0.0 must be"),
    (lambda: OptimizerConfig(betas=(0.9,)), "AdamW betas=(0.9,) must be two numbers",
     "--beta1/--beta2 (0.9,) must be two numbers"),
    (lambda: AdmissionConfig(host_budget_bytes=-1), "host_budget_bytes=-1 must be a whole number of bytes",
     "--host-budget -1 must be"),
    (lambda: LRScheduleConfig(peak=1e-3, min_lr=1.0), "min_lr=1.0 must lie in [0, peak=0.001]",
     "--min-lr 1.0 must lie in [0, --lr 0.001]"),
    (lambda: CheckpointConfig(save_every=2), "save_every needs ckpt_dir", "--ckpt-interval needs --ckpt-dir"),
    (lambda: CheckpointConfig(ckpt_dir="c", resume="", overwrite_ckpt=True),
     "overwrite_ckpt starts a fresh run over the checkpoints of ckpt_dir: it needs ckpt_dir and no resume",
     "--overwrite-ckpt starts a fresh run over the checkpoints of --ckpt-dir: it needs --ckpt-dir and no --resume"),
    (lambda: OutputsConfig(log_file=""), "log_file is empty; give a path", "--log-file is empty; give a path"),
])
def test_one_rule_in_the_callers_words(make, python, flags):
    with pytest.raises(ConfigError) as e:
        make()
    assert python in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)
    assert flags in str(e.value.as_flags(FLAGS)), str(e.value.as_flags(FLAGS))


def test_the_run_ties_its_parts_together():
    base = run_config(_flags())
    for change, words in ((dict(model=None), "give model (a preset or config.json) or init_from"),
                          (dict(gpu="h100-sxm", hardware="hw.toml"), "give gpu or hardware, not both"),
                          (dict(lr_schedule=LRScheduleConfig(peak=1e-2)), "peak=0.01 must be the optimizer's lr=0.0003"),
                          (dict(steps=0), "steps=0 must be positive")):
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            dataclasses.replace(base, **change)
    with pytest.raises(ConfigError, match="disk_dir=/x needs disk_tier moments or moments"):
        dataclasses.replace(base, trainer=TrainerConfig(runtime=RuntimeConfig(disk_dir="/x"),
                                                        optimizer=base.trainer.optimizer))
    with pytest.raises(HorizonError, match=r"^--disk-dir /x needs --disk-tier moments"):
        run_config(_flags("--disk-dir", "/x"))


@pytest.mark.parametrize("argv,fields", [
    ([], dict()),
    (["--optimizer", "backward"], dict(optimizer="backward")),
    (["--compute-dtype", "fp32"], dict(compute_dtype="fp32")),
    (["--master-dtype", "split"], dict(master="split")),
    (["--master-dtype", "bf16", "--compute-dtype", "bf16"], dict(master="bf16", compute_dtype="bf16")),
    (["--no-working-copy", "--grad-clip", "0.5"], dict(working_copy=False, grad_clip=0.5)),
])
def test_the_cli_and_python_derive_the_same_policy(argv, fields):
    p = argparse.ArgumentParser()
    add_policy_args(p)
    assert policy_from_args(p.parse_args(argv)) == Policy.from_choices(**fields)


def test_what_the_policy_derives():
    assert Policy.from_choices(optimizer="backward").grad_clip == 0.0 == Policy.default_grad_clip("backward")
    assert Policy.from_choices().grad_clip == Policy().grad_clip == Policy.default_grad_clip("after")
    fp32 = Policy.from_choices(compute_dtype="fp32")
    assert (fp32.working_copy, fp32.grad_dtype) == (False, "fp32")  # the copy would be the master itself
    split = Policy.from_choices(master="split")
    assert (split.master_dtype, split.split_master, split.master_choice) == ("fp32", True, "split")
    with pytest.raises(HorizonError, match="drop --no-working-copy"):
        Policy.from_choices(master="split", working_copy=False)
    with pytest.raises(HorizonError, match="policy master='fp16'; allowed: fp32, split, bf16"):
        Policy.from_choices(master="fp16")


def test_the_trainer_takes_a_trainer_config():
    with pytest.raises(HorizonError, match="must be a TrainerConfig"):
        Trainer(SPEC, Policy(batch=1, seq=16), OptimizerConfig())
    with pytest.raises(HorizonError, match="on_nonfinite='skip' cannot be exact with optimizer='backward'"):
        Trainer(SPEC, Policy(batch=1, seq=16, optimizer="backward", grad_clip=0.0),
                TrainerConfig(runtime=RuntimeConfig(on_nonfinite="skip")))
