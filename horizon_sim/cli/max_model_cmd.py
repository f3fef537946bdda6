"""`horizon max-model`: the largest model that trains on a machine."""
import argparse
import json

from horizon_sim.plan.max_model import WIDTHS
from horizon_sim.schedule.limits import MAX_LAYERS
from horizon_sim.specs.quant import QUANT_FORMATS
from horizon_sim.cli.tune_cmd import add_hardware_args, add_run_args, format_table, hardware_from_args, positive
from horizon_sim.errors import HorizonError
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB, fmt_bytes

EXAMPLE = """example:
  horizon max-model --gpu h200 --ram 1.5TB
  horizon max-model --gpu rtx-4090 --ram 128GiB --policies default
  horizon max-model --gpu h200 --ram 1.5TB --policies exact
  horizon max-model --gpu gh200 --ram 480GB --seq 4096 --json
  horizon max-model --gpu h200 --ram 1.5TB --moe

Candidates: every dense model preset, plus dense-120b scaled in depth (-L<layers>) and in width
(-w<hidden>); with --moe the MoE presets and qwen3-235b-a22b scaled in depth. Policies (the fastest that fits counts):
  lean     (default) the default policy; bf16 moments without the working copy; optimizer in
           backward without clipping and no working copy ('lean'), also with bf16 moments
           ('leanest'); the split master ('split'), also in backward with the host gradients
           bounded to 2 units ('split-lean'); with --disk, 'split-lean' with the moments on disk
           ('split-disk') and with the master's low halves there too ('split-disk-low')
  exact    only those with an fp32 master and fp32 moments: default, lean, split, split-lean (and
           the disk ones with --disk)
  default  the default policy only"""


def configure(p: argparse.ArgumentParser) -> None:
    p.description = ("The largest model that fits a GPU and a host RAM size, with its tokens/s: model "
                     "presets and the dense-120b family scaled in depth and width.")
    p.epilog = EXAMPLE
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_hardware_args(p)
    p.add_argument("--policies", choices=("lean", "exact", "default"), default="lean",
                   help="'lean': best of the default and five memory-lean policies (default); 'exact': "
                        "those with fp32 master and moments; 'default': the default policy only")
    p.add_argument("--moe", action="store_true",
                   help="mixture-of-experts candidates instead: the MoE presets and qwen3-235b-a22b scaled in depth "
                        "(largest by total parameters; MFU counts active ones)")
    p.add_argument("--batch", type=int, default=Policy().batch, help="sequences per step (default 4)")
    p.add_argument("--seq", type=int, default=Policy().seq, help="tokens per sequence (default 2048)")
    p.add_argument("--lora-rank", type=int, default=0, metavar="R",
                   help="the largest model to adapt with LoRA adapters of rank R on a frozen base (the base kept "
                        "in bf16 on the host, the adapters on the device; --policies does not apply) (default 0: "
                        "full fine-tuning)")
    p.add_argument("--lora-targets", default=Policy().lora_targets, metavar="NAMES",
                   help="with --lora-rank: the block projections that get adapters, by module name, and "
                        "routed-expert stacks by parameter path (experts.down_proj) (comma-separated) (default "
                        "all-linear)")
    p.add_argument("--base-quant", choices=QUANT_FORMATS, default="none",
                   help="with --lora-rank: the frozen base's blocks stored as nf4 (4-bit, QLoRA's) or int8 on the host "
                        "(default none: bf16)")
    add_run_args(p)


def _v(v) -> dict:
    r = v.row()
    r["policy_fields"] = v.policy.to_dict()
    return {k: (None if isinstance(x, float) and x != x else x) for k, x in r.items()}


def run(a: argparse.Namespace) -> int:
    from horizon_sim.plan.max_model import max_model

    positive("--batch", a.batch)
    positive("--seq", a.seq)
    positive("--workers", a.workers, allow_none=True)
    hw = hardware_from_args(a)
    from horizon_sim.cli.explicit_flags import given
    if a.lora_rank and "policies" in given(a):
        raise HorizonError(f"--policies does not apply with --lora-rank {a.lora_rank}: the policy sets change the "
                           "full fine-tuning's host update, which a frozen base has not; drop one")
    base = Policy.from_choices(batch=a.batch, seq=a.seq, lora_rank=a.lora_rank, lora_targets=a.lora_targets,
                               base_quant=a.base_quant,
                               optimizer=None)
    res = max_model(hw, base=base, policies=a.policies, workers=a.workers,
                    progress=not a.quiet, kind="moe" if a.moe else "dense")
    b, m = res.best, res.model
    if a.json:
        print(json.dumps({
            "hardware": hw.name or hw.device.name, "ram_bytes": int(round(hw.host.ram_GiB * GiB)),
            "model": m.name, "params": res.params, "family": b.candidate.family, "shape": m.to_dict(),
            "tokens_per_s": b.outcome.tokens_per_s, "mfu": b.outcome.mfu, "policy": b.policy_name,
            "policy_fields": b.policy.to_dict(), "device_peak_bytes": b.outcome.device_peak_bytes,
            "host_bytes": b.outcome.host_bytes,
            "next_bigger": _v(res.next_bigger) if res.next_bigger else None,
            "largest_preset": _v(res.largest_preset) if res.largest_preset else None,
            "candidates": [{k: (None if isinstance(x, float) and x != x else x) for k, x in r.items()}
                           for r in res.table.to_dict("records")]}))
        return 0
    o = b.outcome
    active = f", {m.active_params / 1e9:.1f}B active" if m.is_moe else ""
    print(f"max-model on {hw.name or hw.device.name}: {m.name}, {res.params / 1e9:.1f}B params{active} "
          f"({m.n_layers} layers x width {m.hidden}, {b.candidate.family})")
    print(f"  {o.tokens_per_s:,.0f} tokens/s, MFU {o.mfu:.1%}, limited by {o.bottleneck}; device "
          f"{fmt_bytes(o.device_peak_bytes)} of {fmt_bytes(hw.device_bytes_usable)} "
          f"({fmt_bytes(hw.device_bytes_usable - o.device_peak_bytes)} to spare), host {fmt_bytes(o.host_bytes)} "
          f"of {fmt_bytes(hw.host_bytes_usable)} usable ({fmt_bytes(hw.host_bytes_usable - o.host_bytes)} to spare)")
    from horizon_sim.plan.advice import policy_flags
    flags = policy_flags(b.policy)
    print(f"  policy '{b.policy_name}'" + (f": {flags}" if flags else " (Policy() defaults)"))
    if res.next_bigger:
        nb = res.next_bigger
        print(f"  next bigger candidate {nb.candidate.model.name} ({nb.candidate.params / 1e9:.1f}B) "
              f"does not fit: {nb.why}")
    else:  # the candidates end here: the machine may train bigger still
        print("  the largest candidate, and it fits: bigger models are not among the candidates (widths up to "
              f"{WIDTHS[-1]:,}, depths up to {MAX_LAYERS} layers), so this is a lower bound")
    lp = res.largest_preset
    if lp is not None and lp is not b:
        print(f"  largest preset that fits: {lp.candidate.model.name} ({lp.candidate.params / 1e9:.1f}B), "
              f"{lp.outcome.tokens_per_s:,.0f} tokens/s under '{lp.policy_name}'")
    print()
    print("candidates judged, largest first (host: simulated footprint under the policy shown):")
    cols = [("model", "model", str), ("params", "params", lambda n: f"{n / 1e9:.1f}B"),
            ("fits", "fits", lambda f: "yes" if f else "no"), ("policy", "policy", str),
            ("tokens/s", "tokens_per_s", lambda v: f"{v:,.0f}" if v == v else "-"),
            ("host", "host_bytes", lambda n: fmt_bytes(n) if n else "-"), ("why", "why", str)]
    rows = res.table.to_dict("records")
    simulated = [r for r in rows if r["host_bytes"]]
    skipped = [r for r in rows if not r["host_bytes"]]
    shown = skipped[-1:] + simulated  # the smallest candidate rejected by its lower bound, then the rest
    print(format_table(shown, cols))
    if len(skipped) > 1:
        print(f"  ... and {len(skipped) - 1} bigger candidates up to {skipped[0]['model']} "
              f"({skipped[0]['params'] / 1e9:.0f}B), rejected by their host store or weight slots alone")
    return 0
