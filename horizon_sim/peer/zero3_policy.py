"""Zero3Policy: DeepSpeed ZeRO-3 with its parameters and optimizer offloaded to CPU memory, as
users run it today, described by the knobs that change its step; with offload_param off, DeepSpeed
ZeRO-2 offload (the optimizer alone offloaded, the parameters resident on the GPU: the family
zero2-offload). One object drives both the
planner's model of it (zero3_builder.py) and the real DeepSpeed run (ds_config()), so the two
never describe different configurations.

Defaults are DeepSpeed's own (deepspeed/runtime/zero/config.py, 0.19): prefetch bucket 5e7
parameters, max live parameters 1e9, max reuse distance 1e9, reduce bucket 5e8, overlap_comm on
for stage 3, pinned offload buffers. The mechanisms below them (per-tensor copies, a synchronise
per wait, module hooks, the fp32 gradient round trip, per-parameter norms) are what DeepSpeed
0.19 does on one GPU, on by default; each can be turned off to see what it costs, or to describe
another setup (docs/zero3_peer.md).
"""
from dataclasses import asdict, dataclass, fields, replace

from horizon_sim.errors import HorizonError
from horizon_sim.schedule.op import Family
from horizon_sim.specs.from_dict import spec_from_dict
from horizon_sim.specs.policy import DTYPES, MAX_BATCH, MAX_SEQ, Policy


@dataclass(kw_only=True, frozen=True, slots=True)
class Zero3Policy:
    batch: int = 4
    """Sequences per optimizer step (all micro-batches together)."""
    seq: int = 2048
    micro_batches: int = 1
    """gradient_accumulation_steps."""
    act_ckpt: bool = True
    """Activation checkpointing per decoder layer (transformers' gradient_checkpointing_enable):
    a layer keeps only its input and recomputes its forward in the backward; off, autograd keeps
    every layer's saved tensors on the device until its backward."""
    compute_dtype: str = "bf16"
    """bf16: the bf16 section on (parameters and gradients bf16 on the device); fp32: off."""
    grad_clip: float = 1.0
    """gradient_clipping (0 = off)."""
    prefetch_bucket_params: int = 50_000_000
    """stage3_prefetch_bucket_size: parameters fetched ahead of the module about to run."""
    max_live_params: int = 1_000_000_000
    """stage3_max_live_parameters: parameters kept on the device at once at most."""
    max_reuse_distance_params: int = 1_000_000_000
    """stage3_max_reuse_distance: a fetched parameter used again within this many parameters'
    worth of fetches is not released in between."""
    reduce_bucket_params: int = 500_000_000
    """reduce_bucket_size: gradients gathered on the device before they are reduced and offloaded."""
    overlap_comm: bool = True
    """Offload gradients while the backward goes on (off: the backward waits for each bucket)."""
    pin_memory: bool = True
    """offload_optimizer's pin_memory: page-locked host gradient buffers (off: their copies run at
    the link's pageable rate, and the host thread sits in each until it is done: a copy to or
    from pageable memory is synchronous for the host, CUDA Runtime API 'API synchronization
    behavior'). It never unpins the parameters the device fetches: ZeRO-3 keeps their host
    partition in one page-locked flat buffer whatever the config says
    (stage3.py _create_param_groups_fp16_flat_cpu_memory: `pin_memory=True` at v0.5.7 l.1111
    and v0.7.0 l.544, `get_accelerator().pin_memory(...)` at 0.19.8 l.906). The gradient
    buffers it does page: grad_partitions_flat_buffer (v0.7.0 l.382-386) and the fp32 gradient
    (initialize_optimizer_states, v0.7.0 l.913-914); ZeRO-2 offload's host buffers
    (stage_1_and_2.py, 0.19.8 l.564-572, 656, 940)."""
    per_tensor_fetch: bool = True
    """One copy per parameter tensor, each paying the link's latency (partition_parameters.py:
    with one rank, all_gather_coalesced -> _no_gather_coalesced, one `ds_tensor.data.to(device,
    non_blocking=True)` per parameter). Off: a unit in one copy."""
    sync_per_wait: bool = True
    """The host blocks on the copy stream at every wait (NoGatherHandle.wait /
    NoGatherCoalescedHandle.wait: `current_stream().synchronize()` unless the accelerator
    resolves data dependencies, which CUDA does not; called from
    partitioned_param_coordinator.fetch_sub_module), so a unit's hooks, and the kernels they
    issue, start only once its parameters have arrived. Off: the hooks run while they fly."""
    hook_us: float = 50.0
    """Host time of one module hook call (pre- or post-forward, pre- or post-backward:
    parameter_offload.py registers them on every module), microseconds. Estimate: validate --peer
    on this project's EPYC measured DeepSpeed's fixed cost per Llama layer forward at 4317 us
    (reports/validation_peer.md) against 3062 us for Horizon's executor on the same layer
    (reports/machine.toml, op_overhead_us forward): 1255 us over 13 modules x 2 hooks, ~48 us a
    call. A faster host's Python costs less; 0 turns the hooks off."""
    tensor_op_us: float = 15.0
    """Host time of one eager PyTorch call per parameter tensor (a copy's `.to()`, a gradient's
    copy_, a norm), microseconds. Estimate: the order of one eager op's dispatch; the H200 run
    measured 1.15 ms of fixed cost per layer forward for a few dozen such calls (docs/gpu_runs.md)."""
    fp32_grad_copy: bool = True
    """DeepSpeed's gradient partition lives in pinned host memory (stage3.py:
    grad_partitions_flat_buffer on the CPU under offload_optimizer, in gradient_accumulation_dtype,
    which is the model's dtype unless ds_config's data_types.grad_accum_dtype says otherwise:
    engine.py get_data_types) and partition_grads takes it through the device: the first
    micro-batch's copy_ into it is followed by `.to(device)` back (a bytes a parameter each way,
    a = the compute dtype's), later micro-batches copy it up, add on the device and copy it back,
    and the boundary (_offload_grad_partition_at_boundary) casts it to fp32 on the device and
    copies it into the optimizer's fp32 gradient (4 bytes down). Off: one 4-byte copy down per
    micro-batch, summed on the host."""
    host_cast_at_boundary: bool = False
    """With fp32_grad_copy: how the boundary's gradient reaches the optimizer's fp32 gradient.
    Off, DeepSpeed 0.19 (_offload_grad_partition_at_boundary, 0.19.8 l.1456-1457:
    `copy_(grad_buffer.to(dtype=fp32), non_blocking=True)`): cast on the device, 4 bytes a
    parameter down. On, DeepSpeed v0.6.0 to v0.7.2 (stage3.py __partition_grads, v0.7.0
    l.1298-1302: `fp32_grad_tensor.copy_(grad_buffer)`, a blocking copy from the device's
    compute-dtype buffer into the host's fp32 one): PyTorch converts a blocking device-to-host
    copy on the CPU (aten/src/ATen/native/cuda/Copy.cu copy_kernel_cuda: 'Type conversions are
    performed on the CPU for CPU-GPU copies'), so the gradient crosses in the compute dtype (a
    bytes) into a host temporary and the host casts it into the fp32 gradient (a + 4 bytes a
    parameter of host traffic)."""
    per_param_norm: bool = True
    """At the boundary, a norm per parameter tensor on the device (_constant_buffered_norm2 of
    each gradient: a pass over its fp32 bytes), summed in a Python loop over every tensor
    (complete_grad_norm_calculation_for_cpu_offload). Off: the norm is free, as Horizon's
    offload folds it into the copy."""

    offload_param: bool = True
    """DeepSpeed's offload_param: the parameters live in host memory and each unit's are fetched
    to the device for its uses (ZeRO-3 offload, the family zero3-offload). Off: ZeRO-2 offload
    (stage 2 with offload_optimizer only, the family zero2-offload): every parameter stays on the
    device in the compute dtype, nothing is fetched; gradients go to the host per reduce bucket
    as under ZeRO-3; after the CPU Adam the updated parameters cross the link back to the device
    (adam_copies_params). The fetch knobs (prefetch_bucket_params, max_live_params,
    max_reuse_distance_params, per_tensor_fetch, sync_per_wait, hook_us) are ZeRO-3's and keep
    their defaults; ZeRO-2 registers no module hooks, only a gradient hook per parameter
    (tensor_op_us per call)."""
    adam_copies_params: bool = False
    """ZeRO-2 offload only: how the updated parameters reach the device. Off, DeepSpeed 0.19
    (stage_1_and_2.py step: DeepSpeedCPUAdam.step() over the whole parameter group, then
    `bit16_partition_buffer.copy_(fp32_partition)` on the host and one non_blocking copy to the
    device; the tiled path is commented out there, 'the C++ side copy & synchronize is not
    working correctly'): the Adam over every unit, then a cast pass on the host into a pinned
    buffer in the compute dtype and the copy, nothing overlapping them. On, DeepSpeed of 2020-21
    (stage2.py step: `self.optimizer.step(fp16_param_groups=...)`, whose C++ Adam writes each
    tile's fp16 values to a pinned buffer and copies it to the device while it updates the next
    tile): each unit's copy as soon as its Adam is done, no host cast pass and no cast buffer
    (the Adam's own tile buffers are adam_tile_params)."""
    adam_tile_params: int = 0
    """Elements (fp32) of each of DeepSpeedCPUAdam's two page-locked tile buffers, which its C++
    Adam_Optimizer allocates when it is built and holds for the run (csrc/includes/cpu_adam.h:
    `cudaMallocHost(_doubled_buffer[i], TILE * sizeof(float))`, l.63-64 at v0.3.0): TILE =
    1024^3 from the ZeRO-Offload release (v0.3.0) to v0.3.14, 8 GiB in all; 128 x 1024^2 from
    v0.3.15 to v0.14.2, 1 GiB (CUDA builds); none since v0.14.3 (#5409 removed the tiled copy
    to the device), so 0, DeepSpeed 0.19's. Host memory only (peer/host_extras.py)."""
    fork_copies: bool = False
    """The training script forks worker processes after the optimizer state exists and they
    live through the run (a torch DataLoader with num_workers > 0 under Linux's default fork
    start, its iterator made after deepspeed.initialize): the first write to each page of the
    pageable host state after the fork copies it for the trainer (copy-on-write) while the
    workers keep the original, so that state is held twice. Pageable: the Adam moments in every
    version (DeepSpeedCPUAdam's `torch.zeros_like`, cpu_adam.py l.60-62 at v0.3.0), the fp32
    master under ZeRO-3 (stage3.py _create_fp32_partitions, 0.19) and under ZeRO-2 before
    0.14.1 (stage2.py l.270-272 at v0.3.0; #5301 pins it under pin_memory since, and there the
    moments alone are copied, which this knob does not separate), and with pin_memory off every
    host buffer the step writes. Page-locked memory is mapped shared by the NVIDIA driver and not
    copied. Off (default): no workers, or forked before the state was allocated. Host memory
    only (peer/host_extras.py)."""

    def __post_init__(self):
        for f in ("batch", "seq", "micro_batches", "prefetch_bucket_params", "max_live_params",
                  "max_reuse_distance_params", "reduce_bucket_params"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise HorizonError(f"zero3 policy {f}={v!r} must be a positive integer")
        if self.batch > MAX_BATCH or self.seq > MAX_SEQ:
            raise HorizonError(f"zero3 policy batch={self.batch} seq={self.seq}: allowed up to "
                               f"{MAX_BATCH:,} x {MAX_SEQ:,}")
        if self.batch % self.micro_batches:
            raise HorizonError(f"zero3 policy batch={self.batch} is not divisible by "
                               f"micro_batches={self.micro_batches}")
        if self.compute_dtype not in DTYPES:
            raise HorizonError(f"zero3 policy compute_dtype={self.compute_dtype!r}; allowed: {', '.join(DTYPES)}")
        if not isinstance(self.adam_tile_params, int) or isinstance(self.adam_tile_params, bool) \
                or self.adam_tile_params < 0:
            raise HorizonError(f"zero3 policy adam_tile_params={self.adam_tile_params!r} must be an integer >= 0")
        for f in ("offload_param", "adam_copies_params", "fork_copies", "act_ckpt", "overlap_comm", "pin_memory",
                  "per_tensor_fetch", "sync_per_wait", "fp32_grad_copy", "host_cast_at_boundary", "per_param_norm"):
            if not isinstance(getattr(self, f), bool):
                raise HorizonError(f"zero3 policy {f}={getattr(self, f)!r} must be true or false")
        if not isinstance(self.grad_clip, (int, float)) or isinstance(self.grad_clip, bool) or self.grad_clip < 0:
            raise HorizonError(f"zero3 policy grad_clip={self.grad_clip!r} must be a number >= 0 (0 = off)")
        for f in ("hook_us", "tensor_op_us"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1e6:
                raise HorizonError(f"zero3 policy {f}={v!r} must be a number of microseconds from 0 to 1e6")
        if self.host_cast_at_boundary and not self.fp32_grad_copy:
            raise HorizonError("zero3 policy host_cast_at_boundary=true is the boundary copy of fp32_grad_copy's "
                               "round trip (DeepSpeed v0.6.0-v0.7.2); with fp32_grad_copy=false the gradient is cast "
                               "on the device")
        if self.offload_param and self.adam_copies_params:
            raise HorizonError("zero3 policy adam_copies_params=true is ZeRO-2 offload's (offload_param=false, "
                               "the family zero2-offload): under ZeRO-3 the Adam writes the host partition the "
                               "next step fetches")
        if not self.offload_param:
            moved = [f for f in ZERO3_FETCH_KNOBS if getattr(self, f) != _DEFAULTS[f]]
            if moved:
                raise HorizonError(f"zero2-offload keeps every parameter on the device: {', '.join(moved)} "
                                   f"(ZeRO-3's parameter fetch, module hooks and stage-3 gradient path) "
                                   f"must keep the default")

    @property
    def family(self) -> Family:
        """The schedule family this policy describes."""
        return Family.ZERO3_OFFLOAD if self.offload_param else Family.ZERO2_OFFLOAD

    @property
    def title(self) -> str:
        """What users call it ("DeepSpeed ZeRO-3 offload")."""
        return "DeepSpeed ZeRO-3 offload" if self.offload_param else "DeepSpeed ZeRO-2 offload"

    def on_cpu_accelerator(self) -> "Zero3Policy":
        """The same policy as DeepSpeed's CPU accelerator runs it (validate --peer): its `.to(cpu)`
        copies and stream synchronises are no-ops, the gradient partition is already on the
        'device', and validate measures the per-op fixed costs whole (hooks included), so the
        GPU mechanisms are off."""
        return replace(self, per_tensor_fetch=False, sync_per_wait=False, hook_us=0.0, tensor_op_us=0.0,
                       fp32_grad_copy=False, host_cast_at_boundary=False, per_param_norm=False)

    @property
    def micro_batch(self) -> int:
        return self.batch // self.micro_batches

    @classmethod
    def from_dict(cls, d: dict, what: str = "") -> "Zero3Policy":
        """The spec to_dict() wrote (unknown fields: a one-line error naming them)."""
        return spec_from_dict(cls, d, what)

    def to_dict(self) -> dict:
        return asdict(self)

    def horizon_policy(self) -> Policy:
        """The Policy the peer's Schedule carries in its meta, for what the simulator reads from
        one (batch shape, dtypes, clipping): optimizer after backward, fp32 gradients on the
        host, one loss chunk (transformers computes every logit at once), layer checkpoints on
        the device."""
        return Policy(batch=self.batch, seq=self.seq, micro_batches=self.micro_batches, act_ckpt_every=1,
                      master_dtype="fp32",  # DeepSpeed's master is the whole fp32 one, never split
                      act_ckpt_on="device", compute_dtype=self.compute_dtype, grad_dtype=self.compute_dtype,
                      # the host copy in the compute dtype: ZeRO-3's partition, ZeRO-2's cast buffer;
                      # none where the Adam copies its tiles to the device itself
                      working_copy=self.compute_dtype != "fp32" and not self.adam_copies_params, optimizer="after", grad_clip=float(self.grad_clip),
                      loss_chunk_tokens=self.micro_batch * self.seq)

    def ds_config(self) -> dict:
        """The DeepSpeed config of this policy (deepspeed.initialize(config=...)): ZeRO stage 3,
        parameters and optimizer on the CPU (offload_param off: stage 2, the optimizer on the
        CPU), DeepSpeed's AdamW (DeepSpeedCPUAdam). lr and betas are the caller's
        (`optimizer.params`)."""
        if not self.offload_param:
            cfg = self._zero3_config()
            cfg["zero_optimization"] = {
                "stage": 2,
                "offload_optimizer": {"device": "cpu", "pin_memory": self.pin_memory},
                "reduce_bucket_size": self.reduce_bucket_params,
                "overlap_comm": self.overlap_comm,
                "contiguous_gradients": True,
            }
            return cfg
        return self._zero3_config()

    def _zero3_config(self) -> dict:
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.micro_batches,
            "gradient_clipping": float(self.grad_clip),
            "bf16": {"enabled": self.compute_dtype == "bf16"},
            "zero_optimization": {
                "stage": 3,
                "offload_param": {"device": "cpu", "pin_memory": self.pin_memory},
                "offload_optimizer": {"device": "cpu", "pin_memory": self.pin_memory},
                "stage3_prefetch_bucket_size": self.prefetch_bucket_params,
                "stage3_max_live_parameters": self.max_live_params,
                "stage3_max_reuse_distance": self.max_reuse_distance_params,
                "reduce_bucket_size": self.reduce_bucket_params,
                "overlap_comm": self.overlap_comm,
                "contiguous_gradients": True,
            },
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                                      "weight_decay": 0.0}},
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }


ZERO3_FETCH_KNOBS = ("prefetch_bucket_params", "max_live_params", "max_reuse_distance_params", "per_tensor_fetch",
                     "sync_per_wait", "hook_us", "host_cast_at_boundary")
"""Knobs of ZeRO-3's parameter fetch, module hooks and stage-3 gradient path (stage3.py):
ZeRO-2 offload has none of them."""
_DEFAULTS = {f.name: f.default for f in fields(Zero3Policy) if f.name in ZERO3_FETCH_KNOBS}
