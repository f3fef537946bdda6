"""The sections of a job file (docs/job.md), one frozen dataclass each, checked when made.

A job is what `horizon plan|simulate|tune --save-job` decided and what `horizon train --job`
runs: the model, the machine, the resolved policy, the training side (optimizer and LR
schedule, data, outputs, steps and seed) and the plan's prediction. The training side's
defaults are `horizon train`'s own (tests/test_job_defaults.py holds them equal to its flags'),
so a job saved by the planner trains what a plain `horizon train` would, on that policy.

Every value a file may hold is checked here: its type (an int where a float is wanted is taken
as the float: TOML writes 1.0 as 1 when a person types it) and its range. A refusal is a
HorizonError naming the section and the key; the reader (job/toml.py) puts the file before it.
"""
import math
import types
import typing
from dataclasses import dataclass, fields

from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.policy import Policy

FORMAT = "horizon.job"
VERSION = 1
SAVE_DTYPES = ("fp32", "bf16")
"""--save-dtype's choices (horizon_exec's hf_checkpoint.SAVE_DTYPES: this side imports no torch)."""

_KIND = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def check_types(obj, section: str) -> None:
    """Each field of the dataclass `obj` holds a value of its annotated type (None where the
    annotation allows it); an int in a float field becomes that float. Refusal: one line
    '[section] key = value: must be <kind>'."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        v, want = getattr(obj, f.name), hints[f.name]
        allowed = typing.get_args(want) if isinstance(want, types.UnionType) else (want,)
        if v is None and type(None) in allowed:
            continue
        if float in allowed and isinstance(v, int) and not isinstance(v, bool):
            object.__setattr__(obj, f.name, float(v))
            continue
        plain = tuple(t for t in allowed if t is not type(None))
        if isinstance(v, bool) != (bool in plain) or not isinstance(v, plain):
            kinds = " or ".join(_KIND.get(t, t.__name__) for t in plain)
            raise HorizonError(f"[{section}] {f.name} = {v!r}: must be {kinds}"
                               + (" (leave the key out for none)" if type(None) in allowed else ""))


def _refuse(section: str, key: str, v, want: str):
    raise HorizonError(f"[{section}] {key} = {v!r}: {want}")


def _counts(obj, section: str, *keys, positive: bool = False) -> None:
    for k in keys:
        v = getattr(obj, k)
        if v < (1 if positive else 0):
            _refuse(section, k, v, "must be > 0" if positive else "must be >= 0")


@dataclass(kw_only=True, frozen=True, slots=True)
class ModelSection:
    """[model]: which model, as the planner was given it, and what it resolved to."""
    source: str
    """The --model the plan was given: a preset name, a config.json path or a model id."""
    name: str
    """The resolved ModelSpec's name."""
    params: int
    """Parameters of the resolved model (all experts counted)."""
    digest: str
    """sha256 of the resolved ModelSpec (job/digest.py): `horizon train --job` checks that the
    source still resolves to the same model."""

    def __post_init__(self):
        check_types(self, "model")
        if not self.source:
            _refuse("model", "source", self.source, "must name a model (a preset, a config.json or a model id)")
        _counts(self, "model", "params", positive=True)


@dataclass(kw_only=True, frozen=True, slots=True)
class RunSection:
    """[run]: how long the run is and its seed (horizon train --steps, --seed)."""
    steps: int = 10
    """Total optimizer steps."""
    seed: int = 0
    """Weight init and data order."""

    def __post_init__(self):
        check_types(self, "run")
        _counts(self, "run", "steps", positive=True)
        if not 0 <= self.seed < 2**64:
            _refuse("run", "seed", self.seed, "must lie in [0, 2**64)")


@dataclass(kw_only=True, frozen=True, slots=True)
class OptimizerSection:
    """[optimizer]: AdamW's hyperparameters and the LR schedule (linear warmup, then cosine
    decay to min_lr), as horizon train's --lr, --warmup-steps, --min-lr, --weight-decay,
    --beta1, --beta2, --eps."""
    lr: float = 3e-4
    """Peak learning rate, in (0, 1]."""
    warmup_steps: int = 0
    """Linear warmup steps."""
    min_lr: float | None = None
    """Floor of the cosine decay (absent: lr / 10)."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8

    def __post_init__(self):
        check_types(self, "optimizer")
        if not (0 < self.lr <= 1):
            _refuse("optimizer", "lr", self.lr, "must lie in (0, 1]")
        _counts(self, "optimizer", "warmup_steps")
        if self.min_lr is not None and not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.lr):
            _refuse("optimizer", "min_lr", self.min_lr, f"must lie in [0, lr={self.lr:g}]")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            _refuse("optimizer", "weight_decay", self.weight_decay, "must be a finite number >= 0")
        for k in ("beta1", "beta2"):
            if not 0 <= getattr(self, k) < 1:
                _refuse("optimizer", k, getattr(self, k), "must lie in [0, 1)")
        if not (math.isfinite(self.eps) and 0 < self.eps <= 1e-2):
            _refuse("optimizer", "eps", self.eps, "must lie in (0, 0.01]")


@dataclass(kw_only=True, frozen=True, slots=True)
class DataSection:
    """[data]: what is trained on and held out (horizon train's data flags)."""
    data: str | None = None
    """A .jsonl or text file (absent: the built-in corpus)."""
    tokenizer: str | None = None
    """tokenizer.json, a folder or model id holding one, or 'bytes' (absent: bytes)."""
    eos_token: str | None = None
    """End-of-document token (absent: the tokenizer's)."""
    eval_fraction: float = 0.05
    """Share of the packed sequences held out for eval, in [0, 1)."""
    eval_every: int = 0
    """Eval every N steps (0: after the last step only)."""
    eval_batches: int = 4
    """Held-out batches per eval (0: no eval)."""

    def __post_init__(self):
        check_types(self, "data")
        if not 0 <= self.eval_fraction < 1:
            _refuse("data", "eval_fraction", self.eval_fraction, "must lie in [0, 1)")
        _counts(self, "data", "eval_every", "eval_batches")
        for k in ("data", "tokenizer", "eos_token"):
            if getattr(self, k) == "":
                _refuse("data", k, "", "is empty; leave the key out for the default")


@dataclass(kw_only=True, frozen=True, slots=True)
class OutputsSection:
    """[outputs]: training checkpoints, the transformers save and the metrics log."""
    ckpt_dir: str | None = None
    """Training checkpoints go here (absent: none)."""
    save_every: int = 0
    """Checkpoint every N steps (0: after the last step only); needs ckpt_dir."""
    keep_ckpts: int = 2
    """Checkpoints kept (0: all)."""
    save_hf: str | None = None
    """After training, write a transformers checkpoint folder here (absent: none)."""
    save_dtype: str = "bf16"
    """dtype of the save_hf weights: fp32 or bf16."""
    save_shard_bytes: int = 5 * 10**9
    """Largest safetensors shard of save_hf, bytes."""
    log_file: str | None = None
    """Append per-step metrics as JSON lines here (absent: none)."""

    def __post_init__(self):
        check_types(self, "outputs")
        _counts(self, "outputs", "save_every", "keep_ckpts")
        _counts(self, "outputs", "save_shard_bytes", positive=True)
        if self.save_dtype not in SAVE_DTYPES:
            _refuse("outputs", "save_dtype", self.save_dtype, f"allowed: {', '.join(SAVE_DTYPES)}")
        if self.save_every and not self.ckpt_dir:
            _refuse("outputs", "save_every", self.save_every, "needs ckpt_dir")
        for k in ("ckpt_dir", "save_hf", "log_file"):
            if getattr(self, k) == "":
                _refuse("outputs", k, "", "is empty; leave the key out for none")


@dataclass(kw_only=True, frozen=True, slots=True)
class PredictionSection:
    """[prediction]: what the planner predicted for one step of this job on its hardware."""
    step_time_s: float
    """One optimizer step, seconds."""
    tokens_per_s: float
    """Trained tokens per second (all ranks)."""
    device_peak_bytes: int
    """Device memory peak, bytes (at most, whatever the timing)."""
    host_bytes: int
    """Host RAM the run needs, bytes (per node)."""
    bottleneck: str
    """What limits the step."""
    fits: bool
    """Whether it fits the device and the host RAM of [hardware]."""
    compute_threads: int | None = None
    """CPU backend: the compute lane's threads the plan priced (the rest of the cores run the
    lanes), as `horizon train --compute-threads auto` picks them; absent on a GPU."""
    schedule_digest: str
    """sha256 of the step's Schedule (job/digest.py): `horizon train --job` builds its own and
    compares."""
    planner_version: str
    """The planner that made this prediction (package version, Schedule format)."""

    def __post_init__(self):
        check_types(self, "prediction")
        for k in ("step_time_s", "tokens_per_s"):
            if not (math.isfinite(getattr(self, k)) and getattr(self, k) >= 0):
                _refuse("prediction", k, getattr(self, k), "must be a finite number >= 0")
        _counts(self, "prediction", "device_peak_bytes", "host_bytes")
        if self.compute_threads is not None:
            _counts(self, "prediction", "compute_threads", positive=True)


@dataclass(kw_only=True, frozen=True, slots=True)
class Job:
    """One job from plan to run: every section above, the machine and the resolved policy."""
    model: ModelSection
    run: RunSection = RunSection()
    policy: Policy
    """Every field resolved (Policy.to_dict(): nothing left to a default)."""
    optimizer: OptimizerSection = OptimizerSection()
    data: DataSection = DataSection()
    outputs: OutputsSection = OutputsSection()
    prediction: PredictionSection
    hardware: HardwareSpec
    """The machine the plan priced, as a hardware file holds it (specs/hardware_io.py)."""

    def __post_init__(self):
        for name, t in (("model", ModelSection), ("run", RunSection), ("policy", Policy),
                        ("optimizer", OptimizerSection), ("data", DataSection), ("outputs", OutputsSection),
                        ("prediction", PredictionSection), ("hardware", HardwareSpec)):
            if not isinstance(getattr(self, name), t):
                raise HorizonError(f"job {name} must be a {t.__name__}, not {type(getattr(self, name)).__name__}")

    @property
    def planned_line(self) -> str:
        """The plan's prediction as one line (horizon train --job prints it at start)."""
        from horizon_sim.units import fmt_bytes
        p = self.prediction
        return (f"plan: step {p.step_time_s:.3g} s, {p.tokens_per_s:,.0f} tokens/s, device peak "
                f"{fmt_bytes(p.device_peak_bytes)}, host {fmt_bytes(p.host_bytes)}, {p.bottleneck}"
                + ("" if p.fits else ", DOES NOT FIT its hardware") + " (the job's prediction)")


SECTIONS = {"model": ModelSection, "run": RunSection, "policy": Policy, "optimizer": OptimizerSection,
            "data": DataSection, "outputs": OutputsSection, "prediction": PredictionSection}
"""The job's tables in the order the file writes them ([hardware] comes last: it is the longest)."""
