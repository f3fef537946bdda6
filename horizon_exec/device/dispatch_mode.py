"""The base of Horizon's dispatch modes (memtrack.TransientTracker, calibrate's KernelTimer): a
TorchDispatchMode whose __torch_dispatch__ torch leaves as it is. By default torch wraps a
mode's __torch_dispatch__ in torch._disable_dynamo, whose first call imports torch._dynamo:
seconds added to the first op a process runs under the mode, i.e. to every run's first step.
Nothing run under these modes is compiled, so there is nothing for that wrapper to keep out
(tests/test_first_step_imports.py)."""
from torch.utils._python_dispatch import TorchDispatchMode


class UncompiledDispatchMode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # torch's opt-out: its __init_subclass__ then leaves __torch_dispatch__ unwrapped
