"""A process's first step must not import torch._dynamo (2-3 s on the test machine): torch wraps
a TorchDispatchMode's __torch_dispatch__ in torch._disable_dynamo unless the mode says not to,
and that wrapper imports torch._dynamo on its first call. The executor profiles each op's
temporaries with such modes (device/memtrack.py), and calibrate times kernels with one
(measure/calibrate/timing.py); both derive from device/dispatch_mode.py, which opts out. Checked in a fresh process, where nothing else
has imported it yet."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_STEP = """
import sys, torch
from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_exec.measure.calibrate.timing import KernelTimer
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
spec = ModelSpec(n_layers=2, hidden=64, n_heads=2, n_kv_heads=1, ffn_hidden=176, vocab=256)
pol = Policy(batch=2, seq=16, compute_dtype="fp32", grad_dtype="fp32", working_copy=False, keep_last=1)
with Trainer(spec, pol, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
    loss = tr.step(torch.randint(0, 256, (2, 16))).loss
with KernelTimer() as k:
    torch.ones(4) @ torch.ones(4)
print(loss, k.kernels, "torch._dynamo" in sys.modules)
"""


def test_a_first_step_and_a_kernel_timing_leave_torch_dynamo_unimported():
    r = subprocess.run([sys.executable, "-c", _STEP], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    loss, kernels, dynamo = r.stdout.split()
    assert float(loss) > 0 and int(kernels) > 0  # a step ran (with a kept layer's graph) and a kernel was timed
    assert dynamo == "False"
