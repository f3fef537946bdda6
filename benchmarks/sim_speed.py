"""How fast the planner is (GitHub issue 2's performance targets).

1. build + simulate one step of the dense-120b preset on an H200 in-process: median of 5;
2. `horizon plan --model dense-120b --gpu h200 --ram 1.5TB` as a whole process (interpreter
   start, imports, plan, print): median of 3;
3. a 1,000-configuration sweep through the Python API (model preset x gpu preset x batch x K x
   slots x optimizer) on all cores with a multiprocessing Pool.

Run: .venv/bin/python benchmarks/sim_speed.py
Against an older commit side by side: check it out in a worktree and run its copy of this file
with `--module` there (this tree's venv: its `horizon` script would plan with this tree's code;
`python -m` from the worktree's root plans with the worktree's). Interleave the runs: a busy
machine moves every figure."""
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import time
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from horizon_sim.errors import HorizonError  # noqa: E402
from horizon_sim.schedule import build_schedule  # noqa: E402
from horizon_sim.sim.simulate import simulate  # noqa: E402
from horizon_sim.specs.hardware_presets import make_hardware  # noqa: E402
from horizon_sim.specs.model_presets import model_preset  # noqa: E402
from horizon_sim.specs.policy import Policy  # noqa: E402

TARGET_SIM_S = 0.5
TARGET_CLI_S = 2.0
TARGET_SWEEP_S = 60.0
N_SWEEP = 1000

PLAN_ARGS = ["plan", "--model", "dense-120b", "--gpu", "h200", "--ram", "1.5TB"]


def _line(what: str, seconds: float | None, target: float, extra: str = "") -> None:
    if seconds is None:
        print(f"{what}: skipped{extra}")
        return
    ok = "ok" if seconds < target else "MISSED"
    print(f"{what}: {seconds:.3f} s (target < {target:g} s) {ok}{extra}")


def bench_sim_one_step(repeats: int = 5) -> float:
    model = model_preset("dense-120b")
    hw = make_hardware("h200", "1.5TB")
    policy = Policy()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        simulate(build_schedule(model, policy), hw)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cli_command(module: bool = False) -> tuple[list[str] | None, str]:
    exe = Path(sys.executable).with_name("horizon")
    if module:
        return [sys.executable, "-m", "horizon_sim.cli.main", *PLAN_ARGS], "python -m horizon_sim.cli.main"
    if exe.exists():
        return [str(exe), *PLAN_ARGS], "horizon"
    if shutil.which("horizon"):
        return [shutil.which("horizon"), *PLAN_ARGS], "horizon"
    probe = subprocess.run([sys.executable, "-c", "import horizon_sim.cli.main"], cwd=ROOT,
                           capture_output=True)
    if probe.returncode == 0:
        return [sys.executable, "-m", "horizon_sim.cli.main", *PLAN_ARGS], "python -m horizon_sim.cli.main"
    return None, ""


def bench_cli(repeats: int = 3, module: bool = False) -> tuple[float | None, str]:
    cmd, name = _cli_command(module)
    if cmd is None:
        return None, " (no `horizon` console script and no horizon_sim.cli.main module yet)"
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        # exit 0 = fits, 1 = does not fit (a verdict, not a failure); anything else is a crash
        if out.returncode not in (0, 1):
            return None, f" (`{name} {' '.join(PLAN_ARGS)}` exited {out.returncode}: " \
                         f"{out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ''})"
    return statistics.median(times), f" [{name}]"


MODELS = ["qwen2.5-0.5b", "llama-3.1-8b", "qwen2.5-14b", "llama-2-70b", "dense-120b"]
GPUS = ["h100-sxm", "h200", "a100-80gb", "rtx-4090", "gh200"]
BATCHES = [1, 4, 8, 16]
KS = [1, 2, 4]
SLOTS = [2, 3]
OPTIMIZERS = ["after", "pipelined"]


def sweep_configs(n: int = N_SWEEP) -> list[tuple]:
    grid = list(itertools.product(MODELS, GPUS, BATCHES, KS, SLOTS, OPTIMIZERS))  # 1,200
    step = len(grid) / n
    return [grid[int(i * step)] for i in range(n)]


def run_config(cfg) -> tuple[bool, float]:
    model, gpu, batch, K, slots, opt = cfg
    hw = make_hardware(gpu, "1TB", host="desktop" if gpu.startswith("rtx") else "default")
    try:
        r = simulate(build_schedule(model_preset(model),
                                    Policy(batch=batch, seq=2048, act_ckpt_every=K, slots=slots,
                                           optimizer=opt)), hw)
    except HorizonError:
        return False, float("nan")
    return r.summary.fits, r.summary.step_time_s


def bench_sweep() -> tuple[float, int, int]:
    configs = sweep_configs()
    t0 = time.perf_counter()
    with Pool(os.cpu_count()) as pool:
        results = pool.map(run_config, configs, chunksize=4)
    return time.perf_counter() - t0, len(results), sum(fits for fits, _ in results)


def main() -> int:
    module = "--module" in sys.argv[1:]
    unknown = [a for a in sys.argv[1:] if a != "--module"]
    if unknown:
        print(f"sim_speed: unknown argument {unknown[0]!r}; allowed: --module "
              "(time `python -m horizon_sim.cli.main` from this file's tree)", file=sys.stderr)
        return 2
    print(f"planner speed on {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    sim_s = bench_sim_one_step()
    _line("sim dense-120b one step", sim_s, TARGET_SIM_S, " [median of 5, build + simulate]")
    cli_s, note = bench_cli(module=module)
    _line("horizon plan dense-120b as a process", cli_s, TARGET_CLI_S,
          note + (" [median of 3]" if cli_s is not None else ""))
    sweep_s, n, n_fit = bench_sweep()
    _line(f"sweep of {n} configurations", sweep_s, TARGET_SWEEP_S,
          f" [{os.cpu_count()} processes; {n_fit} fit]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
