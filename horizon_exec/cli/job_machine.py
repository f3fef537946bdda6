"""Is this machine the one a job was planned on? What differs (`horizon train --job` then does
what --on-other-machine says: job_run.py).

Compared (docs/job.md): the device kind (the CPU backend or a GPU), the GPU's model and memory,
the host RAM and the CPU count. Memory within MEMORY_TOLERANCE counts as equal (a file written
by `horizon calibrate` on this machine holds these very figures; a preset holds round ones).
"""
import os

# This machine's facts live with its description (measure/machine/detect.py), under their old names here.
from horizon_exec.measure.machine import detect
from horizon_exec.measure.machine.detect import gpu as _gpu
from horizon_exec.measure.machine.detect import host_ram_GiB
from horizon_exec.measure.machine.detect import model_token as _model_token
from horizon_sim.specs.cpu_ranks import is_cpu_backend
from horizon_sim.specs.hardware import HardwareSpec

MEMORY_TOLERANCE = 0.05
"""Relative difference of two memory sizes below which they are the same machine's."""


def _same_size(a: float, b: float) -> bool:
    return abs(a - b) <= MEMORY_TOLERANCE * max(a, b, 1e-9)


def differences(hw: HardwareSpec, device: str) -> list[str]:
    """What this machine (running on `device`) has that the job's `hw` does not: one phrase each."""
    out = []
    job_cpu, here_cpu = is_cpu_backend(hw), device == "cpu"
    if job_cpu != here_cpu:
        out.append(f"device {device} (the job's: {'the CPU backend' if job_cpu else hw.device.name})")
    elif not here_cpu and not detect.cuda_here():
        out.append(f"device {device}: no CUDA device here")
    elif not here_cpu:
        name, mem = _gpu(device)
        if _model_token(name) != _model_token(hw.device.name):
            out.append(f"GPU {name} (the job's: {hw.device.name})")
        if not _same_size(mem, hw.device.hbm_GiB):
            out.append(f"device memory {mem:.1f} GiB (the job's: {hw.device.hbm_GiB:.1f} GiB)")
    ram = host_ram_GiB()
    if not _same_size(ram, hw.host.ram_GiB):
        out.append(f"host RAM {ram:.1f} GiB (the job's: {hw.host.ram_GiB:.1f} GiB)")
    cores = os.cpu_count() or 1
    if cores != hw.host.cores:
        out.append(f"{cores} CPU cores (the job's: {hw.host.cores})")
    return out

