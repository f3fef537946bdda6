"""`horizon validate`: run small configurations through the executor, simulate the same
schedules on a (calibrated) hardware file, compare, and write the table and Gantt overlays into
reports/. Needs torch (imported only when it runs)."""
import argparse
from pathlib import Path

from horizon_exec.measure.arg_bounds import check_validate
from horizon_exec.cli.needs_exec import import_executor, say
from horizon_sim.errors import HorizonError
from horizon_sim.schedule.op import Family

PEER_ALIASES = {"deepspeed": "zero3-offload"}
"""validate --peer's earlier name for the ZeRO-3 offload peer, still taken."""
VALIDATED_PEERS = (Family.ZERO3_OFFLOAD.value,)
"""The peers validate --peer runs for real (DeepSpeed's CPU accelerator: measure/peer_deepspeed.py):
ZeRO-3 offload only; zero2-offload is planned, never run here. A new family's runner adds its
name here."""

EXAMPLE = """example:
  horizon calibrate -o /tmp/machine.toml && horizon validate --hardware /tmp/machine.toml
  horizon validate --hardware machine.toml --configs base,wide_after --steps 8 --json
  horizon validate                 # calibrates first (about 40 s), then validates
  horizon validate --hardware machine.toml --peer zero3-offload   # the ZeRO-3 offload peer, run by DeepSpeed
  horizon validate --published     # the planner against published GPU measurements (no torch, seconds)
  horizon validate --published my_rows.toml --out /tmp/pub"""


def configure(p: argparse.ArgumentParser) -> None:
    p.description = ("Predicted vs measured: run fourteen small configurations (depth, width, batch, K, slots, "
                     "checkpoint placement, optimizer overlap, vocabulary, micro-batches and their order, the split master, "
                     "the disk tier, kept activations, a mixture-of-experts model, and two with 2 "
                     "data-parallel ranks sharing this machine, CPU backend only) through the executor, "
                     "simulate the same Schedule on the hardware file, and compare step time, busy time per "
                     "lane, overlap, device peak and host RSS. Writes validation.md, validation.csv and "
                     "validation_<config>.png into --out. With --published: the planner alone against "
                     "published GPU measurements (no torch). Progress goes to stderr.")
    p.epilog = EXAMPLE
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--hardware", default=None, metavar="FILE.toml",
                   help="a hardware file from `horizon calibrate` (default: calibrate this machine first)")
    p.add_argument("--out", default="reports", help="folder for the report files, created if missing (default reports)")
    p.add_argument("--steps", type=int, default=6, help="measured steps per configuration (default 6)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first (default 1)")
    p.add_argument("--configs", default=None, help="comma-separated subset of the configurations")
    p.add_argument("--quick", action="store_true", help="two tiny configurations (for tests)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--no-plots", action="store_true", help="skip the overlay PNGs")
    p.add_argument("--peer", default=None, choices=(*VALIDATED_PEERS, *PEER_ALIASES),
                   help="validate the planner's model of a peer instead of our executor: zero3-offload (old name: "
                        "deepspeed) runs small configurations through real DeepSpeed ZeRO-3 offload (CPU "
                        "accelerator) and compares step time and RSS with the peer's simulated Schedule; writes "
                        "validation_peer.md/.csv")
    p.add_argument("--peer-threads", type=int, default=1,
                   help="torch threads of the peer's runs (default 1: the calibrated compute core)")
    p.add_argument("--published", nargs="?", const="", default=None, metavar="FILE.toml",
                   help="instead of running anything, plan every published measurement (the built-in file, or "
                        "FILE.toml in its format) on the setup its source ran and print predicted, published and "
                        "error per row with a median per quantity; writes published.md/.csv/.png into --out")
    p.add_argument("--json", action="store_true", help="print the errors as one JSON object")


def run(a: argparse.Namespace) -> int:
    if a.published is not None:
        return _run_published(a)
    check_validate(a)  # every bound before a calibration or a configuration runs
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise HorizonError(f"--out {a.out!r} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HorizonError(f"--out {a.out!r}: cannot create the folder ({e.strerror})") from None
    if a.peer:
        return _run_peer(a, out)
    V = import_executor("horizon_exec.measure.validate", "validate")
    try:  # before a calibration or a configuration runs
        import_executor("horizon_exec.device.backend", "validate").check_device(a.device)
    except HorizonError as e:
        raise HorizonError(f"--device: {e}") from None
    configs = _pick(a, V.CONFIGS, V.QUICK_CONFIGS, "configuration(s)")
    if not a.configs and a.device != "cpu":  # several ranks per device are the CPU backend's: the others run here
        configs = tuple(c for c in configs if c.ranks == 1)
    if a.hardware:
        from horizon_sim.specs.hardware_io import load_hardware
        hw = load_hardware(a.hardware)
    else:
        hw = import_executor("horizon_exec.measure.calibrate", "validate").calibrate(a.device, quick=a.quick, say=say)
    v = V.validate(hw, configs, steps=a.steps, warmup=a.warmup, device=a.device, out_dir=out,
                   plots=not a.no_plots, say=say)
    if a.json:
        print(V.dumps(v))
        return 0
    print(V.figures_text(v))
    cols = ["config", "step_s_meas", "step_s_pred", "step_s_err", "device_peak_MiB_err", "rss_MiB_err"]
    print(v.table[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("wrote " + ", ".join(str(f) for f in v.files))
    return 0


def _pick(a: argparse.Namespace, full, quick, what: str) -> tuple:
    """--configs by name (from either set), else the --quick or the full set."""
    if a.configs is None:
        return quick if a.quick else full
    known = {c.name: c for c in (*full, *quick)}
    names = [n.strip() for n in a.configs.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise HorizonError(f"unknown {what} {', '.join(bad) or repr(a.configs)}; known: {', '.join(known)}")
    return tuple(known[n] for n in names)


def _run_peer(a: argparse.Namespace, out: Path) -> int:
    if a.device != "cpu":
        raise HorizonError(f"--peer {a.peer} runs on DeepSpeed's CPU accelerator: --device {a.device} is not offered")
    P = import_executor("horizon_exec.measure.validate.peer", "validate --peer")
    from horizon_exec.measure.peer_deepspeed import deepspeed_available
    if deepspeed_available() is None:
        raise HorizonError(f"--peer {a.peer}: DeepSpeed is not installed (make setup installs deepspeed==0.19.8)")
    configs = _pick(a, P.PEER_CONFIGS, P.QUICK_PEER_CONFIGS, "peer configuration(s)")
    if a.hardware:
        from horizon_sim.specs.hardware_io import load_hardware
        hw = load_hardware(a.hardware)
    else:
        hw = import_executor("horizon_exec.measure.calibrate", "validate").calibrate("cpu", quick=a.quick, say=say)
    v = P.validate_peer(hw, configs, steps=a.steps, warmup=max(a.warmup, 1), threads=a.peer_threads, out_dir=out,
                        calibration_steps=2 if a.quick else 8, per_param=not a.quick, say=say)
    if a.json:
        import json
        print(json.dumps({"figures": v.figures(), "configs": v.table.to_dict(orient="records"),
                          "adam_Gparams_per_s": v.adam_Gparams_per_s, "runtime_GiB": v.runtime_GiB}))
        return 0
    f = v.figures()
    print(f"peer zero3-offload (real DeepSpeed): median |step-time error| {f['median_abs_step_err']:.1%} over {f['configs']} configurations "
          f"(max {f['max_abs_step_err']:.1%}); median |RSS error| {f['median_abs_rss_err']:.1%} (max "
          f"{f['max_abs_rss_err']:.1%})")
    cols = ["config", "step_s_meas", "step_s_pred", "step_s_err", "rss_MiB_meas", "rss_MiB_err"]
    print(v.table[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("wrote " + ", ".join(str(f) for f in v.files))
    return 0


_PUBLISHED_ALONE = (("hardware", None), ("configs", None), ("quick", False), ("device", "cpu"), ("peer", None))


def _run_published(a: argparse.Namespace) -> int:
    """The planner only (no torch): every row runs on the machine its source names."""
    for flag, default in _PUBLISHED_ALONE:
        if getattr(a, flag) != default:
            raise HorizonError(f"--{flag} does not apply to --published (each row names its own machine and setup)")
    from horizon_sim.published import load_rows, run_suite
    from horizon_sim.published.write import write_published
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise HorizonError(f"--out {a.out!r} is a file, not a folder")
    rows = load_rows(a.published) if a.published else load_rows()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HorizonError(f"--out {a.out!r}: cannot create the folder ({e.strerror})") from None
    res = run_suite(rows, say=say)
    files = write_published(res, out, plots=not a.no_plots)
    if a.json:
        import json
        rows = res.table.astype(object).where(res.table.notna(), None)  # NaN is not JSON: null
        print(json.dumps({"figures": res.figures(), "rows": rows.to_dict(orient="records")}, default=str,
                         allow_nan=False))
        return 0
    print(res.text())
    print("wrote " + ", ".join(str(f) for f in files))
    return 0
