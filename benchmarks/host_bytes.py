"""Benchmark (planner): how far each host-memory policy pushes the largest model one machine
trains, side by side (issue 18's max-model items). Predicted, not measured: `horizon max-model`
on presets.

For each machine, max-model is asked under policy sets that keep exact fp32 AdamW (fp32 master
and moments):
  before     the exact policies before the split master: the default, and the lean one
             (optimizer in backward without clipping, no working copy: loads move fp32)
  + split    those plus the split master (the bf16 working copy + a 16-bit low half), also in
             backward with the host gradients bounded to 2 units
  + disk     those plus the Adam moments on a local disk (--disk, --disk-GBps), and the master's
             low halves there too
and prints the largest model's parameters, its tokens/s and policy, and the ratio to 'before'.

Run: .venv/bin/python benchmarks/host_bytes.py [--gpu h200] [--ram 1.5TB] [--disk 8TB] [--disk-GBps 25]
"""
import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--ram", default="1.5TB")
    ap.add_argument("--disk", default="8TB", help="local NVMe for the disk tier (default 8TB)")
    ap.add_argument("--disk-GBps", default="25", help="its bandwidth, READ[/WRITE] GB/s (default 25: 4 Gen4 drives)")
    a = ap.parse_args()
    from horizon_sim.cli.hardware_args import with_disk
    from horizon_sim.errors import HorizonError
    from horizon_sim.plan.max_model import exact_sets, max_model
    from horizon_sim.specs.hardware_presets import make_hardware
    try:
        hw = make_hardware(a.gpu, a.ram)
        hw_disk = with_disk(hw, argparse.Namespace(disk=a.disk, disk_GBps=a.disk_GBps))
    except HorizonError as e:
        print(f"benchmarks/host_bytes.py: {e}", file=sys.stderr)
        return 2
    sets = [(name, hw_disk if name == "+ disk" else hw, pols) for name, pols in exact_sets().items()]
    print(f"max-model under exact fp32 AdamW on {hw.name}"
          f" (disk: {a.disk} at {a.disk_GBps} GB/s for '+ disk')")
    ref = None
    for name, h, pols in sets:
        r = max_model(h, policies=pols)
        o = r.best.outcome
        ref = ref or r.params
        print(f"  {name:<8} {r.model.name:<18} {r.params / 1e9:7.1f}B  {r.params / ref:5.2f}x  policy "
              f"{r.best.policy_name:<11} {o.tokens_per_s:6.0f} tokens/s  host {o.host_bytes / r.params:5.2f} B/param"
              + (f", disk {o.disk_bytes / r.params:.2f} B/param" if o.disk_bytes else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
