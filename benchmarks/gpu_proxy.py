"""Benchmark (GPU box): a 7B model's layers, predicted against measured, lane by lane.

Model: 4 layers with Qwen2.5-7B's shapes (hidden 3584, 28 heads, 4 kv heads, SwiGLU 18944,
vocab 152064, untied, qkv bias): 2.02B parameters, every layer one of Qwen2.5-7B's, so a step
costs what 4/28 of the real model's layers plus its whole embedding and head cost. Two
policies: batch 64x1024, K=4, bf16 master, optimizer after (MegaTrain's setup for Qwen2.5-7B
on one H100, on fewer layers); batch 16x1024, K=1, the default pipelined optimizer.
Each is measured as `horizon validate` measures (its own process, warm-up steps, median of the
measured steps) and simulated on the hardware file, which should come from `horizon calibrate
--device cuda` on the same machine minutes before.

Prints per policy: step predicted / measured and the error, then every lane's busy seconds and
every op kind's summed seconds, predicted and measured. Needs ~40 GiB of host RAM and ~25 GiB
of device memory.

  .venv/bin/horizon calibrate --device cuda -o gpu.toml
  .venv/bin/python benchmarks/gpu_proxy.py gpu.toml [--steps 4] [--warmup 3]

Measured on an H200 on 2026-11-27 (docs/gpu_runs.md): the first policy 2.563 s measured (2.116
predicted) before the embedding-backward fix, 2.348 s (2.061 predicted) after; the second 1.256 s
before, 0.979 s (0.948 predicted) after.
"""
import argparse
import statistics

import pandas as pd

from horizon_exec.measure.validate.compare import compare
from horizon_exec.measure.validate.configs import Config
from horizon_exec.measure.validate.measure import measure
from horizon_sim.specs.hardware_io import load_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

QWEN7B_4L = ModelSpec(name="qwen2.5-7b-4l", n_layers=4, hidden=3584, n_heads=28, n_kv_heads=4, ffn_hidden=18944,
                      vocab=152064, family="qwen2", norm_eps=1e-6, rope_theta=1e6, max_position=131072)
CONFIGS = (
    Config("b64_after", QWEN7B_4L, Policy(batch=64, seq=1024, act_ckpt_every=4, master_dtype="bf16",
                                          working_copy=False, optimizer="after")),
    Config("b16_pipelined", QWEN7B_4L, Policy(batch=16, seq=1024, act_ckpt_every=1)),
)


def _by_kind(tl: pd.DataFrame) -> pd.Series:
    return (tl.end_s - tl.start_s).groupby([tl.lane, tl.kind]).sum()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hardware", help="a hardware file from `horizon calibrate --device cuda`")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    hw = load_hardware(a.hardware)
    for cfg in CONFIGS:
        res = measure([cfg], steps=a.steps, warmup=a.warmup, device=a.device)[0]
        o = compare(cfg, hw, res, a.device)
        r = o.row
        print(f"{cfg.name}: {cfg.label}")
        print(f"  step {r['step_s_pred']:.3f} s predicted, {r['step_s_meas']:.3f} s measured "
              f"({r['step_s_err']:+.1%}); device peak {r['device_peak_MiB_err']:+.1%}, host RSS {r['rss_MiB_err']:+.1%}")
        meas = pd.concat([_by_kind(pd.DataFrame(s["timeline"])) for s in res["steps"]], axis=1)
        table = pd.DataFrame({"predicted_s": _by_kind(o.predicted),
                              "measured_s": meas.apply(lambda row: statistics.median(row.dropna()), axis=1)})
        print(table.round(4).to_string())


if __name__ == "__main__":
    main()
