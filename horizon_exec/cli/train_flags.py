"""`horizon train`'s flags read once into a RunConfig (train/config.py), before anything is loaded.
The config types hold the rules (one each, the same for Python callers); a value they refuse is
one HorizonError line here too, naming the flag that set it, its value and what is allowed."""
import argparse

from horizon_exec.errors import ConfigError
from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.engine import DEFAULT_OP_TIMEOUT_S
from horizon_exec.train.config import CheckpointConfig, DataConfig, LRScheduleConfig, OutputsConfig, RunConfig
from horizon_sim.cli.policy_args import policy_from_args
from horizon_sim.units import parse_size

FLAGS = {
    "model": "--model", "init_from": "--init-from", "init_adapter": "--init-adapter", "lora_rank": "--lora-rank", "steps": "--steps", "seed": "--seed",
    "lr": "--lr", "peak": "--lr", "beta1": "--beta1", "beta2": "--beta2", "betas": "--beta1/--beta2", "eps": "--eps",
    "weight_decay": "--weight-decay", "warmup_steps": "--warmup-steps", "min_lr": "--min-lr",
    "device": "--device", "compute_threads": "--compute-threads", "timeout_s": "--op-timeout",
    "on_nonfinite": "--on-nonfinite", "disk_dir": "--disk-dir", "disk_method": "--disk-io", "disk_tier": "--disk-tier",
    "host_budget_bytes": "--host-budget", "device_budget_bytes": "--device-budget", "gpu": "--gpu",
    "hardware": "--hardware", "eval_every": "--eval-every", "eval_batches": "--eval-batches",
    "eval_fraction": "--eval-fraction", "ckpt_dir": "--ckpt-dir", "save_every": "--ckpt-interval",
    "keep_ckpts": "--keep-ckpts", "overwrite_ckpt": "--overwrite-ckpt", "resume": "--resume", "save_hf": "--save-hf", "save_adapter": "--save-adapter",
    "save_dtype": "--save-dtype", "save_shard_bytes": "--save-shard-size", "log_file": "--log-file",
    "report_dir": "--report-dir",
}
"""The flag that sets each config field."""


def run_config(a: argparse.Namespace) -> RunConfig:
    """The run the flags describe (a.compute_dtype already resolved); a refused value is a
    HorizonError naming its flag."""
    try:
        return _run_config(a)
    except ConfigError as e:
        raise e.as_flags(FLAGS) from None


def _run_config(a: argparse.Namespace) -> RunConfig:
    def size(value, flag):
        return parse_size(value, flag) if value else None

    checkpoints = CheckpointConfig(ckpt_dir=a.ckpt_dir, save_every=a.ckpt_interval, keep_ckpts=a.keep_ckpts,
                                   overwrite_ckpt=a.overwrite_ckpt, resume=a.resume)
    data = DataConfig(data=a.data, tokenizer=a.tokenizer, eos_token=a.eos_token, eval_fraction=a.eval_fraction,
                      eval_every=a.eval_every, eval_batches=a.eval_batches)
    outputs = OutputsConfig(save_hf=a.save_hf, save_adapter=getattr(a, "save_adapter", None), save_dtype=a.save_dtype, log_file=a.log_file, progress=not a.no_progress,
                            report_dir=getattr(a, "report_dir", None),
                            **({"save_shard_bytes": parse_size(a.save_shard_size, "--save-shard-size")}
                               if a.save_hf else {}))  # without --save-hf the size is not read
    schedule = LRScheduleConfig(peak=a.lr, warmup_steps=a.warmup_steps, min_lr=a.min_lr)
    trainer = TrainerConfig(
        optimizer=OptimizerConfig(lr=a.lr, weight_decay=a.weight_decay, betas=(a.beta1, a.beta2), eps=a.eps),
        seed=a.seed, random_init=a.init_from is None,
        runtime=RuntimeConfig(device=_device(a), compute_threads=a.compute_threads, on_nonfinite=a.on_nonfinite,
                              timeout_s=DEFAULT_OP_TIMEOUT_S if a.op_timeout is None else a.op_timeout,
                              disk_dir=a.disk_dir, disk_method=a.disk_io),
        admission=AdmissionConfig(enabled=not a.no_admission, host_budget_bytes=size(a.host_budget, "--host-budget"),
                                  device_budget_bytes=size(a.device_budget, "--device-budget")))
    policy = policy_from_args(a)
    return RunConfig(model=a.model, init_from=a.init_from, init_adapter=getattr(a, "init_adapter", None), steps=a.steps, policy=policy, trainer=trainer,
                     lr_schedule=schedule, data=data, checkpoints=checkpoints, outputs=outputs, gpu=a.gpu,
                     hardware=a.hardware, compute_dtype_why=getattr(a, "compute_dtype_why", ""))


def _device(a: argparse.Namespace) -> str:
    """--device, or its default where train_cmd has not resolved it yet (a caller of run_config)."""
    if a.device is not None:
        return a.device
    from horizon_exec.cli.default_device import default_device
    return default_device()[0]
