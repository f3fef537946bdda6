"""Admission control: before the executor allocates anything, ask the planner what the run
needs and refuse, with needed vs available, the breakdown by role and what to change, when
it will not fit, instead of dying to the OOM killer hours into the run.

    adm = admit(model, policy, sched, device="cpu")   # AdmissionError when it does not fit
    adm.host_need_bytes, adm.host_available_bytes, adm.host_by_role, adm.device_by_role, adm.line()

What is compared (bytes):
- host need: the planner's host footprint of this schedule (master, moments, working copy,
  and what the pool of dynamic host buffers holds: grads, staging, checkpoints, scalars;
  simulate() on a HardwareSpec of this machine) + the host store's page padding + the
  process runtime (the larger of what this process holds now and the runtime estimate:
  `hardware.host.runtime_overhead_GiB` when a hardware file gives one, else RSS now +
  RUNTIME_GROWTH_BYTES: 0 is "not measured", as in this machine's estimates, measure/machine)
  + with a measured runtime on the CPU backend, the freed memory glibc's arenas keep for this
  run's largest blocks (calibrate measures the runtime net of it)
  + the training data (data.data_bytes_bound: counted from the file's size before it is read)
  + on the CPU backend the device need (its "device" memory is host RAM). An eval adds
  nothing: it runs its forward-only Schedule on the engine, over the step's buffers and
  lanes, and needs no more than a step (tests/test_eval_engine.py).
- host available: `host_budget_bytes`, else MemAvailable (/proc/meminfo) + this process's
  resident memory (the process may grow to that without the kernel running out of RAM);
  with an address-space limit (`ulimit -v`), at most what it still lets the process map.
- device need: the planner's device peak (weight slots + the highest sum of live
  activations, gradients and op workspaces) + the executor's device constants (RoPE tables,
  the step's labels) [+ on CUDA: CUDA_SLACK_BYTES].
- device available: CUDA: the free memory torch.cuda.mem_get_info reports, or
  `device_budget_bytes` when smaller; CPU: `device_budget_bytes`, else no separate limit.
The arena still enforces the device budget op by op at run time; admission is the up-front
check that a run which cannot fit never starts.
"""
from dataclasses import dataclass, field, replace

from horizon_exec.errors import DeviceBudgetError
from horizon_exec.procfs import address_space_limit_bytes, mem_available_bytes, rss_bytes, vm_size_bytes
from horizon_exec.runtime.store import ALIGN
from horizon_sim.errors import HorizonError
from horizon_sim.schedule.op import Space
from horizon_sim.sim.verdict import MemoryVerdict
from horizon_sim.specs.cpu_ranks import laid_out  # the Schedule's data-parallel layout of the machine
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB, fmt_bytes

RUNTIME_GROWTH_BYTES = 256 * 2**20
"""Resident memory the process still gains after the trainer is built (lane threads and their
pools, allocator caches, the optimizer's scratch, logging). An estimate; a hardware file from
`calibrate` gives a measured runtime_overhead_GiB instead."""
CUDA_SLACK_BYTES = 512 * 2**20
"""Device memory a CUDA run uses beyond the schedule's buffers: cuBLAS/cuDNN workspaces and
caching-allocator fragmentation (an estimate; the CUDA context itself is already outside
mem_get_info's free figure)."""
_DEFAULT_TIMING = ("h100-pcie", "default")  # device and host presets whose speeds order the events


class AdmissionError(HorizonError):
    """The run needs more host RAM or device memory than is available."""

    def __init__(self, message: str, admission: "Admission"):
        super().__init__(message)
        self.admission = admission


class DeviceAdmissionError(AdmissionError, DeviceBudgetError):
    """Refused because the device side does not fit (also a DeviceBudgetError: the arena
    would have stopped the run on its budget, only later)."""


@dataclass(frozen=True)
class Admission:
    """What the run needs and what the machine has: the planner's MemoryVerdict type, with
    this executor's extras in the need and this machine's budgets as usable, plus advice."""
    memory: MemoryVerdict
    advice: list = field(default_factory=list)

    # the verdict's figures under the names admission's callers read
    host_by_role = property(lambda self: self.memory.host_need)
    device_by_role = property(lambda self: self.memory.device_need)
    host_available_bytes = property(lambda self: self.memory.host_usable)
    device_available_bytes = property(lambda self: self.memory.device_usable)
    host_source = property(lambda self: self.memory.host_source)
    device_source = property(lambda self: self.memory.device_source)
    host_need_bytes = property(lambda self: self.memory.host_need_bytes)
    device_need_bytes = property(lambda self: self.memory.device_need_bytes)
    host_fits = property(lambda self: self.memory.host_fits)
    device_fits = property(lambda self: self.memory.device_fits)
    fits = property(lambda self: self.memory.fits)

    def line(self) -> str:
        """One line: needed vs available for both memories."""
        def part(what, need, have, src):
            if have is None:
                return f"{what} needs {fmt_bytes(need)} ({src})"
            verdict = "" if need <= have else f", short by {fmt_bytes(need - have)}"
            return f"{what} needs {fmt_bytes(need)} of {fmt_bytes(have)} available ({src}){verdict}"
        return "; ".join((part("host RAM", self.host_need_bytes, self.host_available_bytes, self.host_source),
                          part("device memory", self.device_need_bytes, self.device_available_bytes,
                               self.device_source)))

    def breakdown(self) -> list[str]:
        return self.memory.breakdown()

    def message(self) -> str:
        """The refusal: needed vs available on the first line, then the breakdown and advice."""
        short = [w for w, ok in (("host RAM", self.host_fits), ("device memory", self.device_fits)) if not ok]
        first = f"the run does not fit in {' and '.join(short)}: {self.line()}"
        rest = self.breakdown() + [f"to change: {a}" for a in self.advice]
        return "\n".join([first] + ["  " + r for r in rest])


# ---- what the machine has --------------------------------------------------------------------
def cuda_free_bytes(device: str) -> int:
    """Free device memory torch.cuda.mem_get_info reports for `device` ('cuda[:N]')."""
    import torch

    from horizon_exec.errors import ExecError
    if not device.startswith("cuda"):
        raise HorizonError(f"device {device!r} is not supported; use 'cpu' or 'cuda[:N]'")
    if not torch.cuda.is_available():
        raise ExecError(f"device={device!r} but torch.cuda.is_available() is False")
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def budgets(device: str, host_budget_bytes: int | None = None, device_budget_bytes: int | None = None):
    """((host bytes usable, where from), (device bytes usable or None, where from)) for a run on
    `device` (module docstring: host available, device available)."""
    if device == "cpu":
        dev_avail, dev_src = device_budget_bytes, ("device budget" if device_budget_bytes is not None else
                                                   "CPU backend: host RAM, no separate limit")
    else:  # a budget above what is free would not stop an out-of-memory error: the smaller counts
        # device budget first: mem_get_info creates the CUDA context, whose host memory the RSS then includes
        free = cuda_free_bytes(device)
        dev_avail, dev_src = free, "free per cudaMemGetInfo"
        if device_budget_bytes is not None and device_budget_bytes < free:
            dev_avail, dev_src = int(device_budget_bytes), "device budget"
    rss = rss_bytes()
    if host_budget_bytes is not None:
        host_avail, host_src = int(host_budget_bytes), "host budget"
    else:
        avail = mem_available_bytes()
        host_avail = None if avail is None else avail + rss
        host_src = ("MemAvailable unknown: not checked" if avail is None else
                    f"MemAvailable {fmt_bytes(avail)} + this process {fmt_bytes(rss)}")
    return _address_space_cap(host_avail, host_src, rss), (dev_avail, dev_src)


def measured_runtime(hardware: HardwareSpec | None) -> bool:
    """Whether `hardware` holds a measured process runtime (calibrate; 0: not measured)."""
    return hardware is not None and hardware.host.runtime_overhead_GiB > 0


def runtime_bytes(hardware: HardwareSpec | None) -> int:
    """The process runtime the need counts (module docstring): the larger of what this process
    holds now and the measured overhead, else RSS now + RUNTIME_GROWTH_BYTES."""
    rss = rss_bytes()
    if measured_runtime(hardware):
        return max(rss, int(hardware.host.runtime_overhead_GiB * GiB))
    return rss + RUNTIME_GROWTH_BYTES  # no file, or one that did not measure it (measure/machine's estimates)


def machine_with_budgets(hardware: HardwareSpec | None, host_bytes: int | None, device_bytes: int | None,
                         layout=None) -> HardwareSpec:
    """`hardware` (its speeds; the presets' without one) with the memories a run may use as its
    usable ones and the process runtime admission counts, laid out as `layout`: the machine
    the planner checks a run's policy against (the admission, train's policy search)."""
    hw = _machine(hardware, host_bytes, device_bytes, runtime_bytes(hardware))
    return hw if layout is None else laid_out(hw, layout)


# ---- what the run needs --------------------------------------------------------------------
def store_padding_bytes(sched) -> int:
    """Bytes the host store adds by starting each static host buffer at a page boundary."""
    return sum(-(-b.bytes // ALIGN) * ALIGN - b.bytes
               for b in sched.buffers.values() if b.static and b.space == Space.HOST)


def _machine(hardware: HardwareSpec | None, host_bytes: int | None, device_bytes: int | None,
             runtime_bytes: int) -> HardwareSpec:
    """A HardwareSpec whose usable memories are the budgets (speeds from `hardware` or the
    presets: they only order the simulated events)."""
    if hardware is None:
        from horizon_sim.specs.hardware_presets import make_hardware
        hardware = make_hardware(_DEFAULT_TIMING[0], host=_DEFAULT_TIMING[1])
    dev_gib = (device_bytes if device_bytes is not None else 2**60) / GiB
    host_gib = (host_bytes if host_bytes is not None else 2**60) / GiB
    # the disk tier's space is not checked here: its file reserves it when made (disk_store.py)
    h = hardware.host
    return replace(hardware, device=replace(hardware.device, hbm_GiB=max(dev_gib, 1e-9), reserved_GiB=0.0),
                   host=replace(h, ram_GiB=max(host_gib, 1e-9), os_reserved_GiB=0.0,
                                runtime_overhead_GiB=runtime_bytes / GiB, disk_GiB=2.0**40,
                                disk_read_GBps=h.disk_read_GBps or 1.0, disk_write_GBps=h.disk_write_GBps or 1.0))


def admit(model: ModelSpec, policy: Policy, sched, *, device: str = "cpu",
          host_budget_bytes: int | None = None, device_budget_bytes: int | None = None,
          hardware: HardwareSpec | None = None, advise: bool = True, data_bytes: int = 0) -> Admission:
    """Simulate `sched` and compare what it needs with what this machine has (module
    docstring). data_bytes: host memory the training data will hold (data.data_bytes_bound,
    counted before it is loaded). Raises AdmissionError (with the breakdown and, when
    `advise`, the nearest policy that fits) when it does not fit; returns the Admission
    otherwise."""
    from horizon_sim.sim.simulate import simulate

    cpu = device == "cpu"
    (host_avail, host_src), (dev_avail, dev_src) = budgets(device, host_budget_bytes, device_budget_bytes)
    # calibrate measures the overhead net of glibc's retention for its tiny probe's largest
    # block (calibrate/overheads.py): this run's own retention, which grows with its blocks,
    # comes on top, as process_rss.predict_rss counts it
    retained = allocator_retained_bytes(model, policy, sched) if cpu and measured_runtime(hardware) else 0
    hw = machine_with_budgets(hardware, host_avail, dev_avail, sched.meta.layout)
    res = simulate(sched, hw)
    adm = _account(model, policy, sched, res, cpu, host_avail, host_src, dev_avail, dev_src, data_bytes, retained)
    if adm.fits:
        return adm
    if advise:
        adm = replace(adm, advice=_advice(model, policy, hw, adm, cpu))
    raise (AdmissionError if adm.device_fits else DeviceAdmissionError)(adm.message(), adm)


def _address_space_cap(host_avail, host_src, rss: int) -> tuple[int | None, str]:
    """The host budget, lowered to what an address-space limit (`ulimit -v`, RLIMIT_AS) lets
    this process still map: RSS now + (limit - VmSize now). Past it every allocation fails
    (MemoryError) however much RAM is free, so it is a budget like --host-budget."""
    limit = address_space_limit_bytes()
    if limit is None:
        return host_avail, host_src
    room = rss + max(0, limit - vm_size_bytes())
    if host_avail is not None and host_avail <= room:
        return host_avail, host_src
    return room, (f"address-space limit (ulimit -v) {fmt_bytes(limit)}: this process {fmt_bytes(rss)} + "
                  f"{fmt_bytes(room - rss)} left to map")


def allocator_retained_bytes(model: ModelSpec, policy: Policy, sched) -> int:
    """CPU backend: freed memory glibc keeps in each of the node's processes (its threads'
    arenas, up to twice the largest freed block each; process_rss.allocator_retention_bytes)."""
    from horizon_sim.sim.process_rss import allocator_retention_bytes, largest_transient_block
    return sched.meta.layout.devices_per_node * allocator_retention_bytes(largest_transient_block(model, policy))


def _account(model, policy, sched, res, cpu, host_avail, host_src, dev_avail, dev_src, data_bytes=0,
             retained_bytes=0) -> Admission:
    # the planner's verdict (weights, constants, activations_grads_workspaces; the host
    # footprint by role), plus what this executor adds to it
    dev = dict(res.summary.memory.device_need)
    if not cpu:
        dev["allocator_and_library_slack"] = CUDA_SLACK_BYTES
    host = {k: int(v) for k, v in res.summary.memory.host_need.items()}
    host["store_padding"] = store_padding_bytes(sched)
    if data_bytes:
        host["training_data"] = int(data_bytes)
    if retained_bytes:
        host["allocator_retention"] = int(retained_bytes)
    if cpu:  # each of the node's ranks has its "device" in host RAM
        host["device_on_cpu_backend"] = sum(dev.values()) * sched.meta.layout.devices_per_node
    return Admission(MemoryVerdict(host_need=host, host_usable=host_avail, device_need=dev,
                                   device_usable=dev_avail, host_source=host_src, device_source=dev_src))


def unrunnable_moves() -> tuple[str, ...]:
    """Planner moves this executor cannot run here, left out of the search for a policy that
    fits: bf16 moments and the split master need the native AdamW kernel (torch's keeps the
    moments in the master dtype and has no split master), so they are out only where it cannot
    be built."""
    from horizon_exec.optim import native
    return () if native.adamw() is not None else ("bf16 moments", "split master")


def _advice(model, policy, hw, adm: Admission, cpu: bool) -> list[str]:
    """What to change: the nearest policy that fits (planner outcomes plus this executor's
    own extras), a bigger budget, or --no-admission."""
    from horizon_sim.plan.advice import nearest_fit, policy_flags
    from horizon_sim.plan.runner import Runner

    out = []
    # What the planner's figures leave out
    extra_host = (adm.host_by_role["store_padding"] + adm.host_by_role.get("training_data", 0)
                  + adm.host_by_role.get("allocator_retention", 0))
    # (the constants are in the planner's peak: they are the Schedule's static device buffers)
    extra_dev = adm.device_by_role.get("allocator_and_library_slack", 0)
    host_avail, dev_avail = adm.host_available_bytes, adm.device_available_bytes

    def need(o):  # (host, device) this executor would need for a planner outcome
        dev = o.device_peak_bytes + extra_dev
        return o.host_bytes + extra_host + (dev if cpu else 0), dev

    def fits(o):
        host, dev = need(o)
        return (host_avail is None or host <= host_avail) and (dev_avail is None or dev <= dev_avail)

    runtime = adm.host_by_role.get("runtime", 0)
    if host_avail is not None and host_avail - extra_host - extra_dev <= runtime:
        out.append(f"the host budget is below what the process needs before any model tensor "
                   f"(runtime {fmt_bytes(runtime)}): no policy can fit it")
    elif dev_avail is not None and dev_avail <= extra_dev:
        out.append("the device budget is below the executor's fixed device tensors: no policy can fit it")
    else:
        with Runner(workers=1) as runner:
            # on the CPU backend device memory is host RAM: a host shortage can be cut on either side
            nf = nearest_fit(model, hw, policy, runner=runner, fits=fits, skip=frozenset(unrunnable_moves()),
                             short=(not adm.host_fits, not adm.device_fits or (cpu and not adm.host_fits)))
        if nf is not None:
            p, o, changes = nf.policy, nf.outcome, nf.changes
            host, dev = need(o)
            out.append(f"nearest policy that fits ({', '.join(changes)}): {policy_flags(p, policy)}"
                       f" (host {fmt_bytes(host)}, device {fmt_bytes(dev)})")
        else:
            out.append("no policy within 3 changes (optimizer, working copy, checkpoint placement, K, "
                       "micro-batches, batch) fits: a smaller model, or more memory")
    if not adm.host_fits:
        short = fmt_bytes(adm.host_need_bytes - host_avail)
        out.append(f"a --host-budget {short} larger" if adm.host_source == "host budget" else
                   f"{short} more available host RAM (stop other processes, or a machine with more RAM)")
    if not adm.device_fits:
        short = fmt_bytes(adm.device_need_bytes - dev_avail)
        out.append(f"a --device-budget {short} larger" if adm.device_source == "device budget" else
                   f"{short} more free device memory (other processes on the device)")
    out.append("--no-admission (AdmissionConfig(enabled=False)) runs anyway; the device arena still stops "
               "a step that exceeds --device-budget")
    return out
