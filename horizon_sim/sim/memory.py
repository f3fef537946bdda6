"""Device memory over time and the host footprint, from a timeline and the ops' effects.

Device peak = static buffers (weight slots) + the highest sum of live dynamic buffers and
workspaces. Host total = static store (master, moments, working copy, pipelined grads) +
what the executor's exact-size pool of dynamic host buffers holds (grads in other modes,
checkpoints, staging: per size, the most live at once; host_footprint) + the process
runtime. At equal times, releases are applied before allocations (an op that waits for
another starts no earlier than it ended). A compute op's workspace is charged from
WORKSPACE_ONSET of the way into the op, not from its start (its temporaries build up; see
schedule/work.py), so a gradient that is still being offloaded when the next op starts is not
counted on top of that op's peak."""
from dataclasses import dataclass

import pandas as pd

from horizon_sim.schedule.effects import op_effects
from horizon_sim.schedule.op import Lane, Space
from horizon_sim.schedule.work import WORKSPACE_ONSET

HOST_ROLES = ("master", "moments", "working_copy", "base", "grads", "staging", "act_checkpoints", "scalars", "disk_stages")
PER_STEP_ROLES = ("grads", "act_checkpoints")
"""Dynamic host buffers that exist only within a step: a step's gradients (modes other than
`pipelined`, whose gradients are static: they cross the step boundary) and its host checkpoints.
Staging buffers are page-locked, which is too slow to redo every step: every CUDA trainer keeps
them."""


@dataclass(frozen=True, slots=True)
class HostFootprint:
    by_role: dict
    """Bytes per role: static buffers, what the pool of dynamic host buffers holds (see
    host_footprint), plus 'runtime' (process overhead)."""
    total_bytes: int
    between_steps_bytes: int
    """The footprint less the per-step dynamic buffers (PER_STEP_ROLES): what stays resident
    between steps in a trainer that gives those back to the OS at the step's end, as a PyTorch
    loop does whose optimizer.zero_grad() sets gradients to None (glibc unmaps large blocks on
    free). Horizon's executor keeps them in its pool, so its resident size is total_bytes; a
    published RSS sampled after such a step is this."""

    def bytes_per_param(self, params: int) -> dict:
        return {k: v / params for k, v in self.by_role.items()}


def _device_events(sched, timeline: pd.DataFrame, staging: bool, effects):
    """(time, order, delta, role) of every device allocation and release. A compute op's
    workspace is taken WORKSPACE_ONSET of the way into the op (its temporaries build up: the
    template's peak comes after a block's forward-with-grad or at its MLP), a copy's staging
    workspace at its start; staging=False drops the copies' staging (a CPU-driven link casts
    while it copies and stages nothing on the device)."""
    start = dict(zip(timeline.op_id, timeline.start_s))
    end = dict(zip(timeline.op_id, timeline.end_s))
    ev = []  # (time, order: 0 = release first, delta, role)
    for op in sched.ops:
        if op.id not in start:
            continue
        e = effects[op.id]
        for (sp, role), n in e.alloc.items():
            if sp != Space.DEVICE:
                continue
            if role == "workspace" and op.lane != Lane.COMPUTE and not staging:
                continue
            t = start[op.id]
            if role == "workspace" and op.lane == Lane.COMPUTE:
                t += WORKSPACE_ONSET * (end[op.id] - start[op.id])
            ev.append((t, 1, n, role))
        for (sp, role), n in e.free.items():
            if sp == Space.DEVICE and not (role == "workspace" and op.lane != Lane.COMPUTE and not staging):
                ev.append((end[op.id], 0, -n, role))
    ev.sort(key=lambda x: (x[0], x[1]))
    return ev


def device_trace(sched, timeline: pd.DataFrame, staging: bool = True, effects=None,
                 runtime_bytes: int = 0) -> pd.DataFrame:
    """Device bytes in use over the step: columns time_s, bytes (staging: see _device_events;
    effects: op_effects(sched), when the caller has them already; runtime_bytes: held for the
    whole step outside the Schedule's buffers, the math libraries' workspaces)."""
    base = sched.static_bytes(Space.DEVICE) + runtime_bytes
    rows, cur = [(0.0, base)], base
    effects = op_effects(sched) if effects is None else effects
    for time_s, _, delta, _ in _device_events(sched, timeline, staging, effects):
        cur += delta
        rows.append((time_s, cur))
    return pd.DataFrame(rows, columns=["time_s", "bytes"])


def _host_buffer_events(sched, timeline: pd.DataFrame, effects, dma: bool = True):
    """(time, order: 0 = release first, nbytes, +1 or -1, role) of every dynamic host buffer:
    taken when the first op that writes it starts, given back when the op that frees it ends."""
    start = dict(zip(timeline.op_id, timeline.start_s))
    end = dict(zip(timeline.op_id, timeline.end_s))
    ev = []
    for op, e in zip(sched.ops, effects):
        if op.id not in start:
            continue
        for t, order, delta, names in ((start[op.id], 1, 1, e.taken), (end[op.id], 0, -1, e.given)):
            for b in (sched.buffers[n] for n in names):
                if b.space == Space.HOST and (dma or not b.dma_only):
                    ev.append((t, order, b.bytes, delta, b.role))
    ev.sort(key=lambda x: (x[0], x[1]))
    return ev


def host_footprint(sched, timeline: pd.DataFrame, runtime_bytes: int, dma: bool = True,
                   effects=None) -> HostFootprint:
    """Static host buffers + what the executor's pool of dynamic host buffers holds + runtime.

    The executor keeps a freed dynamic host buffer's memory for the next buffer of exactly its
    size (horizon_exec/device/host_pool.py: page-locking is too slow to redo every step, and glibc
    would otherwise unmap and fault it in again), so it holds, per size, the most buffers of
    that size ever live at once. That is more than the highest sum of live buffers when
    sizes peak at different times: host checkpoints in the forward, per-step gradients in the
    backward of the `after` and `backward` modes. Each size's bytes go to the roles of the
    buffers live at its peak. dma: the link DMAs into page-locked memory (CUDA), so the
    gradient landing stages (Buffer.dma_only) exist; a CPU-driven link has none. effects:
    op_effects(sched), when the caller has them already.

    Data parallel: the footprint is the node's. A Schedule is one rank's step; the node runs
    devices_per_node such ranks, each a process with its own buffers, pool and runtime, and
    maps one copy of the node-shared buffers (the host store)."""
    n = sched.meta.layout.devices_per_node
    by_role = {r: 0 for r in HOST_ROLES}
    for b in sched.buffers.values():
        if b.static and b.space == Space.HOST:
            by_role[b.role] = by_role.get(b.role, 0) + b.bytes * (1 if b.node_shared else n)
    live: dict[int, dict[str, int]] = {}  # nbytes -> role -> buffers live
    held: dict[int, dict[str, int]] = {}  # nbytes -> role -> buffers live at that size's peak
    effects = op_effects(sched) if effects is None else effects
    for _, _, nbytes, delta, role in _host_buffer_events(sched, timeline, effects, dma):
        roles = live.setdefault(nbytes, {})
        roles[role] = roles.get(role, 0) + delta
        if sum(roles.values()) > sum(held.get(nbytes, {}).values()):
            held[nbytes] = dict(roles)
    per_step = 0
    for nbytes, roles in held.items():
        for role, k in roles.items():
            by_role[role] = by_role.get(role, 0) + k * nbytes * n
            per_step += k * nbytes * n if role in PER_STEP_ROLES else 0
    by_role["runtime"] = int(runtime_bytes) * n
    total = int(sum(by_role.values()))
    return HostFootprint(by_role=by_role, total_bytes=total, between_steps_bytes=total - per_step)
