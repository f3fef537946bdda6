"""horizon_exec: the streaming executor. Runs the Schedule that horizon_sim builds, for real.

Importing this package does not import torch (the `horizon` CLI imports horizon_exec.cli.train_cmd at
startup); `Trainer` and friends load on first use.
"""
_LAZY = {
    "Trainer": "horizon_exec.runtime.trainer", "StepResult": "horizon_exec.runtime.trainer",
    "TrainerConfig": "horizon_exec.runtime.config", "OptimizerConfig": "horizon_exec.runtime.config",
    "RuntimeConfig": "horizon_exec.runtime.config", "AdmissionConfig": "horizon_exec.runtime.config",
    "ExecError": "horizon_exec.errors", "DeviceBudgetError": "horizon_exec.errors",
    "AdamW": "horizon_exec.optim.adamw", "DecoderBlock": "horizon_exec.model.block",
}
__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'horizon_exec' has no attribute {name!r}")
