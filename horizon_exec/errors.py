"""Executor errors. A bad request (a device budget too small for the schedule) is a
HorizonError with a one-line explanation; a failure while running an op is an ExecError that
names the op and its lane and chains the original exception."""
from horizon_sim.errors import HorizonError


class DeviceBudgetError(HorizonError):
    """An allocation would take device memory past the arena's byte budget."""


class ExecError(RuntimeError):
    """An op failed (or a lane hung) while the engine ran a schedule."""

    def __init__(self, message: str, op=None):
        super().__init__(message)
        self.op = op
