"""The long fuzz run of every reader of user input (tests/test_fuzz_readers.py, which `make test`
runs with a few dozen examples each): config.json, JSONL and text data, the safetensors index
and files, tokenizer.json and tokenizer_config.json, sweep grids, hardware TOML and the
planner's flags. Prints, per reader, the examples hypothesis ran and how many failed (a failure
is anything but a read or a one-line HorizonError).

    .venv/bin/python benchmarks/fuzz_readers.py                 # 2,000 examples per reader
    .venv/bin/python benchmarks/fuzz_readers.py --examples 500
"""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000, help="examples per reader (default 2000)")
    a = ap.parse_args()
    if a.examples < 1:
        ap.error(f"--examples {a.examples} must be >= 1")
    env = {**os.environ, "HORIZON_FUZZ_EXAMPLES": str(a.examples)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics",
                        "tests/test_fuzz_readers.py", "-k", "not full and not refused"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    rows = re.findall(r"test_fuzz_readers\.py::(\w+):\n\n?\s+- during generate phase.*?\n\s+- (\d+) passing, (\d+) failing",
                      r.stdout, flags=re.S)
    if not rows:  # hypothesis's statistics layout differs by version: fall back to a looser match
        rows = re.findall(r"test_fuzz_readers\.py::(\w+):.*?(\d+) passing, (\d+) failing", r.stdout, flags=re.S)
    print(f"{'reader':<34} {'examples':>9} {'failing':>8}")
    total_fail = 0
    for name, ok, bad in rows:
        total_fail += int(bad)
        print(f"{name:<34} {int(ok) + int(bad):>9,} {int(bad):>8}")
    verdict = "PASS" if r.returncode == 0 and total_fail == 0 and rows else "FAIL"
    print(f"{verdict}: {len(rows)} readers, {a.examples:,} examples asked of each, {total_fail} failing")
    if verdict == "FAIL":
        print(r.stdout[-4000:], r.stderr[-2000:], sep="\n")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
