"""What this machine is, as the planner compares machines: the device kind (the CPU backend, or
which GPU and its memory), the host's RAM, CPU model, core count and feature flags, and the
torch build. Nothing here imports torch at import time, and CUDA is touched only to name the
GPU of a CUDA device (torch.cuda.is_available first: no driver, no GPU).

Moved here from horizon_exec/cli/job_machine.py (which re-exports host_ram_GiB, _gpu, _cuda_here
and _model_token under their old names) so that the job's machine comparison and this
machine's description (machine/__init__.py) read the machine one way.
"""
import hashlib
import json
import os
import re

from horizon_sim.units import GiB


def host_ram_GiB() -> float:
    """MemTotal, as `horizon calibrate` records a machine's RAM."""
    from horizon_exec.procfs import meminfo_bytes
    total = meminfo_bytes("MemTotal")
    return (total or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / GiB


def cuda_here() -> bool:
    """torch sees a CUDA device (imports torch; initialises no CUDA context)."""
    import torch
    return torch.cuda.is_available()


def gpu(device: str) -> tuple[str, float]:
    """(name, memory GiB) of the CUDA device `device` names ('cuda' or 'cuda:N')."""
    import torch
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    props = torch.cuda.get_device_properties(index)
    return props.name, props.total_memory / GiB


def model_token(name: str) -> str:
    """'h100' of 'h100-sxm', 'NVIDIA H100 80GB HBM3'; 'rtx4090' of 'rtx-4090': a GPU's model."""
    flat = re.sub(r"[^a-z0-9]", "", name.lower()).removeprefix("nvidia")
    m = re.search(r"[a-z]+\d+", flat)
    return m.group(0) if m else flat


def torch_version() -> str:
    """torch's major.minor from its installed metadata (no import): kernels change between them."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return ".".join(version("torch").split("+")[0].split(".")[:2])
    except PackageNotFoundError:
        return "none"


KERNELS = 3
"""The generation of Horizon's own kernels a calibration times; bump it when one changes what
it measures, so older calibrations are not used (2: the fused loss kernel, xent.c; 3: its own
figure, fused_loss_ns_per_logit, and thread_kernel_speed)."""


def machine_key(device: str) -> dict:
    """What identifies this machine's speeds for `device` ('cpu' or 'cuda[:N]'): the device
    kind (the GPU's name), the CPU model, its feature flags (two VM kinds may share a model
    name, not their instruction sets), the core count, the RAM in whole GiB, torch's version
    and the generation of Horizon's kernels (KERNELS). A calibration is used only on a machine
    with the same key."""
    from horizon_exec.procfs import cpu_flags, cpu_name
    flags = hashlib.sha256(cpu_flags().encode()).hexdigest()[:12]
    return {"device": "cpu" if device == "cpu" else gpu(device)[0], "cpu": cpu_name(), "cpu_flags": flags,
            "cores": os.cpu_count() or 1, "ram_GiB": round(host_ram_GiB()), "torch": torch_version(),
            "kernels": KERNELS}


def key_name(key: dict) -> str:
    """A file name stem for `key`: its device kind, then a hash of every field."""
    kind = "cpu" if key["device"] == "cpu" else model_token(key["device"]) or "gpu"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return f"{kind}-{key['cores']}c-{key['ram_GiB']}GiB-{digest}"
