"""Long fuzz of the training-checkpoint readers (trainer.json, SHA256SUMS, the state file's
header): tests/test_ckpt_readers_fuzzed.py with many more examples per reader than `make test`
runs, random (not derandomized) each time.

    .venv/bin/python benchmarks/fuzz_ckpt.py [--examples 3000]

Prints, per reader, the examples run and how many were valid (hypothesis' statistics), and
PASS/FAIL: every example either loaded, fell back to the previous checkpoint with a warning
naming the damaged file, or was refused in one line naming the checkpoint."""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=3000, help="examples per reader (default 3000)")
    a = ap.parse_args()
    env = dict(os.environ, HORIZON_FUZZ_EXAMPLES=str(a.examples), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:warnings", "--hypothesis-show-statistics",
                        "tests/test_ckpt_readers_fuzzed.py"], cwd=ROOT, env=env, capture_output=True, text=True)
    stats = r.stdout.split("Hypothesis Statistics")[-1]
    for test, body in re.findall(r"test_ckpt_readers_fuzzed.py::(\w+):\n(.*?)(?=\ntests/|\n=+|\Z)", stats, re.S):
        gen = re.search(r"during generate phase.*?(\d+) passing, (\d+) failing, and (\d+) invalid", body, re.S)
        print(f"{test}: " + (f"{gen.group(1)} passing, {gen.group(2)} failing, {gen.group(3)} invalid examples"
                             if gen else "no statistics"))
    print("PASS" if r.returncode == 0 else "FAIL\n" + r.stdout[-4000:] + r.stderr[-2000:])
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
