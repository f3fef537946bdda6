"""Ops, lanes and buffers: the vocabulary of a Schedule.

An op runs on one lane (lanes are FIFO, like CUDA streams), waits for the ops in `deps`,
does the work described by its cost fields, and touches named buffers. Buffer accesses are
the memory effects: a dynamic buffer is allocated when an op that writes it starts and is
released when an op that lists it in `frees` ends; static buffers (weight slots, the host
store) live for the whole run. Dependencies are derived from these accesses by the builder
and re-checked by validation, so a missing dependency is a detectable hazard, not a race.
"""
from dataclasses import dataclass
from enum import Enum

from horizon_sim.schedule.partition import Part
from horizon_sim.specs.layout import ONE, Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


class Lane(str, Enum):
    H2D = "h2d"          # host -> device copies
    COMPUTE = "compute"  # device compute
    D2H = "d2h"          # device -> host copies
    CPU = "cpu"          # host CPU work: optimizer, embedding gather/scatter, norms
    FABRIC = "fabric"    # collectives among a node's devices (NVLink, PCIe peer-to-peer)
    NET = "net"          # collectives between nodes (the NICs), and the norm's all-reduce
    DISK = "disk"        # reads and writes of the host state kept on local disk (the disk tier)


class OpKind(str, Enum):
    EMBED_FWD = "embed_fwd"                    # cpu: gather embedding rows of the batch
    LOAD_INPUT = "load_input"                  # h2d: embedded tokens -> layer-0 input
    LOAD_WEIGHTS = "load_weights"              # h2d: a unit's working weights -> a slot
    FORWARD = "forward"                        # compute: block forward, no autograd
    SAVE_CKPT = "save_ckpt"                    # d2h: boundary activation -> host
    LOAD_CKPT = "load_ckpt"                    # h2d: boundary activation -> device
    HEAD = "head"                              # compute: final norm, LM head, chunked loss, fwd+bwd
    HEAD_LOSS = "head_loss"                    # compute: final norm, LM head, chunked loss, forward only (eval)
    RECOMPUTE = "recompute"                    # compute: block forward from a checkpoint, no autograd
    BACKWARD = "backward"                      # compute: block forward with grad + autograd.grad
    OFFLOAD_GRADS = "offload_grads"            # d2h: a unit's weight grads -> host grad buffer
    OFFLOAD_INPUT_GRAD = "offload_input_grad"  # d2h: grad of the layer-0 input -> host
    EMBED_BWD = "embed_bwd"                    # cpu: scatter-add into the embedding grad
    GRAD_NORM = "grad_norm"                    # cpu: global grad norm from per-unit partial norms
    OPTIMIZER = "optimizer"                    # cpu: AdamW on one unit (+ working-copy refresh)
    # data parallel (a Schedule built for more than one device; one rank's view, all alike)
    REDUCE_SCATTER = "reduce_scatter"          # fabric: a unit's device grads summed over the node's
    #                                            devices, each keeping 1/N
    HOST_REDUCE = "host_reduce"                # cpu: a grad accumulated on the host (embedding) summed
    #                                            over the node's ranks in shared memory, each keeping 1/N
    NET_REDUCE_SCATTER = "net_reduce_scatter"  # net: a rank's grad shard summed over nodes, each keeping 1/M
    NET_ALL_GATHER = "net_all_gather"          # net: the updated working-copy slices from every node
    NORM_ALL_REDUCE = "norm_all_reduce"        # net: the global norm's partial sums over all ranks
    UPDATE_BARRIER = "update_barrier"          # net: every rank of the node has updated its slice of a
    #                                            unit in the shared store (before any rank loads it)
    # the disk tier (policy disk_tier): a unit's Adam moments live in a file on local disk
    DISK_READ = "disk_read"                    # disk: a unit's moments (and low halves) -> RAM stages,
    #                                            ahead of its update
    DISK_WRITE = "disk_write"                  # disk: the updated ones -> the file, freeing the stages
    # the peer's step (horizon_sim/peer: ZeRO-3 offload), simulated, never run by the executor
    BACKWARD_SAVED = "backward_saved"          # compute: a block's backward from what autograd saved in
    #                                            its forward (a persistent graph: no forward again)
    HOOKS = "hooks"                            # cpu: the host thread's fixed cost before a unit's kernels
    #                                            are issued (DeepSpeed's module hooks, per-tensor dispatch)
    HOST_PASS = "host_pass"                    # cpu: one streaming pass over a unit's host arrays (DeepSpeed's
    #                                            unscale of the fp32 gradients, its cast of the updated master)
    RELOAD_GRADS = "reload_grads"              # h2d: a gradient partition kept in host memory back to the
    #                                            device (DeepSpeed's partition_grads round trip)
    UPLOAD_PARAMS = "upload_params"            # h2d: a unit's updated parameters, in the compute dtype, to
    #                                            their resident device copy after the CPU Adam (ZeRO-2 offload)
    # adapters on a frozen base (Policy.lora_rank)
    ADAPTER_UPDATE = "adapter_update"          # compute: the adapters' global gradient norm, clipping and
    #                                            AdamW, on the device, after the backward
    ADAPTER_ALL_REDUCE = "adapter_all_reduce"  # fabric: the adapters' gradient sums (and, on one node, the
    #                                            loss) summed over the node's devices, before the update
    ADAPTER_NET_ALL_REDUCE = "adapter_net_all_reduce"  # net: those sums (and the loss) summed over the nodes,
    #                                            among the ranks of one local rank, before the update
    OFFLOAD_ADAPTER_GRADS = "offload_adapter_grads"  # d2h: one backward's adapter gradient added into the
    #                                            block's host sum (adapters_on 'host')
    ADAPTER_HOST_UPDATE = "adapter_host_update"  # cpu: ADAPTER_UPDATE's norm, clipping and AdamW on the host
    #                                            (adapters_on 'host')
    # preference tuning (Policy.objective 'dpo'): the reference model's pass before the step's own
    REF_FORWARD = "ref_forward"                # compute: a block forward of the reference (the base without
    #                                            its adapters), no autograd


LANE_OF: dict[OpKind, Lane] = {
    OpKind.EMBED_FWD: Lane.CPU, OpKind.EMBED_BWD: Lane.CPU, OpKind.GRAD_NORM: Lane.CPU,
    OpKind.OPTIMIZER: Lane.CPU,
    OpKind.LOAD_INPUT: Lane.H2D, OpKind.LOAD_WEIGHTS: Lane.H2D, OpKind.LOAD_CKPT: Lane.H2D,
    OpKind.FORWARD: Lane.COMPUTE, OpKind.HEAD: Lane.COMPUTE, OpKind.HEAD_LOSS: Lane.COMPUTE,
    OpKind.RECOMPUTE: Lane.COMPUTE,
    OpKind.BACKWARD: Lane.COMPUTE, OpKind.BACKWARD_SAVED: Lane.COMPUTE,
    OpKind.SAVE_CKPT: Lane.D2H, OpKind.OFFLOAD_GRADS: Lane.D2H, OpKind.OFFLOAD_INPUT_GRAD: Lane.D2H,
    OpKind.REDUCE_SCATTER: Lane.FABRIC, OpKind.HOST_REDUCE: Lane.CPU, OpKind.NET_REDUCE_SCATTER: Lane.NET,
    OpKind.NET_ALL_GATHER: Lane.NET, OpKind.NORM_ALL_REDUCE: Lane.NET, OpKind.UPDATE_BARRIER: Lane.NET,
    OpKind.DISK_READ: Lane.DISK, OpKind.DISK_WRITE: Lane.DISK,
    OpKind.HOOKS: Lane.CPU, OpKind.HOST_PASS: Lane.CPU, OpKind.RELOAD_GRADS: Lane.H2D, OpKind.UPLOAD_PARAMS: Lane.H2D,
    OpKind.ADAPTER_UPDATE: Lane.COMPUTE, OpKind.ADAPTER_ALL_REDUCE: Lane.FABRIC, OpKind.REF_FORWARD: Lane.COMPUTE,
    OpKind.ADAPTER_NET_ALL_REDUCE: Lane.NET, OpKind.OFFLOAD_ADAPTER_GRADS: Lane.D2H,
    OpKind.ADAPTER_HOST_UPDATE: Lane.CPU,
}
COLLECTIVES = (OpKind.REDUCE_SCATTER, OpKind.NET_REDUCE_SCATTER, OpKind.NET_ALL_GATHER, OpKind.NORM_ALL_REDUCE,
               OpKind.UPDATE_BARRIER, OpKind.ADAPTER_ALL_REDUCE, OpKind.ADAPTER_NET_ALL_REDUCE)
"""Ops whose work is net_bytes among `peers` ranks."""

EMBED = -1  # `unit` of the embedding; blocks are 0..L-1 and the head is L.


class Space(str, Enum):
    DEVICE = "device"
    HOST = "host"
    DISK = "disk"  # a file on the host's local disk (the disk tier), read and written by DISK ops


class Holds(str, Enum):
    """What a buffer holds: how both interpreters find and shape it (never from its name)."""
    # the host store (static)
    MASTER = "master"                    # (params,) a unit's master weights
    MASTER_LOW = "master_low"            # (params,) int16 the low halves of a split fp32 master
    #                                      (its high halves are the working copy)
    MOMENTS = "moments"                  # (2, params) Adam m then v
    MOMENTS_STAGE = "moments_stage"      # (2, params) a unit's moments in RAM between its DISK_READ
    #                                      and DISK_WRITE (the disk tier)
    MASTER_LOW_STAGE = "master_low_stage"  # (params,) int16 the same for a split master's low halves
    WORKING_COPY = "working_copy"        # (params,) the weights in the compute dtype
    BASE_WEIGHTS = "base_weights"        # (params,) a frozen base's weights in the compute dtype (adapters:
    #                                      the unit's whole host store)
    REF_ACTIVATION = "ref_activation"    # (micro_batch, seq, hidden) the reference's boundary entering block `layer`
    #                                      (DPO: the reference pass, before the step's own)
    REF_WEIGHTS = "ref_weights"          # (params,) full fine-tuning's DPO: the reference's weights in the compute
    #                                      dtype (the run's start), static, what the reference pass loads
    REF_LOGPS = "ref_logps"              # (batch,) fp32 each row's completion log-probability under the
    #                                      reference (DPO), from the reference pass's HEAD_LOSS to the HEADs
    QUANT_BASE = "quant_base"            # (bytes,) uint8 a frozen base's block stored quantized (Policy.base_quant:
    #                                      specs/quant.py's regions), the block's whole host store
    GRAD_SQ = "grad_sq"                  # (1,) fp64 a unit's squared gradient norm
    GRAD_NORM = "grad_norm"              # (1,) fp64 the global gradient norm (data parallel: this
    #                                      rank's sum of squares until NORM_ALL_REDUCE)
    # gradients of a unit on the host (static when they cross the step: pipelined)
    HOST_GRAD = "host_grad"              # (params,)
    # device
    WEIGHT_SLOT = "weight_slot"          # (elements,) a slot the units' weights stream into
    ACTIVATION = "activation"            # (micro_batch, seq, hidden) entering block `layer`
    ACTIVATION_GRAD = "activation_grad"  # (micro_batch, seq, hidden) its gradient
    DEVICE_GRAD = "device_grad"          # (device params,) a unit's weight grads, one micro-batch;
    #                                      micro None: fp32, summed over the step's micro-batches
    #                                      (mb_order 'layer'; an op that reads it adds into it)
    DEVICE_GRAD_SHARD = "device_grad_shard"  # (device params / N,) this device's share after the
    #                                          node's reduce-scatter
    ROPE_COS = "rope_cos"                # (seq, head_dim) RoPE tables, positions 0..seq-1
    ROPE_SIN = "rope_sin"
    ROPE_COS_ROWS = "rope_cos_rows"      # (batch, 1, seq, head_dim) at each token's position
    ROPE_SIN_ROWS = "rope_sin_rows"      #   (document masks: positions restart per document)
    LABELS = "labels"                    # (batch, seq) int64 targets of the step
    DOCS = "docs"                        # (batch, seq) int64 each token's document
    POSITIONS = "positions"              # (batch, seq) int64 each token's position in it
    # host, dynamic
    EMBEDDED = "embedded"                # (micro_batch, seq, hidden) embedding rows of a micro-batch
    REF_EMBEDDED = "ref_embedded"        # (micro_batch, seq, hidden) host rows of the reference embedding (full
    #                                      fine-tuning's DPO), gathered for the reference pass
    ACT_CHECKPOINT = "act_checkpoint"    # (micro_batch, seq, hidden) a boundary kept on the host
    INPUT_GRAD = "input_grad"            # (micro_batch, seq, hidden) gradient of the layer-0 input
    LINK_STAGE = "link_stage"            # (device params,) a DMA link's landing stage for a gradient
    # the peer's (horizon_sim/peer)
    FETCHED_WEIGHTS = "fetched_weights"  # (device params,) a unit's parameters fetched to the device
    #                                      for its uses, released after (ZeRO-3), dynamic
    SAVED_ACTIVATIONS = "saved_activations"  # (bytes,) uint8: what autograd saved in a block's forward
    #                                          for its backward (the persistent graph), dynamic
    GRAD_BUCKET = "grad_bucket"          # (reduce bucket elements,) the contiguous buffer gradients are
    #                                      gathered in before each offload, static
    DEVICE_PARAMS = "device_params"      # (params,) a unit's parameters resident on the device for the
    #                                      whole step (ZeRO-2 offload: only the optimizer is offloaded), static
    HOST_GRAD_ACC = "host_grad_acc"      # (params,) a unit's gradient summed over micro-batches in host memory
    #                                      in the compute dtype, through the device (ZeRO-2 offload), static
    ADAM_TILES = "adam_tiles"            # (2, tile) fp32 DeepSpeedCPUAdam's page-locked tile buffers, static
    #                                      (peer/host_extras.py)
    # adapters (Policy.lora_rank), static: on the device for the whole run, or on the host
    # (Policy.adapters_on 'host'), where each block's stream into a slot beside its weights
    ADAPTERS = "adapters"                # (3, adapter params) fp32 a block's adapters (each target's A then
    #                                      B, in the block's projection order), then AdamW's m and v
    ADAPTER_GRADS = "adapter_grads"      # (adapter params,) fp32 their gradient, summed over the step's
    #                                      micro-batches, zeroed by the update
    ADAPTER_SLOT = "adapter_slot"        # (most adapter params of a block,) fp32 a weight slot's block's adapters
    #                                      on the device (adapters_on 'host'), loaded with its weights
    ADAPTER_GRAD_SLOT = "adapter_grad_slot"  # (most adapter params of a block,) fp32 one backward's adapter
    #                                          gradient on the device, offloaded into ADAPTER_GRADS
    FORK_COPY = "fork_copy"              # (bytes,) uint8 the copy-on-write second copy of a unit's pageable host
    #                                      state in a process that forked workers after allocating it, static
    #                                      (peer/host_extras.py)


DTYPE_BYTES_OF = {"fp32": 4, "bf16": 2, "fp64": 8, "int64": 8, "int16": 2, "uint8": 1}
"""Element sizes of the dtypes a buffer can have."""


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    """For display and JSON only: nothing reads meaning out of it."""
    space: Space
    bytes: int
    static: bool
    """Static buffers exist before and after the step (slots, host store, device constants);
    dynamic ones must be allocated and freed within the step."""
    role: str = ""
    """Its share of the memory breakdowns: master, moments, working_copy, grads, staging,
    act_checkpoints, activations, weights, scalars, constants."""
    holds: Holds | None = None
    """What it holds (Holds)."""
    unit: int | None = None
    """The unit it belongs to: EMBED, a block 0..L-1, the head L (None: not a unit's)."""
    micro: int | None = None
    """The micro-batch it belongs to (None: the whole step's)."""
    layer: int | None = None
    """Activations: the boundary it is, the input of block `layer` (L: of the head)."""
    shape: tuple[int, ...] = ()
    dtype: str = ""
    """One of DTYPE_BYTES_OF."""
    pooled: bool = False
    """A dynamic host buffer the executor takes from its exact-size pool and gives back (the
    pool keeps, per size, the most ever live at once: memory.host_footprint counts that)."""
    dma_only: bool = False
    """Exists only on a link that DMAs into page-locked memory (CUDA); a CPU-driven link needs
    none (LINK_STAGE)."""
    node_shared: bool = False
    """One copy per node, mapped by every local rank (the host store of a data-parallel run);
    a node's host footprint counts it once and every other host buffer once per local rank."""
    part: Part = Part.WHOLE
    """A unit's buffer in a data-parallel run: which part of the unit it holds (partition.py:
    the whole unit, a local rank's slice, or a node's chunks)."""

    def __post_init__(self):
        if not isinstance(self.shape, tuple):  # from JSON
            object.__setattr__(self, "shape", tuple(self.shape))
        if self.holds is not None and not isinstance(self.holds, Holds):
            object.__setattr__(self, "holds", Holds(self.holds))
        if not isinstance(self.part, Part):
            object.__setattr__(self, "part", Part(self.part))

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True)
class Op:
    id: int
    kind: OpKind
    unit: int
    """Unit the op concerns: EMBED (-1), a block 0..L-1, or the head L."""
    micro: int = 0
    slot: int | None = None
    """Weight slot the op writes (LOAD_WEIGHTS) or computes with (compute ops)."""
    deps: tuple[int, ...] = ()
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    frees: tuple[str, ...] = ()
    # ---- work, for the cost model -------------------------------------------------------
    link_bytes: int = 0
    """Bytes crossing the host-device link."""
    flops: float = 0.0
    """FLOPs executed on the device (recompute included, causal attention halved)."""
    hbm_bytes: int = 0
    """Device memory traffic, for the memory-bound floor of compute ops."""
    host_bytes: int = 0
    """Host DRAM bytes touched by CPU work."""
    fault_bytes: int = 0
    """Host bytes the op writes into pages it touches first: a temporary the C library maps
    anew for this copy (the peer's v0.6-v0.7 gradient boundary), faulted in and zeroed by the
    kernel at the host's first_touch_GBps on the copying thread."""
    reduce_bytes: int = 0
    """Bytes whose squared norm the op takes where they lie, on its way out (an offload of a
    unit's last micro-batch that is not accumulated on the host)."""
    params: int = 0
    """Parameters updated (OPTIMIZER)."""
    workspace_bytes: int = 0
    """Device scratch held only while the op runs (intermediates, autograd saved tensors)."""
    prev_step: bool = False
    """Applies the previous step's gradients (pipelined optimizer): skipped on a run's first
    step and run once more after its last."""
    net_bytes: int = 0
    """Collectives (COLLECTIVES): bytes this rank sends over the fabric or the network."""
    peers: int = 0
    """Collectives: the ranks taking part."""
    disk_bytes: int = 0
    """DISK_READ / DISK_WRITE: bytes read from or written to the local disk."""
    copies: int = 1
    """Link ops: the separate copies the op's bytes travel in, each paying the link's latency (a
    peer that copies tensor by tensor; Horizon copies a unit in one)."""
    fixed_us: float = 0.0
    """Host time the op costs beyond its bytes, microseconds (HOOKS: the Python that runs before
    a unit's kernels are issued; GRAD_NORM: a loop over parameter tensors)."""
    pageable: bool = False
    """Link ops: the host side is pageable memory, so the copy runs at the link's pageable rate
    (the driver stages it through a pinned buffer of its own); off, the pinned rate of its
    direction."""

    @property
    def lane(self) -> Lane:
        return LANE_OF[self.kind]

    @property
    def label(self) -> str:
        if self.kind in (OpKind.GRAD_NORM, OpKind.NORM_ALL_REDUCE, OpKind.ADAPTER_UPDATE, OpKind.ADAPTER_ALL_REDUCE,
                         OpKind.ADAPTER_NET_ALL_REDUCE, OpKind.ADAPTER_HOST_UPDATE):
            return self.kind.value
        unit = {EMBED: "emb"}.get(self.unit, str(self.unit))
        mb = f".m{self.micro}" if self.micro else ""
        return f"{self.kind.value}[{unit}{mb}]"


class Family(str, Enum):
    """The schedule families (plan/families.py registers what builds, prices and runs each)."""
    HORIZON = "horizon"              # Horizon's streaming step (schedule/builder.py)
    ZERO3_OFFLOAD = "zero3-offload"  # DeepSpeed ZeRO-3 with parameters and optimizer on the CPU (peer/)
    ZERO2_OFFLOAD = "zero2-offload"  # DeepSpeed ZeRO-2 with the optimizer on the CPU, parameters on the GPU (peer/)


PEERS: tuple[str, ...] = tuple(f.value for f in Family if f is not Family.HORIZON)
"""The families Horizon is compared with (plan/tune/sweep --compare, validate --peer)."""


@dataclass(frozen=True, slots=True)
class ScheduleMeta:
    """What the schedule was built from, so it can be simulated or executed on its own. Typed:
    only the serializer (serialize.py) turns it into JSON values and back."""
    model: ModelSpec
    policy: Policy
    """The Horizon policy the step runs under (a peer family's builder gives the Policy its
    step corresponds to, for what the simulator reads: batch shape, dtypes, clipping)."""
    n_layers: int
    slot_bytes: int
    tokens: int
    model_flops: float
    layout: Layout = ONE
    """The data-parallel layout the Schedule was built for (it is one rank's step; all ranks
    run the same)."""
    purpose: str = "train"
    """'train' (build_schedule: one optimizer step) or 'eval' (build_eval_schedule: the loss
    of a batch, forward only, no update)."""
    family: Family = Family.HORIZON
    """The schedule family that built it."""
