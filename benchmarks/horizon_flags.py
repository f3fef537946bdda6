"""The flags that say how Horizon's side of a benchmark runs, shared by exec_vs_autograd.py and
vs_deepspeed.py so both read them alike: its cores (--compute-threads, priced with --hardware),
its policy (the knobs given pin their field; the others are the planner's choice for this
machine, as `horizon train` makes it, unless --no-search), its loss kernel (auto: train's, fused
where the native kernel builds), and the compute dtype both sides of the comparison use (auto:
`horizon train`'s own default for this CPU)."""
from dataclasses import dataclass, field, replace

from horizon_exec.device.compute_dtype import default_compute_dtype
from horizon_exec.device.core_split import threads_arg
from horizon_exec.model.xent import default_loss_kernel
from horizon_sim.cli.policy_args import keep_layers
from horizon_sim.plan.advice import policy_flags
from horizon_sim.plan.pinned import KNOB_DESTS
from horizon_sim.specs.hardware_io import load_hardware
from horizon_sim.specs.policy import CKPT_PLACES, LOSS_KERNELS, MB_ORDERS, OPTIMIZER_MODES, Policy

_KNOBS = {d: f for f, d in KNOB_DESTS.items()
          if d in ("keep_activations", "micro_batches", "mb_order", "act_ckpt_every", "slots", "act_ckpt_on", "optimizer")}
"""The knob flags a benchmark takes: dest -> its Policy field."""


def add_shape_flags(ap) -> None:
    """The Llama-style model and step shape the executor benchmarks share (exec_vs_autograd's,
    lora_vs_peft's): 8 layers x 512, 8 heads, SwiGLU 1376, Llama-2's 32000 vocabulary, 4 x 512."""
    for flag, default in (("--layers", 8), ("--hidden", 512), ("--heads", 8), ("--ffn", 1376), ("--vocab", 32000),
                          ("--batch", 4), ("--seq", 512)):
        ap.add_argument(flag, type=int, default=default)


def add_horizon_flags(ap) -> None:
    ap.add_argument("--compute-threads", type=threads_arg, default="auto", metavar="auto|N",
                    help="Horizon's compute-lane threads (default auto: the planner's split for the step)")
    ap.add_argument("--hardware", default=None, metavar="FILE",
                    help="a hardware file the planner prices Horizon's policy and cores with (default: this "
                         "machine's description, as horizon train uses: its calibration or a quick estimate)")
    ap.add_argument("--keep-activations", type=keep_layers, default=None, metavar="L|all",
                    help="Horizon's Policy.keep_last: the last L layers keep their activations")
    ap.add_argument("--micro-batches", type=int, default=None, help="Horizon's micro-batches")
    ap.add_argument("--mb-order", choices=MB_ORDERS, default=None, help="Horizon's Policy.mb_order")
    ap.add_argument("--act-ckpt-every", type=int, default=None, metavar="K", help="Horizon's checkpoint interval")
    ap.add_argument("--slots", type=int, default=None, help="Horizon's device weight slots")
    ap.add_argument("--act-ckpt-on", choices=CKPT_PLACES, default=None, help="where Horizon's checkpoints live")
    ap.add_argument("--optimizer", choices=OPTIMIZER_MODES, default=None, help="when Horizon's optimizer runs")
    ap.add_argument("--no-search", action="store_true",
                    help="Horizon's knobs not given keep Policy's defaults (default: the planner's choice, as "
                         "horizon train makes it)")
    ap.add_argument("--compute-dtype", choices=("auto", "bf16", "fp32"), default="auto",
                    help="both sides' compute dtype (default auto: horizon train's default for this CPU, bf16 "
                         "only with bf16 matrix instructions: without them a bf16 step runs slower)")
    ap.add_argument("--loss-kernel", choices=("auto", *LOSS_KERNELS), default="auto",
                    help="Horizon's loss kernel (default auto: horizon train's, fused where the native kernel "
                         "builds; torch: the whole-tensor torch kernels the baselines use)")


@dataclass(frozen=True)
class HorizonSide:
    policy: Policy
    """The base policy: the shape, the dtype and the knobs given (others at Policy's defaults)."""
    dtype_why: str
    """Why the compute dtype is what it is, for the printed header."""
    given: frozenset = field(default_factory=frozenset)
    """The knob flags given (argparse dests): pinned in the search."""
    search: bool = True
    hardware: str | None = None
    """--hardware: the file the planner prices the policy with (None: this machine's description)."""
    compute_threads: int | str = "auto"
    """--compute-threads: 'auto' (the planner's core split for the chosen Schedule) or a count."""

    def policy_for(self, model) -> tuple[Policy, str]:
        """(the policy Horizon runs `model` with, one line saying what it is and where from)."""
        if not self.search or set(self.given) >= set(_KNOBS):
            return self.policy, f"Horizon's policy: {policy_flags(self.policy) or 'the defaults'} (--no-search)"
        from horizon_exec.cli.train_policy import step_at_run_split
        from horizon_exec.train.policy_search import plan_policy
        hw = hardware_of(self)
        planned = plan_policy(model, self.policy, self.given, hw, device="cpu")
        if planned.policy is None:
            return self.policy, "Horizon's policy: the defaults (the planner found none that fits)"
        row = planned.result.table.iloc[0]
        # the search ranks on the description's own split, as `horizon train` does; the step is
        # said at the split the run takes, as train's policy line says it
        step_s, at = step_at_run_split(model, planned.policy, planned.hardware, row.step_time_s, "cpu",
                                       self.compute_threads)
        return planned.policy, (f"Horizon's policy: the planner's choice, {policy_flags(planned.policy) or 'the defaults'}"
                                f" (predicted {step_s * 1e3:.0f} ms a step{at}; searched on "
                                f"{planned.hardware.name or planned.hardware.device.name})")


def hardware_of(a):
    """The machine --compute-threads auto prices the split with: --hardware, else this machine's
    description (its cached calibration or a quick estimate), as `horizon train` prices it."""
    if a.hardware:
        return load_hardware(a.hardware)
    from horizon_exec.measure.machine import this_machine
    return this_machine("cpu").hardware


def horizon_side(a, **policy) -> HorizonSide:
    """Horizon's base policy from the flags (and the benchmark's own policy fields), with the
    dtype resolved; an fp32 step computes from the master itself (no working copy)."""
    if a.compute_dtype == "auto":
        dtype, why = default_compute_dtype("cpu")
        why = why or "bf16 matrix instructions"
    else:
        dtype, why = a.compute_dtype, "given"
    given = frozenset(d for d in _KNOBS if getattr(a, d) is not None)
    knobs = {_KNOBS[d]: getattr(a, d) for d in given}
    if "optimizer" in knobs:
        knobs["grad_clip"] = Policy.default_grad_clip(knobs["optimizer"])
    loss = default_loss_kernel("cpu") if a.loss_kernel == "auto" else a.loss_kernel
    pol = replace(Policy(compute_dtype=dtype, working_copy=dtype == "bf16", loss_kernel=loss, **policy), **knobs)
    return HorizonSide(pol, why, given, not a.no_search, a.hardware, a.compute_threads)
