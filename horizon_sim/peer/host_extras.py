"""Host memory a DeepSpeed offload process holds beyond its model states (master, moments,
gradient, parameter copies), as static host buffers of the peer's Schedule. Each is a
Zero3Policy knob, off by default (DeepSpeed 0.19.8 with a script that forks no workers has
neither); the ZeRO-Offload tutorial's run of 2020 had both (docs/published.md):

  adam tiles   DeepSpeedCPUAdam's two page-locked tile buffers, adam_tile_params fp32 elements
               each, allocated when the optimizer is built and held for the run (role
               'staging': they are the page-locked stage of its tiled copy to the device)
  fork copies  with fork_copies, per unit a second copy of the host buffers the step writes
               that are pageable (role 'fork_copies'): the copy-on-write pages a trainer that
               forked its data-loader workers after allocating them gets on its first write,
               while the workers keep the originals. Page-locked buffers are not copied: the
               NVIDIA driver maps them VM_SHARED 'to avoid any undesired copy-on-write effects'
               (open-gpu-kernel-modules kernel-open/nvidia/nv-mmap.c, nvidia_mmap_helper)
"""
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.schedule.op import Holds, Space

ALWAYS_PAGEABLE = (Holds.MASTER, Holds.MOMENTS)
"""DeepSpeedCPUAdam's moments are `torch.zeros_like` of the master (pageable in every version);
the fp32 master is pageable under ZeRO-3 and under ZeRO-2 before 0.14.1 (Zero3Policy.fork_copies)."""

PINNED_WITH_PIN_MEMORY = (Holds.HOST_GRAD, Holds.WORKING_COPY, Holds.HOST_GRAD_ACC)
"""Host buffers the step writes that DeepSpeed page-locks under pin_memory: the fp32 gradient,
the compute-dtype partition or cast buffer, the accumulation buffer (pageable with it off)."""


def pageable_bytes(bufs, zero3: Zero3Policy, unit: int) -> int:
    """Bytes of unit's static host buffers that the step writes and that live in pageable memory."""
    kinds = ALWAYS_PAGEABLE + (() if zero3.pin_memory else PINNED_WITH_PIN_MEMORY)
    return sum(b.bytes for b in bufs.buffers.values()
               if b.static and b.space == Space.HOST and b.unit == unit and b.holds in kinds)


def declare_host_extras(bufs, zero3: Zero3Policy, units) -> None:
    """The knobs' buffers, once every unit's host store is declared (module docstring)."""
    if zero3.adam_tile_params:
        bufs.declare("adam_tiles", Space.HOST, Holds.ADAM_TILES, (2, zero3.adam_tile_params), "fp32", True,
                     "staging")
    if not zero3.fork_copies:
        return
    for u in units:
        n = pageable_bytes(bufs, zero3, u)
        if n:
            bufs.declare(f"fork_copy.{bufs.unit_label(u)}", Space.HOST, Holds.FORK_COPY, (n,), "uint8", True,
                         "fork_copies", unit=u)
