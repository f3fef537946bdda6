"""The flags that say how Horizon's side of a benchmark runs, shared by exec_vs_autograd.py and
vs_deepspeed.py so both read them alike: its cores (--compute-threads, priced with --hardware),
which layers keep their activations, its micro-batches and their order, and the compute dtype
both sides of the comparison use (auto: `horizon train`'s own default for this CPU)."""
from dataclasses import dataclass

from horizon_exec.device.compute_dtype import default_compute_dtype
from horizon_exec.device.core_split import threads_arg
from horizon_sim.cli.policy_args import keep_layers
from horizon_sim.specs.hardware_io import load_hardware
from horizon_sim.specs.policy import MB_ORDERS, Policy


def add_horizon_flags(ap) -> None:
    ap.add_argument("--compute-threads", type=threads_arg, default="auto", metavar="auto|N",
                    help="Horizon's compute-lane threads (default auto: the planner's split for the step)")
    ap.add_argument("--hardware", default=None, metavar="FILE",
                    help="a calibrated hardware file that --compute-threads auto prices the split with")
    ap.add_argument("--keep-activations", type=keep_layers, default=0, metavar="L|all",
                    help="Horizon's Policy.keep_last: the last L layers keep their activations (default 0)")
    ap.add_argument("--micro-batches", type=int, default=1, help="Horizon's micro-batches (default 1)")
    ap.add_argument("--mb-order", choices=MB_ORDERS, default="micro", help="Horizon's Policy.mb_order")
    ap.add_argument("--compute-dtype", choices=("auto", "bf16", "fp32"), default="auto",
                    help="both sides' compute dtype (default auto: horizon train's default for this CPU, bf16 "
                         "only with bf16 matrix instructions: without them a bf16 GEMM runs tens of times slower)")


@dataclass(frozen=True)
class HorizonSide:
    policy: Policy
    dtype_why: str
    """Why the compute dtype is what it is, for the printed header."""


def hardware_of(a):
    """The --hardware file --compute-threads auto prices the split with (None: an estimate)."""
    return load_hardware(a.hardware) if a.hardware else None


def horizon_side(a, **policy) -> HorizonSide:
    """Horizon's policy from the flags (and the benchmark's own policy fields), with the dtype
    resolved; an fp32 step computes from the master itself (no working copy)."""
    if a.compute_dtype == "auto":
        dtype, why = default_compute_dtype("cpu")
        why = why or "bf16 matrix instructions"
    else:
        dtype, why = a.compute_dtype, "given"
    pol = Policy(keep_last=a.keep_activations, micro_batches=a.micro_batches, mb_order=a.mb_order,
                 compute_dtype=dtype, working_copy=dtype == "bf16", **policy)
    return HorizonSide(pol, why)
