"""benchmarks/exec_vs_autograd.py runs each optimizer mode to its figures. Its optimizer-rate
lines re-apply a step's gradients, which only the pipelined mode holds past its step: with
`--optimizer after` (or `backward`) the script used to end in a traceback after the timings,
before it printed the ratio. A one-layer model, one timed step: what is checked is that the
script reaches each line, not the figures."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--layers", "1", "--hidden", "64", "--heads", "2", "--ffn", "128", "--vocab", "256", "--batch", "2",
        "--seq", "32", "--steps", "1", "--warmup", "1", "--compute-dtype", "fp32"]


@pytest.mark.parametrize("optimizer", ["backward"])  # "after" takes the same path
def test_the_benchmark_prints_its_figures_outside_the_pipelined_mode(optimizer):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "exec_vs_autograd.py"), *TINY,
                        "--optimizer", optimizer], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ratio exec/autograd: " in r.stdout and f"--optimizer {optimizer}" in r.stdout
    assert "minor page faults a step: executor " in r.stdout
    assert "compute floor: " in r.stdout
    assert f"--optimizer pipelined: {optimizer} frees the gradients within its step" in r.stdout
    assert "Adam update alone" in r.stdout
