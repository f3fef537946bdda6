"""Kill -9 at random moments, resume as a user would, compare with the uninterrupted run.

    .venv/bin/python benchmarks/kill_resume.py [--kills 100] [--seed 0] [--steps 6] [--setups a,b]
                                               [--jobs 1] [--keep DIR]

Scenario: a user trains a small model with checkpoints every other step, an eval every third
step and `--save-hf`; the machine kills the process (SIGKILL: the OOM killer, a pre-empted
node) at any moment. The user re-runs the same command, adding `--resume` when the checkpoint
folder holds a checkpoint, until it exits 0. The resumed run must end where the uninterrupted
one did: every step's loss and grad norm and every eval loss (the last logged value of each,
since steps after the last checkpoint run twice), the final checkpoint's tensors and the
`--save-hf` weights, all bit for bit.

For each policy setup (SETUPS) one uninterrupted reference run is timed, line by line; each
kill is a moment drawn uniformly between the reference's first output line (the model is
built) and its end, taken as 'so long after line i' (kill_point), so a trial on a machine
faster or slower than the reference's still dies between the same two events; it is sent to
the whole process group. Kills are spread over the setups in turn. Prints one line per
kill that was not exact (setup, moment, the last line the killed run printed, what differed),
a line per setup, and the total 'N of M kills resumed bit-exactly'. Exit 0 when all were.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HORIZON = [sys.executable, "-m", "horizon_sim.cli.main", "train"]

# The run every setup shares: 6 steps of the tiny preset on the built-in corpus, a checkpoint every
# other step (so a kill can land before the first, between two, or after the last checkpoint),
# an eval every third step (one of them the final step's, after its checkpoint) and an HF save.
BASE = ["--model", "tiny", "--batch", "2", "--seq", "64", "--save-every", "2", "--eval-every", "3",
        "--eval-batches", "2", "--no-progress"]

# name -> policy flags: the optimizer modes, the checkpoint interval and place, kept activations,
# micro-batch orders, each master, the disk tier, document masks, both compute dtypes.
SETUPS = {
    "default": [],
    "after-clip": ["--optimizer", "after", "--grad-clip", "1.0"],
    "backward": ["--optimizer", "backward"],
    "k2-device": ["--act-ckpt-every", "2", "--act-ckpt-on", "device"],
    "keep-all": ["--keep-activations", "all"],
    "micro2": ["--micro-batches", "2"],
    "layer-order": ["--micro-batches", "2", "--mb-order", "layer"],
    "fp32-master": ["--master-dtype", "fp32"],
    "bf16-stochastic": ["--master-dtype", "bf16", "--master-rounding", "stochastic"],
    "disk-tier": ["--disk-tier", "moments+low"],
    "doc-masks": ["--doc-masks"],
    "fp32-compute": ["--compute-dtype", "fp32", "--master-dtype", "fp32"],
    "host-grads": ["--optimizer", "backward", "--max-host-grads", "2"],
}


@dataclass
class Run:
    """One process: its exit code, wall time, and each stdout line with the second it arrived."""
    rc: int
    wall_s: float
    lines: list = field(default_factory=list)   # [(t_s, line)]
    stderr: str = ""


def run(cmd: list[str], cwd: Path, kill_at_s: float | None = None, after_line: int = -1) -> Run:
    """Run `cmd` to its end; with kill_at_s, SIGKILL it that long after its `after_line`-th
    stdout line arrived (-1: after its start)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)   # its own group: the kill takes every thread and child
    out = Run(rc=0, wall_s=0.0)

    def read_stdout():
        for line in p.stdout:
            out.lines.append((time.perf_counter() - t0, line.rstrip("\n")))
    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    err = []
    err_reader = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    err_reader.start()
    if kill_at_s is not None:
        while len(out.lines) <= after_line and p.poll() is None:   # the anchor line first
            time.sleep(0.005)
        try:
            p.wait(timeout=kill_at_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    reader.join()
    err_reader.join()
    out.rc, out.wall_s, out.stderr = p.returncode, time.perf_counter() - t0, "".join(err)
    return out


def command(setup: str, folder: Path, steps: int, resume: bool) -> list[str]:
    cmd = [*HORIZON, *BASE, "--steps", str(steps), *SETUPS[setup], "--ckpt-dir", str(folder / "ck"),
           "--save-hf", str(folder / "hf"), "--log-file", str(folder / "log.jsonl")]
    if "--disk-tier" in SETUPS[setup]:
        (folder / "disk").mkdir(exist_ok=True)
        cmd += ["--disk-dir", str(folder / "disk")]
    return cmd + (["--resume"] if resume else [])


def has_checkpoint(folder: Path) -> bool:
    ck = folder / "ck"
    return ck.is_dir() and any(p.name.startswith("step-") and p.is_dir() for p in ck.iterdir())


def last_logged(folder: Path) -> dict:
    """(step, key) -> the value the last run that logged it wrote (a re-run step overwrites)."""
    seen = {}
    for line in (folder / "log.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for key in ("loss", "grad_norm", "eval_loss"):
            if key in rec:
                seen[(rec["step"], key)] = rec[key]
    return seen


def tensors(files: list[Path]) -> dict:
    from safetensors.torch import load_file
    out = {}
    for f in files:
        out.update(load_file(f))
    return out


def final_state(folder: Path) -> dict:
    steps = sorted(p for p in (folder / "ck").iterdir() if p.name.startswith("step-"))
    return tensors([steps[-1] / "state.safetensors"]) if steps else {}


def hf_weights(folder: Path) -> dict:
    return tensors(sorted((folder / "hf").glob("*.safetensors")))


def differences(ref: Path, got: Path) -> list[str]:
    import torch
    diffs = []
    want, have = last_logged(ref), last_logged(got)
    missing = sorted(set(want) - set(have))
    if missing:
        diffs.append(f"not logged: {', '.join(f'step {s} {k}' for s, k in missing[:4])}")
    unequal = [k for k in want if k in have and want[k] != have[k]]
    if unequal:
        s, k = unequal[0]
        diffs.append(f"{len(unequal)} logged value(s) differ, first step {s} {k}: {have[(s, k)]!r} vs {want[(s, k)]!r}")
    for what, get in (("final checkpoint", final_state), ("--save-hf", hf_weights)):
        a, b = get(ref), get(got)
        if set(a) != set(b):
            diffs.append(f"{what}: tensors {sorted(set(a) ^ set(b))[:3]} present in one run only")
            continue
        bad = [n for n in a if not torch.equal(a[n], b[n])]
        if bad:
            diffs.append(f"{what}: {len(bad)} tensor(s) differ, first {bad[0]}")
    return diffs


def kill_point(times: list[float], end_s: float, u: float) -> tuple[int, float]:
    """(anchor line, seconds after it): the moment u in [0, 1) of the reference's run from its
    first line to its end, as 'this long after line i' (the gap to line i+1 in the same
    proportion). A trial kills that long after its own line i, so a machine slower or faster
    than during the reference still has the kill land between the same two events."""
    at = times[0] + u * (end_s - times[0])
    i = max(k for k, t in enumerate(times) if t <= at)
    return i, at - times[i]


def trial(setup: str, steps: int, ref: Path, times: list[float], end_s: float, u: float,
          folder: Path) -> tuple[bool, str]:
    line, delay = kill_point(times, end_s, u)
    killed = run(command(setup, folder, steps, resume=False), folder, kill_at_s=delay, after_line=line)
    anchor = killed.lines[line][1] if len(killed.lines) > line else "?"
    last = killed.lines[-1][1] if killed.lines else "(nothing printed)"
    short = (lambda t: t.replace(str(folder) + "/", "")[:60])
    where = (f"kill {delay:.2f} s after line {line} '{short(anchor)}', last line '{short(last)}'"
             if killed.rc == -signal.SIGKILL else f"finished before its kill (exit {killed.rc})")
    for attempt in range(3):   # the user re-runs until it exits 0; more than one re-run is itself a finding
        again = run(command(setup, folder, steps, resume=has_checkpoint(folder)), folder)
        if again.rc == 0:
            break
    else:
        tail = again.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        return False, f"{where}: re-run exit {again.rc}: {tail[0][:160]}"
    diffs = differences(ref, folder)
    if attempt:
        diffs.insert(0, f"needed {attempt + 1} re-runs")
    return not diffs, f"{where}: " + "; ".join(diffs) if diffs else where


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=100, help="kills in all, spread over the setups (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments (default 0)")
    ap.add_argument("--steps", type=int, default=6, help="steps of each run (default 6)")
    ap.add_argument("--setups", default="all", help=f"comma-separated subset of: {', '.join(SETUPS)} (default all)")
    ap.add_argument("--jobs", type=int, default=1, help="trials run side by side (default 1)")
    ap.add_argument("--verbose", action="store_true", help="a line for every kill, exact or not")
    ap.add_argument("--keep", default=None, help="keep every trial's folder under DIR (default: a temporary "
                                                 "folder, removed at the end)")
    a = ap.parse_args()
    names = list(SETUPS) if a.setups == "all" else a.setups.split(",")
    bad = [n for n in names if n not in SETUPS]
    if bad or a.kills < 1 or a.steps < 2 or a.jobs < 1:
        ap.error(f"bad --setups {bad}" if bad else "--kills >= 1, --steps >= 2 and --jobs >= 1")
    base = Path(a.keep or tempfile.mkdtemp(prefix="kill-resume-")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    refs = {}
    for name in names:   # one uninterrupted run per setup: the answer and the kill window
        folder = base / f"ref-{name}"
        folder.mkdir()
        r = run(command(name, folder, a.steps, resume=False), folder)
        if r.rc != 0:
            print(f"{name}: the uninterrupted run failed (exit {r.rc}): {r.stderr.strip()[-300:]}")
            return 1
        times = [t for t, _ in r.lines] or [0.0]
        refs[name] = (folder, times, r.wall_s)
        print(f"{name}: reference {r.wall_s:.1f} s, {len(r.lines)} lines; kills drawn between its first line "
              f"({times[0]:.1f} s) and its end", flush=True)
    plan = [(i, names[i % len(names)], rng.random()) for i in range(a.kills)]   # the seed fixes every moment

    def one(item):
        i, name, u = item
        folder = base / f"kill-{i:03d}-{name}"
        folder.mkdir()
        ref, times, end_s = refs[name]
        ok, what = trial(name, a.steps, ref, times, end_s, u, folder)
        if not a.keep and ok:
            shutil.rmtree(folder, ignore_errors=True)
        return name, ok, what

    from concurrent.futures import ThreadPoolExecutor
    tally = {n: [0, 0] for n in names}
    with ThreadPoolExecutor(a.jobs) as pool:
        for k, (name, ok, what) in enumerate(pool.map(one, plan), 1):
            tally[name][0] += 1
            tally[name][1] += ok
            if not ok or a.verbose:
                print(f"  {'exact' if ok else 'NOT EXACT'} {name}: {what}", flush=True)
            if k % 10 == 0:
                print(f"  {k} of {a.kills} kills done", flush=True)
    for name, (n, exact) in tally.items():
        print(f"{name:16s} {exact} of {n} exact")
    exact = sum(e for _, e in tally.values())
    print(f"{exact} of {a.kills} kills resumed bit-exactly ({len(names)} setups, {a.steps} steps each)")
    if not a.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if exact == a.kills else 1


if __name__ == "__main__":
    sys.exit(main())
