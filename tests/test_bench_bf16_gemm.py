"""benchmarks/bf16_gemm.py reaches its table (one row per GEMM of a layer and its attention's
backward, their ratios) and refuses
a bad count in one line; a few tokens, one round: what is checked is the script, not the figures."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bf16_gemm.py"


def test_the_benchmark_prints_a_row_per_kernel_and_the_layers_total():
    r = subprocess.run([sys.executable, str(SCRIPT), "--tokens", "16", "--rounds", "1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if re.search(r"ms +[\d.]+x +[\d.]+x$", line)]
    assert len(rows) == 11 and rows[-1].startswith("layer total"), r.stdout
    # the forward's x W^T of the tiny model's qkv: 16 tokens x hidden 256 x (256 + 2 x 128)
    assert re.match(r"qkv x W\^T +16x256x512 ", rows[0]), rows[0]
    # the attention over the 16 tokens as one sequence (fewer than --seq), 8 heads on 4 kv heads
    assert re.match(r"attention backward +1x16, 8/4h ", rows[-2]), rows[-2]


def test_a_bad_count_is_one_line_exit_2():
    r = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "0"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith("--rounds 0: must be at least 1")
