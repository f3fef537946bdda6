"""Diagnostic: the device memory each op holds, measured with the ops serialized, against the
planner's figure for the same op on the same (serialized) timeline.

A step's device peak error (`horizon validate`, `benchmarks/gpu_proxy.py`) says how far off the
planner is, not where. Here one step runs with one op at a time across lanes; before each op the
backend's peak is reset, so each op's row is what was allocated when it started and the most
allocated while it ran (CUDA: the caching allocator's allocated bytes; CPU: the arena's buffers
plus the op's measured temporaries). The planner's device trace (horizon_sim/sim/memory.py) is
evaluated on that same timeline, so timing does not enter the comparison: a row that differs
is a buffer or a temporary priced otherwise than the executor allocates it.

Prints the step's largest op both ways, each op kind's median measured / predicted (at start
and peak), and the ops whose peak differs most.

  .venv/bin/python benchmarks/op_memory.py --config base                  # CPU: validate's configurations
  .venv/bin/python benchmarks/op_memory.py --config b16_pipelined --device cuda   # gpu_proxy's (GPU box)
"""
import argparse
import statistics
import sys
import threading
import time

import pandas as pd
import torch

from horizon_exec.measure.probe import sync_for
from horizon_exec.measure.validate.configs import CONFIGS
from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.sim.memory import device_trace
from horizon_sim.units import MiB

from gpu_proxy import CONFIGS as GPU_CONFIGS

ALL = {c.name: c for c in (*CONFIGS, *GPU_CONFIGS) if c.ranks == 1}


def measured_ops(tr, tokens, device: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One step with the ops serialized: (per op: op_id, before_bytes, peak_bytes; the step's
    measured timeline)."""
    runner, lock, sync = tr.engine.runner, threading.Lock(), sync_for(device)
    backend, arena = tr.backend, tr.arena
    rows = []

    def one_at_a_time(op):
        with lock:
            if sync:
                sync()
            before = _allocated(backend, arena, device)
            backend.reset_peak(arena)
            t0 = time.perf_counter()
            runner(op)
            if sync:
                sync()
            rows.append((op.id, before, backend.device_peak(arena), t0, time.perf_counter()))

    tr.engine.runner = one_at_a_time
    try:
        res = tr.step(tokens)
    finally:
        tr.engine.runner = runner
    meas = pd.DataFrame(rows, columns=["op_id", "before_bytes", "peak_bytes", "own_start", "own_end"])
    # the engine's times include each op's wait for the lock: the ops' own, one after another
    tl = res.timeline.drop(columns=["start_s", "end_s"]).merge(meas[["op_id", "own_start", "own_end"]], on="op_id")
    t0 = tl.own_start.min()
    tl["start_s"], tl["end_s"] = tl.own_start - t0, tl.own_end - t0
    return meas.drop(columns=["own_start", "own_end"]), tl.drop(columns=["own_start", "own_end"])


def _allocated(backend, arena, device: str) -> int:
    if device.startswith("cuda"):
        return int(torch.cuda.memory_allocated(torch.device(device)))
    return arena.live + arena.temp


def predicted_ops(sched, timeline: pd.DataFrame, device: str) -> pd.DataFrame:
    """Per op of `timeline`: the planner's device bytes just before it starts and its most
    while it runs, on that timeline (a CPU-driven link casts while it copies: no staging)."""
    tr = device_trace(sched, timeline, staging=not device.startswith("cpu"))
    t, b = tr.time_s.to_numpy(), tr.bytes.to_numpy()
    rows = []
    for r in timeline.itertuples():
        before = b[t < r.start_s]
        during = b[(t >= r.start_s) & (t < r.end_s)]  # its releases at end_s come after its peak
        at_start = before[-1] if len(before) else b[0]
        rows.append((r.op_id, int(at_start), int(max([at_start, *during]))))
    return pd.DataFrame(rows, columns=["op_id", "pred_before_bytes", "pred_peak_bytes"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="base", help=f"one of: {', '.join(ALL)}")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--warmup", type=int, default=2, help="steps before the measured one (default 2)")
    ap.add_argument("--top", type=int, default=8, help="ops listed by |peak error| (default 8)")
    a = ap.parse_args()
    if a.config not in ALL:
        print(f"op_memory: --config {a.config!r} is not known; use one of: {', '.join(ALL)}", file=sys.stderr)
        return 2
    cfg = ALL[a.config]
    gen = torch.Generator().manual_seed(0)

    def tokens():
        return torch.randint(0, cfg.model.vocab, (cfg.policy.batch, cfg.policy.seq), generator=gen)

    with Trainer(cfg.model, cfg.policy, TrainerConfig(runtime=RuntimeConfig(device=a.device))) as tr:
        for _ in range(a.warmup):
            tr.step(tokens())
        meas, timeline = measured_ops(tr, tokens(), a.device)
        pred = predicted_ops(tr.sched, timeline, a.device)
    df = timeline[["op_id", "kind", "lane", "unit", "micro"]].merge(meas, on="op_id").merge(pred, on="op_id")
    df["peak_err"] = df.pred_peak_bytes / df.peak_bytes - 1
    print(f"{cfg.name}: {cfg.label} (device {a.device}; one step, ops serialized)")
    top_m, top_p = df.loc[df.peak_bytes.idxmax()], df.loc[df.pred_peak_bytes.idxmax()]
    print(f"step peak: measured {top_m.peak_bytes / MiB:,.2f} MiB at {top_m.kind}[{top_m.unit}], predicted "
          f"{top_p.pred_peak_bytes / MiB:,.2f} MiB at {top_p.kind}[{top_p.unit}] "
          f"({top_p.pred_peak_bytes / top_m.peak_bytes - 1:+.1%})")
    print("by kind (median predicted / measured): at start, peak while running")
    for kind, g in df.groupby("kind"):
        r0 = statistics.median(g.pred_before_bytes / g.before_bytes.clip(lower=1))
        r1 = statistics.median(g.pred_peak_bytes / g.peak_bytes.clip(lower=1))
        print(f"  {kind:<20}{len(g):4d} ops  {r0:6.3f}  {r1:6.3f}")
    worst = df.reindex(df.peak_err.abs().sort_values(ascending=False).index).head(a.top)
    cols = {"before_bytes": "start meas", "pred_before_bytes": "start pred", "peak_bytes": "peak meas",
            "pred_peak_bytes": "peak pred"}
    out = worst[["op_id", "kind", "unit", "micro", *cols, "peak_err"]].rename(columns=cols)
    for c in cols.values():
        out[c] = (out[c] / MiB).round(2)
    out["peak_err"] = out.peak_err.map("{:+.1%}".format)
    print(f"ops whose peak differs most (MiB):\n{out.to_string(index=False)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
