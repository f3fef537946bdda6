"""The data-parallel ops of a Schedule (op.COLLECTIVES and HOST_REDUCE), by the buffers they
name and the partition rule (horizon_sim/schedule/partition.py). Each runs on its lane's thread
with that lane's process groups (context.py), so every group sees its collectives in the
Schedule's order on every rank.

  REDUCE_SCATTER      fabric: the unit's device grads (padded, padding zeroed) summed over the
                      node's devices; this device keeps its local slice
  HOST_REDUCE         cpu: a gradient accumulated on the host (embedding, tied head) summed
                      over the node's ranks; this rank's local slice of it holds the sum; its
                      squared norm is the slice's
  NET_REDUCE_SCATTER  net: the local slice summed over the nodes; this rank's chunk of it holds
                      the sum; its squared norm is the chunk's
  NET_ALL_GATHER      net: every node's updated chunk of this local slice of the working copy
  UPDATE_BARRIER      net: every rank of the node has updated its chunk of the shared store
  ADAPTER_ALL_REDUCE  fabric: the adapters' gradient sums over the node's devices
  ADAPTER_NET_ALL_REDUCE
                      net: those sums over the nodes (the ranks of this local rank), then
                      the loss and aux shares over every rank
  NORM_ALL_REDUCE     net: the squared norms of every rank's share (GRAD_NORM left this rank's
                      sum of squares in the buffer) and the loss parts (and router aux
                      shares), summed: the global gradient norm and the step's loss (then
                      the non-finite rule)

A collective that fails (a peer died, or did not join within the timeout) is an error naming
this rank and the op's peers.
"""
import math

import torch
import torch.distributed as dist

from horizon_sim.schedule.op import Holds, OpKind


# torch 2.13 renamed the tensor collectives (*_single); older torch has only the old names
all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_into = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def reduce_scatter(out: torch.Tensor, full: torch.Tensor, group) -> None:
    """out = this rank's slice (its index in `group`, len(out) elements) of `full` summed over
    `group`. NCCL: its reduce-scatter. gloo: an all-reduce of `full` in place, then the slice:
    gloo's reduce-scatter is 1.3-1.5x slower than its all-reduce here (2 ranks on loopback,
    2-16 MB, bf16 and fp32: e.g. 16 MB fp32 20.6 ms against 13.3 ms), so `full` is
    overwritten with the sum; every caller's `full` is dead after the op or is the op's own
    output. calibrate times this function (measure/calibrate/collectives.py)."""
    if dist.get_backend(group) != "gloo":
        reduce_scatter_into(out, full, group=group)
        return
    dist.all_reduce(full, group=group)
    i, n = dist.get_rank(group), out.numel()
    out.copy_(full[i * n:(i + 1) * n])


def _call(ctx, op, what: str, fn):
    try:
        return fn()
    except Exception as e:  # gloo/NCCL: connection closed, timeout
        raise RuntimeError(f"rank {ctx.rank} (node {ctx.node}, local rank {ctx.local_rank}): {what} with "
                           f"{op.peers} peer rank(s) failed: {type(e).__name__}: {str(e).strip()[:300]}") from e


class Collectives:
    def __init__(self, runner, ctx):
        self.r, self.ctx = runner, ctx

    def table(self) -> dict:
        return {OpKind.REDUCE_SCATTER: self.reduce_scatter, OpKind.HOST_REDUCE: self.host_reduce,
                OpKind.NET_REDUCE_SCATTER: self.net_reduce_scatter, OpKind.NET_ALL_GATHER: self.net_all_gather,
                OpKind.UPDATE_BARRIER: self.update_barrier, OpKind.NORM_ALL_REDUCE: self.norm_all_reduce,
                OpKind.ADAPTER_ALL_REDUCE: self.adapter_all_reduce,
                OpKind.ADAPTER_NET_ALL_REDUCE: self.adapter_net_all_reduce}

    def reduce_scatter(self, op):
        r, ctx = self.r, self.ctx
        full = r.buf.get(r.buf.one(op.reads, Holds.DEVICE_GRAD))
        out = r.buf.out(r.buf.one(op.writes, Holds.DEVICE_GRAD_SHARD))
        full[r.dev_numel(op.unit):].zero_()  # the padding to whole chunks
        _call(ctx, op, "the node's gradient reduce-scatter",  # full: its only reader is this op
              lambda: reduce_scatter(out, full, ctx.groups["fabric"]))

    def host_reduce(self, op):
        r, ctx = self.r, self.ctx
        name = r.buf.one(op.writes, Holds.HOST_GRAD)
        g = r.buf.get(name)
        a, e = r.partition(op.unit).local_range(ctx.local_rank)
        mine = torch.empty(e - a, dtype=g.dtype)
        _call(ctx, op, "the node's host-gradient reduce",
              lambda: reduce_scatter(mine, g, ctx.groups["host"]))
        g[a:e].copy_(mine)
        for sq in r.buf.all(op.writes, Holds.GRAD_SQ):
            r.set_sq_norm(sq, mine)

    def net_reduce_scatter(self, op):
        r, ctx = self.r, self.ctx
        name = r.buf.one(op.writes, Holds.HOST_GRAD)
        b, g = r.buf.declared[name], r.buf.get(name)
        part = r.partition(op.unit)
        a, e = part.local_in(b.part, ctx.local_rank)
        mine = torch.empty(part.chunk, dtype=g.dtype)
        _call(ctx, op, "the nodes' gradient reduce-scatter",
              lambda: reduce_scatter(mine, g[a:e], ctx.groups["cross"]))
        c0, c1 = part.owned_in(b.part, ctx.local_rank, ctx.node)
        g[c0:c1].copy_(mine)
        for sq in r.buf.all(op.writes, Holds.GRAD_SQ):
            r.set_sq_norm(sq, mine)

    def net_all_gather(self, op):
        r, ctx = self.r, self.ctx
        name = r.buf.one(op.writes, Holds.WORKING_COPY)
        wc, part = r.buf.get(name), r.partition(op.unit)
        a, e = part.local_range(ctx.local_rank)
        c0, c1 = part.owned_range(ctx.local_rank, ctx.node)
        mine = wc[c0:c1].clone()  # the gather writes over the slice it is part of
        _call(ctx, op, "the nodes' working-copy all-gather",
              lambda: all_gather_into(wc[a:e], mine, group=ctx.groups["cross"]))

    def update_barrier(self, op):
        ctx = self.ctx
        _call(ctx, op, "the node's update barrier", lambda: dist.barrier(group=ctx.groups["node_net"]))

    def norm_all_reduce(self, op):
        r, ctx = self.r, self.ctx
        out = r.buf.get(op.writes[0])
        aux = r.outputs.aux()  # the router aux loss's share (None without it): summed like the loss
        t = torch.tensor([float(out.item()), r.outputs.loss(), aux or 0.0], dtype=torch.float64)
        _call(ctx, op, "the norm all-reduce", lambda: dist.all_reduce(t, group=ctx.groups["world_net"]))
        total, loss = float(t[0]), float(t[1])
        out.fill_(math.sqrt(total) if total >= 0 else math.nan)
        r.outputs.global_loss = loss
        r.outputs.global_aux = None if aux is None else float(t[2])
        r.inputs.guard.after_grad_norm(loss, total)

    def adapter_all_reduce(self, op):
        """The adapters' gradient sums over the node's devices (every rank then updates the same
        adapters alike); on one node, the step's loss and aux shares over every rank too."""
        self._adapter_sums(op, "fabric", "the adapters' gradient all-reduce")
        if self.ctx.layout.nodes == 1:
            self._loss_all_reduce(op)

    def adapter_net_all_reduce(self, op):
        """The node's adapter gradient sums over the nodes (the ranks of this local rank: each
        holds its node's sum after ADAPTER_ALL_REDUCE), then the loss and aux shares over every rank."""
        self._adapter_sums(op, "cross", "the adapters' gradient all-reduce over the nodes")
        self._loss_all_reduce(op)

    def _adapter_sums(self, op, group: str, what: str) -> None:
        r, ctx = self.r, self.ctx
        for name in op.writes:
            g = r.buf.get(name)
            # sums kept on the host (Policy.adapters_on): the fabric lane's gloo group (NCCL takes device tensors)
            grp = ctx.groups["fabric_host" if group == "fabric" and not g.is_cuda else group]
            _call(ctx, op, what, lambda g=g, grp=grp: dist.all_reduce(g, group=grp))

    def _loss_all_reduce(self, op) -> None:
        r, ctx = self.r, self.ctx
        aux = r.outputs.aux()
        t = torch.tensor([r.outputs.loss(), aux or 0.0], dtype=torch.float64)
        _call(ctx, op, "the loss all-reduce", lambda: dist.all_reduce(t, group=ctx.groups["world_net"]))
        r.outputs.global_loss = float(t[0])
        r.outputs.global_aux = None if aux is None else float(t[1])
