"""`horizon calibrate`: measure the machine this runs on, for the executor's backend, and return
a HardwareSpec the planner can simulate with (saved as TOML by the CLI). What each figure is and
how it is measured, figure by figure: docs/calibration.md. `quick=True` shrinks every grid and
does one round (for tests).

The package, a concept a module: timing.py (medians, lane threads, progress, the per-kernel
timer), kernels.py (GEMM, attention, elementwise, loss), host.py (copies, reduce, accumulate,
AdamW, shared cores, bus, RAM), contention.py (lanes together), overheads.py (the tiny
serialized model: per-op costs, runtime RSS), cpu.py and cuda.py (each backend's whole run).
"""
from horizon_exec.measure.calibrate.cpu import calibrate_cpu
from horizon_exec.measure.calibrate.cuda import calibrate_cuda
from horizon_exec.measure.calibrate.kernels import block_pass
from horizon_exec.measure.calibrate.timing import KernelTimer
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

__all__ = ["calibrate", "KernelTimer", "block_pass"]


def calibrate(device: str = "cpu", *, quick: bool = False, model: ModelSpec | None = None,
              policy: Policy | None = None, say=print, rounds: int | None = None, disk_dir=None,
              disk_io: str = "direct") -> HardwareSpec:
    """Measure this machine for the executor on `device` ('cpu' or 'cuda[:N]'). `model` and
    `policy` add their exact GEMM shapes to the table. `say`: progress lines (None: quiet).
    `rounds`: how many times the cheap, noise-prone measurements (attention, elementwise,
    per-op costs, copies, AdamW) are repeated, spread over the run (default 3, quick 1); each
    figure is the mean over rounds of its time. `disk_dir`: the folder whose disk the disk tier
    would use (default: the system temp dir), `disk_io` how the disk tier reads and writes it."""
    rounds = rounds or (1 if quick else 3)
    from horizon_exec.measure.arg_bounds import ROUNDS, check_disk_dir
    if not ROUNDS[0] <= rounds <= ROUNDS[1]:
        raise HorizonError(f"rounds={rounds} must be in {ROUNDS[0]}..{ROUNDS[1]}")
    check_disk_dir(disk_dir)  # before the minutes of measuring that come first
    if device == "cpu":
        return calibrate_cpu(quick, model, policy, say, rounds, (disk_dir, disk_io))
    if device.startswith("cuda"):
        return calibrate_cuda(device, quick, model, policy, say, rounds, (disk_dir, disk_io))
    raise HorizonError(f"device {device!r}: calibrate measures 'cpu' or 'cuda[:N]'")
