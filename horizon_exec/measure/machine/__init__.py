"""This machine's description for the planner: where `horizon train` (and a run comparing itself
with its prediction) gets the HardwareSpec it simulates the step on.

    m = this_machine("cpu")                # MachineDescription(hardware=HardwareSpec, source="...", kind=...)
    m = this_machine("cuda", "gpu.toml")   # --hardware FILE wins

In order, the first that exists:
  1. --hardware FILE;
  2. this machine's calibration in the per-user cache (cache.py: `horizon calibrate` writes it
     there), for the same machine key (detect.machine_key: device kind and GPU, CPU model and
     flags, cores, RAM, torch version), a file of yours in a private folder;
  3. an estimate: on the CPU backend a quick measurement (estimate.py, a few seconds in a child
     process, cached ESTIMATE_LIFE_S); on CUDA the detected GPU's preset with its memory and
     this host's RAM and cores.
The source is one line saying which, for the run's log ("calibration cached in
~/.cache/horizon/machines/cpu-2c-24GiB-....toml on 2026-11-29").
"""
import contextlib
import fcntl
import os
import time
from dataclasses import dataclass

from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware import HardwareSpec

CALIBRATED, FILE, ESTIMATE = "calibrated", "file", "estimate"
CALIBRATE_MINUTES = {"bf16": 2, "fp32": 10}
"""About how long `horizon calibrate` takes on a small CPU machine (the offer's figure; a GPU
box's is given bf16's), by the dtype a default run computes in there: 1.5-2 minutes on a
2-core VM with bf16 instructions; without them bf16's GEMMs and attention run in a generic
kernel and fp32's are measured too (9m22s on a 2-core AVX2 EPYC, 2026-12-07)."""


@dataclass(frozen=True)
class MachineDescription:
    hardware: HardwareSpec
    source: str
    """One line: '--hardware FILE', 'calibration cached in PATH on DATE', 'estimate: ...'."""
    kind: str = ESTIMATE
    """FILE (--hardware), CALIBRATED (the cache's calibration) or ESTIMATE."""


def given_file(hardware: HardwareSpec, path) -> MachineDescription:
    """The description of a --hardware file already read."""
    return MachineDescription(hardware, f"--hardware {path}", FILE)


def this_machine(device: str, hardware_path: str | None = None, say=None) -> MachineDescription:
    """This machine's description for `device` ('cpu' or 'cuda[:N]'): --hardware `hardware_path`,
    else the cached calibration, else an estimate (module docstring). `say`: one line before a
    quick estimate is measured (it takes seconds), e.g. print."""
    if hardware_path:
        from horizon_sim.specs.hardware_io import load_hardware
        return given_file(load_hardware(hardware_path), hardware_path)
    from horizon_exec.measure.machine import cache
    from horizon_exec.measure.machine.detect import machine_key
    key = machine_key(device)
    cal = cache.calibration_path(key)
    why = cache.why_unusable(cal)
    if not why:
        hw = _read(cal)
        if hw is not None:
            day = time.strftime("%Y-%m-%d", time.localtime(cal.stat().st_mtime))
            return MachineDescription(hw, f"calibration cached in {cache.shown(cal)} on {day}", CALIBRATED)
        why = "unreadable"
    note = "" if why == "absent" else f" (the cached calibration is not used: {why})"
    if device != "cpu":
        from horizon_exec.measure.machine.estimate import gpu_estimate
        hw, what = gpu_estimate(device)
        return MachineDescription(hw, f"estimate: {what}{note}", ESTIMATE)
    return _cpu_estimate(key, note, say)


def _read(path) -> HardwareSpec | None:
    """The hardware file at `path`, None when it does not read (a damaged cache file is not an error
    of the run: the next source is used)."""
    from horizon_sim.specs.hardware_io import load_hardware
    try:
        return load_hardware(path)
    except HorizonError:
        return None


def _cpu_estimate(key: dict, note: str, say) -> MachineDescription:
    """The cached quick estimate when younger than ESTIMATE_LIFE_S, else a new one, cached (one
    process measures at a time: a second waits on the lock and reads the first's)."""
    from horizon_exec.measure.machine import cache
    path = cache.estimate_path(key)
    why = cache.why_unusable(path)
    usable = why in ("", "absent")
    with _locked(path) if usable else contextlib.nullcontext():
        if usable and path.exists() and cache.age_s(path) < cache.ESTIMATE_LIFE_S:
            hw = _read(path)
            if hw is not None:
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
                return MachineDescription(hw, f"estimate: measured here on {when} (cached in {cache.shown(path)}, "
                                              f"kept {cache.ESTIMATE_LIFE_S // 3600} h){note}", ESTIMATE)
        if say:
            say("machine: no calibration of this machine cached: measuring a quick estimate (a few seconds)")
        try:
            text, seconds = _measure_estimate()
        except HorizonError as e:  # the run goes on, planned on the built-in figures
            return _built_in(f"the quick measurement failed: {e}")
        where = "not cached: " + why if not usable else ""
        if usable:
            try:
                where = f"cached in {cache.shown(cache.write(path, _keyed(text, key)))} for " \
                        f"{cache.ESTIMATE_LIFE_S // 3600} h"
            except OSError as e:
                where = f"not cached: {e.strerror or e}"
    from horizon_sim.safe_read import loads_toml
    from horizon_sim.specs.hardware_io import hardware_from_dict
    hw = hardware_from_dict(loads_toml(text, "the quick estimate"), "the quick estimate")
    return MachineDescription(hw, f"estimate: measured here in {seconds:.1f} s ({where}){note}", ESTIMATE)


def _built_in(why: str) -> MachineDescription:
    """The CPU backend's built-in figures (device/core_split.CPU_ESTIMATE: a 2-core EPYC's
    calibration, rounded) with this machine's RAM and cores: when no measurement could be made."""
    from dataclasses import replace

    from horizon_exec.device.core_split import CPU_ESTIMATE
    from horizon_exec.measure.machine.detect import host_ram_GiB
    ram = host_ram_GiB()
    hw = replace(CPU_ESTIMATE, device=replace(CPU_ESTIMATE.device, hbm_GiB=ram),
                 host=replace(CPU_ESTIMATE.host, ram_GiB=ram, cores=os.cpu_count() or 1, runtime_overhead_GiB=0.0,
                              os_reserved_GiB=min(CPU_ESTIMATE.host.os_reserved_GiB, ram / 2)))
    return MachineDescription(hw, f"estimate: {why}; the CPU backend's built-in figures (another machine's, "
                                  "off by up to tens of times)", ESTIMATE)


@contextlib.contextmanager
def _locked(path):
    """An exclusive lock on `path`'s lock file in the private cache folder (released on exit,
    and by the kernel if the process dies)."""
    from horizon_exec.measure.machine import cache
    folder = cache.private_cache_dir()
    fd = os.open(folder / f".{path.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _measure_estimate() -> tuple[str, float]:
    """(the quick CPU estimate as hardware TOML, seconds it measured), from a child process."""
    from horizon_exec.measure.child import run_json_child
    res = run_json_child("horizon_exec.measure.machine.estimate", {}, what="the quick estimate of this machine",
                         timeout_s=300)
    return res["toml"], float(res["seconds"])


def _keyed(text: str, key: dict) -> str:
    """Hardware TOML with the machine key as its first comment line (what the file is for)."""
    import json
    return f"# horizon machine key: {json.dumps(key, sort_keys=True)}\n{text}"


def save_calibration(hw: HardwareSpec, device: str) -> str:
    """Write `hw` (a full `horizon calibrate` of this machine on `device`) to the per-user cache;
    the path as shown. NotPrivate or OSError when the cache folder cannot be used."""
    from horizon_exec.measure.machine import cache
    from horizon_exec.measure.machine.detect import machine_key
    from horizon_sim.specs.hardware_io import hardware_to_toml
    key = machine_key(device)
    return cache.shown(cache.write(cache.calibration_path(key), _keyed(hardware_to_toml(hw), key)))


def lines(m: MachineDescription) -> list[str]:
    """What a run says of its machine: where the description came from, and without a
    calibration one line offering to make one (nothing for --hardware: the run names it)."""
    if m.kind == FILE:
        return []
    out = [f"machine: {m.source}"]
    if m.kind == ESTIMATE:
        from horizon_exec.device.compute_dtype import default_compute_dtype
        from horizon_sim.specs.cpu_ranks import is_cpu_backend
        minutes = CALIBRATE_MINUTES[default_compute_dtype("cpu" if is_cpu_backend(m.hardware) else "cuda")[0]]
        out.append(f"machine: no calibration of this machine: predictions use a quick estimate (within about 2x); "
                   f"`horizon calibrate` (about {minutes} min, once) makes them within about 25%")
    return out
