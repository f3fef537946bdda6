"""What a Trainer drives, built in one place: the checks that must pass before anything is
allocated (the optimizer's kernels, a given Schedule's origin, the admission), then the
collaborators in dependency order (backend, host store, disk tier, arena, buffer table, op
runner, master access, engine). Trainer (trainer.py) only drives steps over the `Runtime` this
returns; nothing here knows about steps.

    adamw = optimizer_for(policy, config.optimizer)        # HorizonError before any allocation
    sched = schedule_for(model, policy, dist, schedule)    # built, or a given one checked
    rt = assemble(model, policy, config, sched, dist, adamw)
    ...
    rt.close()                                             # lane threads, device, disk file
"""
import tempfile
from dataclasses import dataclass

from horizon_exec.device.arena import DeviceArena
from horizon_exec.device.backend import make_backend
from horizon_exec.device.core_split import resolve_compute_threads
from horizon_exec.model.xent import check_loss_kernel
from horizon_exec.device.cpu import cpu_cores
from horizon_exec.dist.context import agree, cores_of
from horizon_exec.dtypes import TORCH_DTYPE
from horizon_exec.errors import ExecError
from horizon_exec.model.layout import host_layout
from horizon_exec.optim import native
from horizon_exec.optim.adamw import AdamW
from horizon_exec.runtime.admission import admit
from horizon_exec.runtime.buffers import BufferTable
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.engine import RUN_LANES, Engine
from horizon_exec.runtime.master import Master, viewless_master
from horizon_exec.runtime.ops import OpRunner
from horizon_exec.runtime.store import HostStore
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import Holds, build_schedule
from horizon_sim.schedule.op import Family, Space
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


@dataclass(frozen=True, slots=True)
class Runtime:
    """The collaborators of one Trainer, wired to each other and to its Schedule."""
    admission: object
    """The admission's verdict (runtime/admission.py Admission), None when it was skipped."""
    backend: object
    """The device backend (device/backend.py): lanes, device memory, host pool."""
    store: HostStore
    """The host store: every buffer that lives for the whole run (the node's, shared by its ranks)."""
    disk: object
    """The disk tier's file (runtime/disk_store.py DiskStore), None without a disk tier."""
    arena: DeviceArena
    buffers: BufferTable
    runner: OpRunner
    """What each op does (runtime/ops.py)."""
    master: Master
    """fp32 access to the master, however it is held (split, sharded over nodes)."""
    engine: Engine
    """Runs a schedule's ops on their lanes (runtime/engine.py)."""
    units: tuple
    """The trained units in the Schedule's order: embedding, blocks, head."""
    params: dict
    """transformers name -> a view of the master store (adapters: of the frozen base, in the
    compute dtype); empty when no tensor holds the whole master here (a split master, or
    several nodes)."""

    def close(self) -> None:
        """Stop the lane threads, release the device (CUDA: unregister host memory) and remove
        the disk tier's file. Holds no reference to the Trainer: it is the Trainer's finalizer."""
        self.engine.close()
        self.backend.close()
        if self.disk is not None:
            self.disk.close()


def optimizer_for(policy: Policy, opt: OptimizerConfig) -> AdamW:
    """The run's AdamW; HorizonError, before anything is built, when the policy's precisions
    need a native kernel this machine lacks."""
    adamw = AdamW(lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)
    try:  # bf16 moments with an fp32 master need the native kernel: say so before allocating
        adamw.uses_native(TORCH_DTYPE[policy.master_dtype], TORCH_DTYPE[policy.states_dtype])
    except ExecError as e:
        raise HorizonError(f"policy states_dtype={policy.states_dtype}: {e}. Use states_dtype="
                           f"{policy.master_dtype} (--states-dtype {policy.master_dtype})") from None
    if policy.split_master and native.kernels() is None:
        raise HorizonError(f"policy split_master=True (--master-dtype split) needs the native kernels; "
                           f"{native.status()}. Use --master-dtype fp32")
    return adamw


def schedule_for(model: ModelSpec, policy: Policy, dist, schedule=None):
    """Horizon's step for (model, policy) on the run's layout: built, or `schedule` checked to
    be exactly that (e.g. the one the planner simulated, or one read from JSON)."""
    if schedule is None:
        return build_schedule(model, policy, dist.layout)
    meta = schedule.meta
    if meta.family != Family.HORIZON:
        from horizon_sim.plan.families import family
        raise HorizonError(f"the schedule is a {meta.family.value} step; the executor runs Horizon's "
                           f"(a {meta.family.value} step is run by {family(meta.family).runs_for_real})")
    if meta.layout != dist.layout:
        raise HorizonError(f"the schedule is one rank's step of {meta.layout}; this run has {dist.layout}")
    if meta.purpose != "train":
        raise HorizonError(f"the schedule is an {meta.purpose} schedule; the trainer runs a training step's")
    for what, have, want in (("model", meta.model, model), ("policy", meta.policy, policy)):
        if have != want:
            raise HorizonError(f"the schedule was built for another {what} than the trainer's")
    return schedule.check()


def assemble(model: ModelSpec, policy: Policy, config: TrainerConfig, sched, dist, adamw: AdamW) -> Runtime:
    """The Runtime that runs `sched` (this rank's step) for `dist`'s rank; AdmissionError
    (runtime/admission.py) before any allocation when the run does not fit this machine."""
    rt, adm = config.runtime, config.admission
    check_loss_kernel(policy.loss_kernel, rt.device)  # a fused loss needs the CPU backend's native kernel
    # Before any allocation: does the run fit this machine (data parallel: this node)?
    # AdmissionError if not; every rank hears of any rank's failure before anyone allocates.
    admission = agree(dist, lambda: admit(model, policy, sched, device=rt.device,
                                          host_budget_bytes=adm.host_budget_bytes,
                                          device_budget_bytes=adm.device_budget_bytes, hardware=adm.hardware,
                                          data_bytes=adm.data_bytes) if adm.enabled else None)
    kw = dict(cores=cores_of(dist, cpu_cores())) if rt.device == "cpu" and dist.world > 1 else {}
    kw["compute_dtype"] = policy.compute_dtype  # the CPU backend's GEMMs for it (device/bf16_gemm.py)
    threads, why = None, ""
    if rt.device == "cpu":  # where the cores go: the planner's split for this Schedule ('auto')
        threads, why = resolve_compute_threads(rt.compute_threads, sched, adm.hardware,
                                               len(kw.get("cores") or cpu_cores()), dist.world)
    backend = make_backend(rt.device, timeout_s=rt.timeout_s, compute_threads=threads,
                           pin_cores=rt.pin_cores, **kw)
    backend.split_why = why
    store = HostStore(sched, model, backend, dist)
    disk = None  # the disk tier (policy disk_tier): a file in disk_dir, gone with the process
    if sched.static_bytes(Space.DISK):
        from horizon_exec.runtime.disk_store import DiskStore, disk_buffers
        disk = DiskStore(disk_buffers(sched), rt.disk_dir or tempfile.gettempdir(), rt.disk_method)
    arena = DeviceArena(backend, adm.device_budget_bytes)
    buffers = BufferTable(sched, store, arena, backend)
    runner = OpRunner(model=model, policy=policy, sched=sched, buffers=buffers, store=store, arena=arena,
                      backend=backend, adamw=adamw, dist=dist, disk=disk, seed=config.seed,
                      temporaries=rt.temporaries_for(model, policy))
    master = Master(store, sched, runner, dist, policy.split_master and not policy.adapters, disk,
                    frozen=policy.adapters, quant=runner.quant)
    units = tuple(sorted(b.unit for b in [*sched.of(Holds.BASE_WEIGHTS), *sched.of(Holds.QUANT_BASE)])) \
        if policy.adapters else tuple(b.unit for b in sched.of(Holds.MOMENTS))
    params = {}
    if master.node_whole and not viewless_master(policy):  # the whole master is in this store, as views
        for u in units:
            lay = host_layout(model, u)
            params.update(lay.views(store.of(master.holds, u)[:lay.numel]))
    lanes = tuple(dict.fromkeys((*RUN_LANES, *sched.lanes)))  # + a data-parallel step's fabric, net
    engine = Engine(backend, runner, timeout_s=rt.timeout_s, lanes=lanes)
    return Runtime(admission=admission, backend=backend, store=store, disk=disk, arena=arena, buffers=buffers,
                   runner=runner, master=master, engine=engine, units=units, params=params)
