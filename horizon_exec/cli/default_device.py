"""The --device of `horizon train` and `horizon calibrate` when none is given: a CUDA GPU where
torch sees one, else the CPU backend, with the line saying which and why. A --device given is
taken as it is, without asking torch anything (no CUDA initialised for a CPU run)."""


def default_device() -> tuple[str, str]:
    """('cuda' or 'cpu', one line: 'device cuda: a GPU is available (NVIDIA H200)' / 'device cpu: no GPU')."""
    from horizon_exec.measure.machine.detect import cuda_here, gpu
    if cuda_here():
        return "cuda", f"device cuda: a GPU is available ({gpu('cuda')[0]}; --device cpu for the CPU backend)"
    return "cpu", "device cpu: no GPU (torch sees no CUDA device)"


def resolve_device(given: str | None) -> tuple[str, str]:
    """(the device, the line saying why when it was chosen here; '' when given)."""
    return (given, "") if given is not None else default_device()
