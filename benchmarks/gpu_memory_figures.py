"""Benchmark (GPU box): the three device-memory figures a published run may report, for one
Horizon step, beside the planner's (issue 44, item 1: device memory from mechanisms).

  allocated  torch.cuda.max_memory_allocated over the step: what the executor reports and what
             a script printing max_memory_allocated() publishes (MegaTrain, ColossalAI's callback)
  reserved   torch.cuda.max_memory_reserved: the caching allocator's segments (rounded blocks,
             and the cached blocks no tensor holds at the peak)
  used       total - free from torch.cuda.mem_get_info after the step: what nvidia-smi shows for
             the device (the CUDA context, the reserved segments, and any other process)
  context    used before this process's first tensor (CUDA initialised, nothing allocated)

and the planner's bound (what the fit verdict uses) and its simulated timeline's peak for the same
Schedule on the hardware file given (from `horizon calibrate --device cuda` on this machine).
Models: gpu_proxy's Qwen2.5-7B-shaped 4 layers at two policies, and the tiny preset.

  .venv/bin/python benchmarks/gpu_memory_figures.py gpu.toml [--steps 3]
  .venv/bin/python benchmarks/gpu_memory_figures.py gpu.toml --device cpu --only tiny   # the
      planner's side and the allocated figure only (no CUDA): a smoke run
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_proxy import QWEN7B_4L  # noqa: E402

from horizon_sim.schedule import build_schedule  # noqa: E402
from horizon_sim.sim.simulate import simulate  # noqa: E402
from horizon_sim.specs.hardware_io import load_hardware  # noqa: E402
from horizon_sim.specs.model_presets import model_preset  # noqa: E402
from horizon_sim.specs.policy import Policy  # noqa: E402
from horizon_sim.units import fmt_bytes  # noqa: E402

RUNS = {
    "qwen7b4l_b16": (QWEN7B_4L, Policy(batch=16, seq=1024, act_ckpt_every=1)),
    "qwen7b4l_b64_k4": (QWEN7B_4L, Policy(batch=64, seq=1024, act_ckpt_every=4, master_dtype="bf16",
                                          working_copy=False, optimizer="after")),
    "tiny": (model_preset("tiny"), Policy(batch=4, seq=128)),
}


def _cuda_used(torch) -> int:
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def run(name: str, hw, device: str, steps: int) -> None:
    import torch

    from horizon_exec.runtime.config import AdmissionConfig, RuntimeConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    model, pol = RUNS[name]
    plan = simulate(build_schedule(model, pol), hw).summary
    cuda = device.startswith("cuda")
    context = None
    if cuda:
        torch.cuda.init()
        torch.cuda.synchronize()
        context = _cuda_used(torch)  # no tensor of this run yet
    toks = torch.randint(0, model.vocab, (pol.batch, pol.seq), generator=torch.Generator().manual_seed(0))
    cfg = TrainerConfig(runtime=RuntimeConfig(device=device), admission=AdmissionConfig(enabled=False))
    rows = []
    with Trainer(model, pol, cfg) as tr:
        for _ in range(steps):
            res = tr.step(toks)
            row = {"allocated": int(res.device_peak_bytes)}
            if cuda:
                torch.cuda.synchronize()
                row["reserved"] = int(torch.cuda.max_memory_reserved())
                row["used"] = _cuda_used(torch)
            rows.append(row)
    last = rows[-1]  # the first step allocates the arena and warms the caches
    print(f"{name}: {model.name}, batch {pol.batch} x {pol.seq}, K={pol.act_ckpt_every}, {pol.optimizer}")
    print(f"  planner   bound {fmt_bytes(plan.device_peak_bytes)}, timeline peak "
          f"{fmt_bytes(plan.device_typical_peak_bytes)}, usable {fmt_bytes(plan.device_usable_bytes)} "
          f"(reserve {hw.device.reserved_GiB:.2f} GiB, library workspace {hw.device.library_workspace_MiB:.0f} MiB)")
    for k, v in last.items():
        ratio = f"  bound/{k} {plan.device_peak_bytes / v:.3f}" if v else ""
        print(f"  {k:<9} {fmt_bytes(v)}{ratio}")
    if context is not None:
        print(f"  context   {fmt_bytes(context)} (used before the first tensor)")
    print(f"  steps     " + "; ".join(", ".join(f"{k} {fmt_bytes(v)}" for k, v in r.items()) for r in rows))
    if cuda:
        del tr
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hardware", help="a hardware file from `horizon calibrate --device cuda` on this machine")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default=None, choices=sorted(RUNS), help="one run instead of all")
    a = ap.parse_args()
    import torch
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_memory_figures: torch sees no CUDA device here (use --device cpu for a smoke run)")
    hw = load_hardware(a.hardware)
    for name in ([a.only] if a.only else list(RUNS)):
        run(name, hw, a.device, a.steps)


if __name__ == "__main__":
    main()
