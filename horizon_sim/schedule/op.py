"""Ops, lanes and buffers: the vocabulary of a Schedule.

An op runs on one lane (lanes are FIFO, like CUDA streams), waits for the ops in `deps`,
does the work described by its cost fields, and touches named buffers. Buffer accesses are
the memory effects: a dynamic buffer is allocated when an op that writes it starts and is
released when an op that lists it in `frees` ends; static buffers (weight slots, the host
store) live for the whole run. Dependencies are derived from these accesses by the builder
and re-checked by validation, so a missing dependency is a detectable hazard, not a race.
"""
from dataclasses import dataclass, field
from enum import Enum


class Lane(str, Enum):
    H2D = "h2d"          # host -> device copies
    COMPUTE = "compute"  # device compute
    D2H = "d2h"          # device -> host copies
    CPU = "cpu"          # host CPU work: optimizer, embedding gather/scatter, norms


class OpKind(str, Enum):
    EMBED_FWD = "embed_fwd"                    # cpu: gather embedding rows of the batch
    LOAD_INPUT = "load_input"                  # h2d: embedded tokens -> layer-0 input
    LOAD_WEIGHTS = "load_weights"              # h2d: a unit's working weights -> a slot
    FORWARD = "forward"                        # compute: block forward, no autograd
    SAVE_CKPT = "save_ckpt"                    # d2h: boundary activation -> host
    LOAD_CKPT = "load_ckpt"                    # h2d: boundary activation -> device
    HEAD = "head"                              # compute: final norm, LM head, chunked loss, fwd+bwd
    RECOMPUTE = "recompute"                    # compute: block forward from a checkpoint, no autograd
    BACKWARD = "backward"                      # compute: block forward with grad + autograd.grad
    OFFLOAD_GRADS = "offload_grads"            # d2h: a unit's weight grads -> host grad buffer
    OFFLOAD_INPUT_GRAD = "offload_input_grad"  # d2h: grad of the layer-0 input -> host
    EMBED_BWD = "embed_bwd"                    # cpu: scatter-add into the embedding grad
    GRAD_NORM = "grad_norm"                    # cpu: global grad norm from per-unit partial norms
    OPTIMIZER = "optimizer"                    # cpu: AdamW on one unit (+ working-copy refresh)


LANE_OF: dict[OpKind, Lane] = {
    OpKind.EMBED_FWD: Lane.CPU, OpKind.EMBED_BWD: Lane.CPU, OpKind.GRAD_NORM: Lane.CPU,
    OpKind.OPTIMIZER: Lane.CPU,
    OpKind.LOAD_INPUT: Lane.H2D, OpKind.LOAD_WEIGHTS: Lane.H2D, OpKind.LOAD_CKPT: Lane.H2D,
    OpKind.FORWARD: Lane.COMPUTE, OpKind.HEAD: Lane.COMPUTE, OpKind.RECOMPUTE: Lane.COMPUTE,
    OpKind.BACKWARD: Lane.COMPUTE,
    OpKind.SAVE_CKPT: Lane.D2H, OpKind.OFFLOAD_GRADS: Lane.D2H, OpKind.OFFLOAD_INPUT_GRAD: Lane.D2H,
}

EMBED = -1  # `layer` of the embedding unit; blocks are 0..L-1 and the head is L.


class Space(str, Enum):
    DEVICE = "device"
    HOST = "host"


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    space: Space
    bytes: int
    static: bool
    """Static buffers exist before and after the step (slots, host store); dynamic ones must be
    allocated and freed within the step."""
    role: str = ""
    """What it holds, for the host-footprint breakdown: master, moments, working_copy, grads,
    staging, checkpoints, activations, weights, scalars."""


@dataclass(frozen=True, slots=True)
class Op:
    id: int
    kind: OpKind
    layer: int
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
    params: int = 0
    """Parameters updated (OPTIMIZER)."""
    workspace_bytes: int = 0
    """Device scratch held only while the op runs (intermediates, autograd saved tensors)."""
    prev_step: bool = False
    """Applies the previous step's gradients (pipelined optimizer): skipped on a run's first
    step and run once more after its last."""

    @property
    def lane(self) -> Lane:
        return LANE_OF[self.kind]

    @property
    def label(self) -> str:
        if self.kind == OpKind.GRAD_NORM:
            return self.kind.value
        unit = {EMBED: "emb"}.get(self.layer, str(self.layer))
        mb = f".m{self.micro}" if self.micro else ""
        return f"{self.kind.value}[{unit}{mb}]"


@dataclass(frozen=True, slots=True)
class ScheduleMeta:
    """What the schedule was built from, so it can be simulated or executed on its own."""
    model: dict
    policy: dict
    n_layers: int
    slot_bytes: int
    tokens: int
    model_flops: float
    notes: tuple[str, ...] = field(default=())
