"""The long fuzz run of every reader of user input (tests/test_fuzz_readers.py, which `make test`
runs with a few dozen examples each): config.json, JSONL and text data, chat records through a
chat template, the safetensors index, files and headers, tokenizer.json and
tokenizer_config.json, the local HF cache's refs, checkpoint metadata and the `latest`
pointer, sweep grids, hardware TOML and its numbers' ranges, and the planner's flags.

Prints, per reader, the examples run and their outcomes: accepted (read), refused (a one-line
HorizonError; the CLI: exit 2) and other (anything else: a traceback, a hang cut short, a
message of several lines), which must be 0; then one line with the totals.

    .venv/bin/python benchmarks/fuzz_readers.py                 # 2,000 examples per reader
    .venv/bin/python benchmarks/fuzz_readers.py --examples 500
"""
import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000, help="examples per reader (default 2000)")
    a = ap.parse_args()
    if not 1 <= a.examples <= 10**6:
        ap.error(f"--examples {a.examples} must be in 1..1000000")
    with tempfile.TemporaryDirectory() as tmp:
        counts = Path(tmp) / "counts"
        env = {**os.environ, "HORIZON_FUZZ_EXAMPLES": str(a.examples), "HORIZON_FUZZ_COUNTS": str(counts),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/test_fuzz_readers.py", "-k", "not full and not refused"],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        lines = counts.read_text().split("\n") if counts.exists() else []
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for ln in filter(None, lines):
        test, outcome = ln.rsplit(" ", 1)
        tally[test.removeprefix("test_")][outcome] += 1
    print(f"{'reader':<28} {'examples':>9} {'accepted':>9} {'refused':>9} {'other':>6}")
    total = collections.Counter()
    for name in sorted(tally):
        c = tally[name]
        total.update(c)
        print(f"{name:<28} {sum(c.values()):>9,} {c['accepted']:>9,} {c['refused']:>9,} {c['other']:>6}")
    ok = r.returncode == 0 and total["other"] == 0 and tally
    print(f"{'PASS' if ok else 'FAIL'}: {len(tally)} readers, {sum(total.values()):,} examples "
          f"({a.examples:,} asked of each): {total['accepted']:,} accepted, {total['refused']:,} refused, "
          f"{total['other']} other")
    if not ok:
        print(r.stdout[-4000:], r.stderr[-2000:], sep="\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
