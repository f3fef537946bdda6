"""`horizon train`'s flags checked before anything is loaded: one HorizonError line naming the
flag, its value and what is allowed. The optimizer's rules are optim.check_hyper's (the same
ones AdamW and Trainer apply to Python callers); here they are worded with the flags' names."""
import math

from horizon_sim.errors import HorizonError

_FLAG = {"lr": "--lr ", "beta1": "--beta1 ", "beta2": "--beta2 ", "betas": "--beta1/--beta2 ", "eps": "--eps ",
         "weight_decay": "--weight-decay "}
SEED_LIMIT = 2**64
"""Seeds are torch generator seeds: 64 bits."""


def check_train_args(a) -> None:
    for name in ("steps",):
        if getattr(a, name) <= 0:
            raise HorizonError(f"--{name} {getattr(a, name)} must be positive")
    for name in ("warmup_steps", "eval_every", "eval_batches", "ckpt_interval", "keep_ckpts"):
        if getattr(a, name) < 0:
            raise HorizonError(f"--{name.replace('_', '-')} {getattr(a, name)} must be >= 0")
    if a.model is None and a.init_from is None:
        raise HorizonError("give --model (a preset or config.json) or --init-from (an HF checkpoint folder)")
    for flag in ("save_hf", "ckpt_dir", "log_file"):  # an empty path would be taken as "not given"
        if getattr(a, flag) == "":
            raise HorizonError(f"--{flag.replace('_', '-')} is empty; give a path (or leave the flag out)")
    if a.overwrite_ckpt and (not a.ckpt_dir or a.resume is not None):
        raise HorizonError("--overwrite-ckpt starts a fresh run over the checkpoints of --ckpt-dir: it needs "
                           "--ckpt-dir and no --resume")
    if a.resume == "" and not a.ckpt_dir:
        raise HorizonError("--resume without a folder needs --ckpt-dir")
    if a.ckpt_interval and not a.ckpt_dir:
        raise HorizonError("--ckpt-interval needs --ckpt-dir")
    if a.disk_dir is not None and getattr(a, "disk_tier", "none") == "none":  # it would be ignored
        raise HorizonError(f"--disk-dir {a.disk_dir} needs --disk-tier moments or moments+low: without a disk "
                           f"tier nothing is kept on disk")
    _check_optimizer(a)
    if not 0 <= a.seed < SEED_LIMIT:
        raise HorizonError(f"--seed {a.seed} must lie in [0, 2**64)")
    if a.op_timeout is not None and not 0 < a.op_timeout < math.inf:
        raise HorizonError(f"--op-timeout {a.op_timeout!r} must be a positive number of seconds")
    if a.compute_threads is not None and a.compute_threads < 1:
        raise HorizonError(f"--compute-threads {a.compute_threads} must be >= 1 (default: cores - 1)")
    from horizon_exec.device.backend import check_device
    try:
        check_device(a.device)
    except HorizonError as e:
        raise HorizonError(f"--device: {e}") from None


def _check_optimizer(a) -> None:
    from horizon_exec.optim.adamw import check_hyper

    if not a.lr > 0:
        raise HorizonError(f"--lr {a.lr!r} must be positive (the peak of the schedule)")
    check_hyper(lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, weight_decay=a.weight_decay, name=_FLAG.get)
    if a.min_lr is not None and not (math.isfinite(a.min_lr) and 0 <= a.min_lr <= a.lr):
        raise HorizonError(f"--min-lr {a.min_lr!r} must lie in [0, --lr {a.lr:g}]")
