"""What a Trainer is configured with besides the model and the policy: frozen dataclasses, one
per concern, each checked when it is made (one-line ConfigError naming the field, its value and
what is allowed; `horizon train` words the same errors with its flags).

    cfg = TrainerConfig(optimizer=OptimizerConfig(lr=3e-4, betas=(0.9, 0.95)),
                        runtime=RuntimeConfig(device="cuda", timeout_s=300),
                        admission=AdmissionConfig(host_budget_bytes=64 << 30), seed=1)
    tr = Trainer(model, policy, cfg)

OptimizerConfig: AdamW's hyper-parameters (optim.check_hyper's rules). RuntimeConfig: the
device and how the run uses it (backend, op timeout, non-finite steps, the disk tier's file).
AdmissionConfig: the up-front check that the run fits (admission.py) and the budgets it checks
against (the device budget is the arena's too). TrainerConfig: the three, the weight-init seed,
and whether the weights are drawn at all.
"""
import math
from dataclasses import dataclass

from horizon_exec.device.backend import check_device
from horizon_exec.errors import ConfigError
from horizon_exec.optim.adamw import check_hyper
from horizon_exec.runtime.disk_store import METHODS as DISK_METHODS
from horizon_exec.runtime.engine import DEFAULT_OP_TIMEOUT_S
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware import HardwareSpec, tracks_every_op

ON_NONFINITE = ("skip", "stop")
TRACK_MEMORY = ("auto", "once", "every")
SEED_LIMIT = 2**64
"""Seeds are torch generator seeds: 64 bits."""


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(kw_only=True, frozen=True, slots=True)
class OptimizerConfig:
    """AdamW (decoupled decay on every parameter, like torch.optim.AdamW over
    model.parameters()); the trainer's lr can be changed between steps."""
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self):
        check_hyper(lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)
        object.__setattr__(self, "betas", tuple(self.betas))


@dataclass(kw_only=True, frozen=True, slots=True)
class RuntimeConfig:
    device: str = "cpu"
    """'cpu' or 'cuda[:N]' (backend.check_device: it must exist here)."""
    compute_threads: int | str | None = "auto"
    """CPU backend: intra-op threads of the compute lane. 'auto': the planner's choice for the
    Schedule (device/core_split.py: all cores when its lanes mostly idle, else all but the
    lanes' need); None: cores - 1 (the split calibrate measures at); N: N."""
    pin_cores: bool = True
    """CPU backend: the compute lane on its own cores, the other lanes on the rest (on compute's,
    time-shared, when compute has them all)."""
    track_memory: str = "auto"
    """CPU backend: how compute ops' device temporaries are measured (a dispatch mode that sees
    every aten op: on small models it costs ~30% of the step). 'every': on every run of every
    op; 'once': an op's first run is measured, later runs of the same op replay it, slice by
    slice of their run, on top of the buffers the other lanes held meanwhile (memtrack.TempProfile;
    the budget is still enforced); 'auto' (the default): 'once' where an op's temporaries cannot change
    from step to step (a dense model without document masks: every tensor's shape is fixed by
    the Schedule), 'every' where the data moves them (MoE routing, document masks).
    See temporaries_for()."""
    timeout_s: float = DEFAULT_OP_TIMEOUT_S
    """A step with no op starting or finishing for this long fails instead of hanging (engine.py)."""
    on_nonfinite: str | None = None
    """'skip' or 'stop' (trainer.py's docstring); None: 'stop' with optimizer='backward', else 'skip'."""
    disk_dir: str | None = None
    """Where the disk tier's file goes (policy disk_tier; None: the system temp dir: point it at
    local NVMe)."""
    disk_method: str = "direct"
    """How the disk tier reads and writes (disk_store.py)."""

    def __post_init__(self):
        ct = self.compute_threads
        if ct is not None and ct != "auto" and not (_whole(ct) and ct >= 1):
            raise ConfigError("compute_threads", ct, "must be >= 1 or 'auto' (the default: the planner's split)")
        t = self.timeout_s
        if not (isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < math.inf):
            raise ConfigError("timeout_s", t, "must be a positive number of seconds")
        if self.on_nonfinite is not None and self.on_nonfinite not in ON_NONFINITE:
            raise ConfigError("on_nonfinite", self.on_nonfinite, f": use one of {', '.join(ON_NONFINITE)}")
        if self.track_memory not in TRACK_MEMORY:
            raise ConfigError("track_memory", self.track_memory, f": use one of {', '.join(TRACK_MEMORY)}")
        if self.disk_method not in DISK_METHODS:
            raise ConfigError("disk_method", self.disk_method, f": allowed: {', '.join(DISK_METHODS)}")
        try:
            check_device(self.device)
        except HorizonError as e:  # its message names the device
            said = str(e).replace("{", "{{").replace("}", "}}")
            raise ConfigError(None, want=said, flag_want="{device}: " + said) from None

    def temporaries_for(self, model, policy) -> str:
        """track_memory under `model` and `policy`, 'auto' resolved: 'once' or 'every'."""
        if self.track_memory != "auto":
            return self.track_memory
        return "every" if tracks_every_op(model, policy) else "once"

    def nonfinite_for(self, policy) -> str:
        """on_nonfinite under `policy`, the default resolved. optimizer='backward' updates each
        layer as its gradient lands, before the loss and the global norm are known: it cannot
        skip a step exactly, so it only stops."""
        if self.on_nonfinite is None:
            return "stop" if policy.optimizer == "backward" else "skip"
        if self.on_nonfinite == "skip" and policy.optimizer == "backward":
            raise HorizonError("on_nonfinite='skip' cannot be exact with optimizer='backward': each layer "
                               "is updated as its gradient lands, before the loss and the global norm are "
                               "known; use on_nonfinite='stop', or optimizer='pipelined' or 'after'")
        return self.on_nonfinite


@dataclass(kw_only=True, frozen=True, slots=True)
class AdmissionConfig:
    enabled: bool = True
    """Check up front that the run fits (admission.py); False skips it."""
    host_budget_bytes: int | None = None
    """Host RAM the run may use (None: MemAvailable + this process)."""
    device_budget_bytes: int | None = None
    """The device side's, and the arena's budget (None: CUDA free memory to the admission,
    no arena limit)."""
    hardware: HardwareSpec | None = None
    """A HardwareSpec whose speeds (and runtime overhead) the admission simulation uses."""
    data_bytes: int = 0
    """Host memory the training data will hold (data.data_bytes_bound)."""

    def __post_init__(self):
        for f in ("host_budget_bytes", "device_budget_bytes"):
            v = getattr(self, f)
            if v is not None and not (_whole(v) and v >= 0):
                raise ConfigError(f, v, "must be a whole number of bytes >= 0 (None: what is free)")
        if not (_whole(self.data_bytes) and self.data_bytes >= 0):
            raise ConfigError("data_bytes", self.data_bytes, "must be a whole number of bytes >= 0")
        if self.hardware is not None and not isinstance(self.hardware, HardwareSpec):
            raise ConfigError("hardware", self.hardware, "must be a HardwareSpec (or None)")


@dataclass(kw_only=True, frozen=True, slots=True)
class TrainerConfig:
    optimizer: OptimizerConfig = OptimizerConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    admission: AdmissionConfig = AdmissionConfig()
    seed: int = 0
    """Weight init (transformers-style, Trainer.init_weights)."""
    random_init: bool = True
    """False leaves the weights zero (for a caller that loads them next, e.g.
    files/hf_checkpoint.load_hf)."""

    def __post_init__(self):
        for f, t in (("optimizer", OptimizerConfig), ("runtime", RuntimeConfig), ("admission", AdmissionConfig)):
            if not isinstance(getattr(self, f), t):
                raise ConfigError(f, getattr(self, f), f"must be a {t.__name__}")
        if not (_whole(self.seed) and 0 <= self.seed < SEED_LIMIT):
            raise ConfigError("seed", self.seed, "must be an integer in [0, 2**64)",
                              flag_want="must lie in [0, 2**64)")
