"""`horizon train`'s default master on the machine it runs on.

Policy's default is the split master wherever the policy allows it (split_possible): the exact
fp32 master in 4 bytes per parameter with its working copy. The split needs the native
kernels (optim/split.py); where they do not build (no C compiler, HORIZON_NATIVE=0) the
default is the whole fp32 master, which the optimizer then updates with torch's kernels,
rather than a run that stops on its default.
"""
from horizon_sim.specs.policy import split_possible


def default_master(compute_dtype: str, working_copy: bool) -> str | None:
    """--master-dtype when none is given: None (Policy's default) where the split can be
    built, 'fp32' where the policy wants a split but this machine has no native kernels."""
    if not split_possible(compute_dtype, working_copy):
        return None  # Policy resolves it: the whole fp32 master
    from horizon_exec.optim import native
    return None if native.kernels() is not None else "fp32"
