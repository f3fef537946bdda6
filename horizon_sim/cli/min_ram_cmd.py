"""`horizon min-ram`: the smallest host RAM (a multiple of 64 GiB) that a training job fits in."""
import argparse
import json

from horizon_sim.cli.policy_args import add_policy_args, fit_seq_to_positions, policy_from_args
from horizon_sim.cli.tune_cmd import add_hardware_args, hardware_from_args
from horizon_sim.units import GiB, fmt_bytes
from horizon_sim.specs.moe import params_label

EXAMPLE = """example:
  horizon min-ram --model llama-3.1-70b --gpu h100-pcie
  horizon min-ram --model dense-120b --gpu h200 --optimizer backward --no-working-copy --states-dtype bf16
  horizon min-ram --model ./my-model/config.json --gpu rtx-4090 --batch 8 --json
  horizon min-ram --model dense-120b --gpu h200 --master-dtype split --disk 4TB --disk-GBps 25

With --disk (local NVMe for the disk tier) and a policy that keeps the moments in RAM, the
answer is also given with the moments on disk (--disk-tier moments): RAM + disk, and speed.

The host footprint does not depend on the RAM installed, so it is simulated once and rounded
up to a multiple of 64 GiB (after the OS reserve); the answer is then checked by simulating
with that much RAM (fits) and 64 GiB less (does not)."""


def configure(p: argparse.ArgumentParser) -> None:
    p.description = ("The smallest host RAM, in 64 GiB steps, in which a model trains under a policy: "
                     "the footprint breakdown and the speed at that size.")
    p.epilog = EXAMPLE
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--model", default="llama-3.1-8b",
                   help="a preset name or a path to an HF config.json (default llama-3.1-8b)")
    add_hardware_args(p, ram=False)
    add_policy_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")


def run(a: argparse.Namespace) -> int:
    from horizon_sim.plan.min_ram import min_ram
    from horizon_sim.specs.hf_config import load_model

    from dataclasses import replace

    from horizon_sim.errors import HorizonError
    model, hw = load_model(a.model), hardware_from_args(a)
    fit_seq_to_positions(a, model)
    policy = policy_from_args(a, hw)
    r = min_ram(model, hw, policy)
    s = r.result.summary
    n = model.total_params
    disk = None  # the same policy with the moments on disk, when the machine has a disk
    if hw.disk_bytes_usable and policy.disk_tier == "none" and hw.cluster.ranks == 1:
        try:
            disk = min_ram(model, hw, replace(policy, disk_tier="moments"))
        except HorizonError as e:
            disk = str(e)
    if a.json:
        print(json.dumps({
            "model": model.name, "params": n, "gpu": hw.device.name, "link": hw.link.name,
            "ram_bytes": r.ram_bytes, "ram_GiB": r.ram_bytes // GiB, "host_bytes": r.host_bytes,
            "os_reserved_bytes": r.os_reserved_bytes, "host_breakdown_bytes": r.breakdown,
            "fits": s.fits, "below_ram_bytes": r.ram_bytes - r.step_bytes,
            "below_fits": r.below.summary.fits if r.below else False,
            "tokens_per_s": s.tokens_per_s, "step_time_s": s.step_time_s, "mfu": s.mfu,
            "bottleneck": s.bottleneck, "device_peak_bytes": s.device_peak_bytes,
            "disk_bytes": s.memory.disk_need_bytes, "policy": policy.to_dict(),
            "with_moments_on_disk": (None if disk is None else {"error": disk} if isinstance(disk, str) else {
                "ram_bytes": disk.ram_bytes, "disk_bytes": disk.result.summary.memory.disk_need_bytes,
                "tokens_per_s": disk.tokens_per_s, "host_bytes": disk.host_bytes})}))
        return 0
    c = hw.cluster
    on = (f"{hw.device.name} + {hw.link.name}" if c.ranks == 1 else
          f"{c.layout.nodes} node(s) x {c.layout.devices_per_node} {hw.device.name} + {hw.link.name}")
    print(f"min-ram: {model.name} ({params_label(model)}) on {on} needs "
          f"{r.ram_bytes // GiB} GiB of host RAM{' per node' if c.ranks > 1 else ''} ({fmt_bytes(r.ram_bytes)}, "
          f"a multiple of {r.step_bytes // GiB} GiB)")
    below = r.ram_bytes - r.step_bytes
    if r.below is not None:
        bs = r.below.summary
        below_txt = f"with {below // GiB} GiB it is short by {fmt_bytes(bs.host_bytes - bs.host_usable_bytes)}"
    else:
        below_txt = f"{below // GiB} GiB would leave nothing after the OS reserve"
    print(f"  footprint {fmt_bytes(r.host_bytes)} + {fmt_bytes(r.os_reserved_bytes)} OS reserve; {below_txt}")
    print()
    print("host footprint:")
    for role, b in r.breakdown.items():
        if b:
            print(f"  {role:<16}{fmt_bytes(b):>12}  {b / n:6.2f} B/param")
    print(f"  {'total':<16}{fmt_bytes(r.host_bytes):>12}  {r.host_bytes / n:6.2f} B/param")
    print()
    print(f"at {r.ram_bytes // GiB} GiB: {s.tokens_per_s:,.0f} tokens/s, step {s.step_time_s:.2f} s, "
          f"MFU {s.mfu:.1%}, limited by {s.bottleneck}; device peak {fmt_bytes(s.device_peak_bytes)} of "
          f"{fmt_bytes(s.device_usable_bytes)} usable ({fmt_bytes(s.device_usable_bytes - s.device_peak_bytes)} "
          f"to spare), host {fmt_bytes(s.host_bytes)} of {fmt_bytes(s.host_usable_bytes)} usable "
          f"({fmt_bytes(s.host_usable_bytes - s.host_bytes)} to spare)")
    if s.memory.disk_need_bytes:
        print(f"disk: {fmt_bytes(s.memory.disk_need_bytes)} of {fmt_bytes(hw.disk_bytes_usable)} (the Adam moments)")
    if isinstance(disk, str):
        print(f"\nwith the moments on disk (--disk-tier moments): {disk}")
    elif disk is not None:
        ds = disk.result.summary
        print(f"\nwith the moments on disk (--disk-tier moments): {disk.ram_bytes // GiB} GiB of RAM "
              f"({disk.host_bytes / n:.2f} B/param) + {fmt_bytes(ds.memory.disk_need_bytes)} of disk at "
              f"{hw.host.disk_read_GBps:g}/{hw.host.disk_write_GBps:g} GB/s: {ds.tokens_per_s:,.0f} tokens/s "
              f"({ds.tokens_per_s / s.tokens_per_s:.2f}x), limited by {ds.bottleneck}")
    return 0
