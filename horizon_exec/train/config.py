"""A `horizon train` run as one typed configuration, read from the flags once (cli/train_flags.py)
or made in Python: frozen dataclasses, one per concern, each checked when it is made
(one-line ConfigError naming the field, its value and what is allowed; the CLI words the same
errors with its flags).

    cfg = RunConfig(model="tiny", steps=100, policy=Policy(batch=4, seq=512),
                    trainer=TrainerConfig(optimizer=OptimizerConfig(lr=3e-4)),
                    lr_schedule=LRScheduleConfig(peak=3e-4, warmup_steps=10),
                    checkpoints=CheckpointConfig(ckpt_dir="ckpt", save_every=50))

The trainer's own settings (optimizer, device, admission, init seed) are runtime/config.py's
TrainerConfig; around it: LRScheduleConfig (warmup then cosine decay, optim/lr.py), DataConfig
(what is trained on and held out), CheckpointConfig (training checkpoints, resume),
OutputsConfig (the HF save, the metrics log, the progress bar).
"""
import math
import os
from dataclasses import dataclass

from horizon_exec.errors import ConfigError
from horizon_exec.checkpoints.hf_checkpoint import SAVE_DTYPES
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.runtime.config import TrainerConfig
from horizon_exec.train.loop import LoopConfig
from horizon_sim.specs.policy import Policy


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_counts(cfg, *fields) -> None:
    for f in fields:
        if not _count(getattr(cfg, f)):
            raise ConfigError(f, getattr(cfg, f), "must be >= 0")


def _check_paths(cfg, *fields) -> None:
    """An empty path would be taken as 'not given' (None is)."""
    for f in fields:
        if getattr(cfg, f) == "":
            raise ConfigError(f, want="is empty; give a path (or leave the flag out)")


@dataclass(kw_only=True, frozen=True, slots=True)
class LRScheduleConfig:
    """Linear warmup, then cosine decay to min_lr over the run's steps (optim/lr.py)."""
    peak: float
    """The lr after warmup: the optimizer's lr."""
    warmup_steps: int = 0
    min_lr: float | None = None
    """Floor of the decay (None: peak / 10)."""

    def __post_init__(self):
        _check_counts(self, "warmup_steps")
        if not (isinstance(self.peak, (int, float)) and self.peak > 0):
            raise ConfigError("peak", self.peak, "must be positive (the peak of the schedule)")
        if self.min_lr is not None and not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.peak):
            raise ConfigError("min_lr", self.min_lr, f"must lie in [0, {{peak=}}{self.peak:g}]")

    def schedule(self, total_steps: int) -> CosineSchedule:
        return CosineSchedule(peak=self.peak, total_steps=total_steps, warmup_steps=self.warmup_steps,
                              min_lr=self.peak / 10 if self.min_lr is None else self.min_lr)


@dataclass(kw_only=True, frozen=True, slots=True)
class DataConfig:
    data: str | None = None
    """A .jsonl or text file (None: the built-in corpus; files/data.py)."""
    tokenizer: str | None = None
    """tokenizer.json, a folder or model id holding one, or 'bytes' (None: --init-from's, else bytes)."""
    eos_token: str | None = None
    eval_fraction: float = 0.05
    """Share of the packed sequences held out for eval."""
    eval_every: int = 0
    """Eval every N steps (0: after the last step only)."""
    eval_batches: int = 4
    """Held-out batches per eval (0: no eval)."""

    def __post_init__(self):
        _check_counts(self, "eval_every", "eval_batches")


@dataclass(kw_only=True, frozen=True, slots=True)
class CheckpointConfig:
    ckpt_dir: str | None = None
    """Training checkpoints go here (one run at a time: ckpt_lock.py)."""
    save_every: int = 0
    """Checkpoint every N steps (0: after the last step only)."""
    keep_ckpts: int = 2
    """Checkpoints kept (0: all)."""
    overwrite_ckpt: bool = False
    """A fresh run in a ckpt_dir that holds checkpoints removes them (else it is refused)."""
    resume: str | None = None
    """None: a fresh run; '': ckpt_dir's latest checkpoint; else a checkpoint folder."""

    def __post_init__(self):
        _check_counts(self, "save_every", "keep_ckpts")
        _check_paths(self, "ckpt_dir")
        if self.overwrite_ckpt and (not self.ckpt_dir or self.resume is not None):
            raise ConfigError("overwrite_ckpt", want="starts a fresh run over the checkpoints of {ckpt_dir}: it "
                                                     "needs {ckpt_dir} and no {resume}")
        if self.resume == "" and not self.ckpt_dir:
            raise ConfigError("resume", want="without a folder needs {ckpt_dir}")
        if self.save_every and not self.ckpt_dir:
            raise ConfigError("save_every", want="needs {ckpt_dir}")


@dataclass(kw_only=True, frozen=True, slots=True)
class OutputsConfig:
    save_hf: str | None = None
    """After training, write a transformers checkpoint folder here."""
    save_adapter: str | None = None
    """With adapters: after training, write them alone here in peft's format."""
    save_dtype: str = "bf16"
    save_shard_bytes: int = 5 * 10**9
    """Largest safetensors shard of save_hf."""
    log_file: str | None = None
    """Append per-step metrics as JSON lines."""
    progress: bool = True
    report_dir: str | None = None
    """The run's predicted-vs-measured report goes here (train/plan_report.py; None: beside the
    checkpoints, <ckpt_dir>/report, when there are any and the prediction's speeds were measured:
    cli/train_plan.report_folder)."""

    def __post_init__(self):
        _check_paths(self, "save_hf", "save_adapter", "log_file", "report_dir")
        if self.save_dtype not in SAVE_DTYPES:
            raise ConfigError("save_dtype", self.save_dtype, f": allowed: {', '.join(SAVE_DTYPES)}")
        if not (_count(self.save_shard_bytes) and self.save_shard_bytes > 0):
            raise ConfigError("save_shard_bytes", self.save_shard_bytes, "must be a positive whole number of bytes")


@dataclass(kw_only=True, frozen=True, slots=True)
class RunConfig:
    model: str | None = None
    """A preset, a config.json, or a model id in the local HF cache (None: init_from's config)."""
    init_from: str | None = None
    """A local HF checkpoint folder or a model id in the local HF cache, the weights to start from."""
    init_adapter: str | None = None
    """With adapters (policy.lora_rank): a peft LoRA adapter folder the adapters start from."""
    steps: int = 10
    """Total optimizer steps of the run (a resumed run continues up to this)."""
    policy: Policy
    trainer: TrainerConfig
    lr_schedule: LRScheduleConfig
    data: DataConfig = DataConfig()
    checkpoints: CheckpointConfig = CheckpointConfig()
    outputs: OutputsConfig = OutputsConfig()
    gpu: str | None = None
    """A GPU preset whose peak FLOP/s MFU is reported against."""
    hardware: str | None = None
    """A hardware TOML whose peak FLOP/s MFU is reported against and whose speeds the admission uses."""
    compute_dtype_why: str = ""
    """Why the policy's compute dtype is what it is, when the run chose it (for the log)."""

    def __post_init__(self):
        if not (_count(self.steps) and self.steps > 0):
            raise ConfigError("steps", self.steps, "must be positive")
        if self.model is None and self.init_from is None:
            raise ConfigError(None, want="give {model} (a preset or config.json) or {init_from} (an HF checkpoint "
                                         "folder)")
        disk_dir = self.trainer.runtime.disk_dir
        if disk_dir is not None and self.policy.disk_tier == "none":  # it would be ignored
            raise ConfigError("disk_dir", disk_dir, "needs {disk_tier} moments or moments+low: without a disk tier "
                                                    "nothing is kept on disk", show=str)
        _check_paths(self, "init_adapter")
        if self.init_adapter is not None and not os.path.isfile(os.path.join(self.init_adapter, "adapter_config.json")):
            raise ConfigError("init_adapter", self.init_adapter, "is not a peft LoRA adapter folder (no "
                                                                 "adapter_config.json there)", show=str)
        if self.outputs.save_adapter is not None and not self.policy.adapters:
            raise ConfigError("save_adapter", self.outputs.save_adapter, "writes a LoRA run's adapters: give "
                                                                         "{lora_rank} too", show=str)
        if self.init_adapter is not None and not self.policy.adapters:
            raise ConfigError("init_adapter", self.init_adapter, "starts the adapters of a LoRA run: give {lora_rank} "
                                                                 "(the adapter's r) too", show=str)
        if self.gpu and self.hardware:
            raise ConfigError(None, want="give {gpu} or {hardware}, not both")
        if self.lr_schedule.peak != self.trainer.optimizer.lr:
            raise ConfigError("peak", self.lr_schedule.peak, f"must be the optimizer's {{lr=}}{self.trainer.optimizer.lr!r}")

    def loop_config(self, peak_flops: float | None) -> LoopConfig:
        """The training loop's settings for this run; peak_flops: what MFU is reported against."""
        c = self.checkpoints
        return LoopConfig(steps=self.steps, lr_schedule=self.lr_schedule.schedule(self.steps),
                          eval_every=self.data.eval_every, eval_batches=self.data.eval_batches, ckpt_dir=c.ckpt_dir,
                          save_every=c.save_every, keep_ckpts=c.keep_ckpts, peak_flops=peak_flops,
                          progress=self.outputs.progress, log_file=self.outputs.log_file)
