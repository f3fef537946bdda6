"""Measure a data-parallel step: R processes on this machine (torch.distributed.run, gloo over
loopback) each train `policy.batch` random sequences per step of `model`; the step time of a
step is the slowest rank's (they end together at the norm all-reduce).

    res = measure_ranks(model, policy, nproc=2, steps=6)
    res["step_s"]      # per measured step, seconds (after `warmup` unmeasured ones)
    res["timeline"]    # rank 0's last step, StepResult.timeline's columns (records)

One rank runs the same code path with a world of one (no launcher), so the two are measured
alike. Used by benchmarks/scaling.py.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from horizon_exec.dist.context import free_port
from horizon_exec.measure.child import child_env

_ENV = "HORIZON_RANKS_JOB"


def measure_ranks(model, policy, nproc: int, steps: int = 6, warmup: int = 2, port: int = 0,
                  timeout_s: float = 600) -> dict:
    from dataclasses import asdict
    with tempfile.TemporaryDirectory(prefix="horizon-ranks-") as d:
        out = Path(d) / "result.json"
        job = {"model": asdict(model), "policy": policy.to_dict(), "steps": steps, "warmup": warmup, "out": str(out)}
        # PYTHONSAFEPATH (python -P, inherited by torch.distributed.run's workers): `-m` would put
        # the current folder first on sys.path, and a horizon_exec/ or torch/ there would run.
        env = child_env({_ENV: json.dumps(job), "OMP_NUM_THREADS": "1", "PYTHONSAFEPATH": "1"})
        env.pop("WORLD_SIZE", None)
        cmd = [sys.executable, "-m", "horizon_exec.measure.ranks"]
        if nproc > 1:
            port = port or free_port()
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                   "--master-addr", "127.0.0.1", "--master-port", str(port), "--module", "horizon_exec.measure.ranks"]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if p.returncode != 0:  # the ranks' own lines first: the launcher's report ends the stream
            own = [ln for ln in p.stderr.splitlines() if not ln.startswith(("E1", "W1", "I1", " ", "Traceback", "="))]
            raise RuntimeError(f"{nproc}-rank measurement failed (exit {p.returncode}): "
                               + " | ".join(own[-12:]) + f"\n{p.stderr[-1500:]}")
        return json.loads(out.read_text())


def _rank_main() -> None:
    import torch
    import torch.distributed as dist

    from horizon_exec.dist.context import from_env
    from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.model import ModelSpec
    from horizon_sim.specs.policy import Policy
    job = json.loads(os.environ[_ENV])
    ctx = from_env()
    model, pol = ModelSpec.from_dict(job["model"]), Policy.from_dict(job["policy"])
    g = torch.Generator().manual_seed(ctx.rank)
    times, res = [], None
    with Trainer(model, pol, TrainerConfig(admission=AdmissionConfig(enabled=False)), dist=ctx) as tr:
        for i in range(job["warmup"] + job["steps"]):
            res = tr.step(torch.randint(0, model.vocab, (pol.batch, pol.seq), generator=g))
            t = torch.tensor([res.step_s], dtype=torch.float64)
            if ctx.world > 1:
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.groups["main"])
            if i >= job["warmup"]:
                times.append(float(t))
    if ctx.rank == 0:
        tl = res.timeline.copy()
        tl["kind"] = tl["kind"].astype(str)
        tl["lane"] = tl["lane"].astype(str)
        Path(job["out"]).write_text(json.dumps({"step_s": times, "timeline": tl.to_dict(orient="records"),
                                                "device_peak_bytes": res.device_peak_bytes}, default=str))
    ctx.close()


if __name__ == "__main__":
    from horizon_exec.dist.context import exit_rank
    _rank_main()
    exit_rank(0)

