"""The master weights in the host store, whatever their form: an fp32 buffer (the whole unit, or
the node's chunks of it when several nodes shard it), or a split master (policy split_master:
the working copy's bf16 high halves and the int16 low halves, optim/split.py). Whatever reads
or writes the master as fp32 outside the optimizer goes through here: initialisation, state
dicts, checkpoints, HF load and save, the gathers of a data-parallel run.
"""
import torch

from horizon_exec.optim.split import join, split_
from horizon_sim.schedule import Holds
from horizon_sim.schedule.op import Space
from horizon_sim.schedule.partition import Part


def viewless_master(policy) -> bool:
    """The master is not held as views of whole units (a split master: high and low halves; a
    quantized base: packed blocks): it is read and written a unit at a time, through Master."""
    return policy.split_master or policy.quantized_base


class Master:
    def __init__(self, store, sched, runner, dist, split: bool, disk=None, frozen: bool = False, quant=None):
        self.store, self.sched, self.runner, self.dist, self.split = store, sched, runner, dist, split
        # a quantized frozen base (Policy.base_quant; model/quant.QuantUnit): its blocks are packed
        # when written and dequantized (to fp32, a copy) when read
        self.quant = quant
        # a frozen base (adapters) is its own master: the weights in the compute dtype, read and
        # written as fp32 here (cast), never updated by a step
        self.holds = Holds.BASE_WEIGHTS if frozen else Holds.MASTER
        # each node's store holds whole units: on one node, and a frozen base on any number (only
        # a master that is updated is sharded over the nodes; each node streams its own base)
        self.node_whole = dist.layout.nodes == 1 or frozen
        self.disk = disk  # the disk tier's file: the low halves are there under disk_tier='moments+low'

    def _halves(self, u: int):
        """(high halves, low halves) of a split master; low halves on disk are read into a copy
        (write a changed copy back with _put_low)."""
        b = self.sched.find(Holds.MASTER_LOW, u)
        if b.space != Space.DISK:
            return self.store.of(Holds.WORKING_COPY, u), self.store.of(Holds.MASTER_LOW, u)
        lo = torch.empty(b.shape, dtype=torch.int16)
        self.disk.read(b.name, lo)
        return self.store.of(Holds.WORKING_COPY, u), lo

    def _put_low(self, u: int, lo: torch.Tensor) -> None:
        """Low halves changed through _halves' copy -> the file (nothing to do in RAM)."""
        b = self.sched.find(Holds.MASTER_LOW, u)
        if b.space == Space.DISK:
            self.disk.write(b.name, lo)

    def _node_chunks(self, u: int):
        """(range in the whole unit, range in the node's buffers) of each of the node's ranks' chunks."""
        part, j = self.runner.partition(u), self.dist.node
        return [(part.owned_range(i, j), part.owned_in(Part.NODE, i, j))
                for i in range(self.dist.layout.devices_per_node)]

    def write_whole(self, u: int, whole: torch.Tensor, packed: dict | None = None) -> None:
        """A whole unit's fp32 master -> the node's store (node leader only): its chunks of the
        master on several nodes; a split master's high halves (the whole working copy: every
        node streams the whole unit) and its low halves."""
        n, whole = whole.numel(), whole.contiguous()
        if self._quantized(u):  # packed: {block-relative name: nf4 regions} taken as they are
            self.quant.of(u).pack_(self.store.of(Holds.QUANT_BASE, u), whole, given=packed)
            return
        if not self.split:
            dst = self.store.of(self.holds, u)
            if self.node_whole:
                dst[:n].copy_(whole)
            else:
                self._keep_node_chunks(u, whole, dst)
            return
        hi, lo = self._halves(u)
        if self.node_whole:  # the node's store is the whole unit
            split_(whole, hi[:n], lo[:n])
            self._put_low(u, lo)
            return
        low = torch.empty(n, dtype=lo.dtype)
        split_(whole, hi[:n], low)
        self._keep_node_chunks(u, low, lo)

    def _quantized(self, u: int) -> bool:
        return self.quant is not None and self.store.has(Holds.QUANT_BASE, u)

    def _dequantized(self, u: int) -> torch.Tensor:
        """A quantized block as fp32 (a copy)."""
        unit = self.quant.of(u)
        out = torch.empty(sum(t.numel for t in unit.layout))
        unit.unpack_(out, self.store.of(Holds.QUANT_BASE, u))
        return out

    def _keep_node_chunks(self, u: int, whole: torch.Tensor, dst: torch.Tensor) -> None:
        """The node's chunks of a whole unit's buffer -> dst, the node's buffer of them."""
        padded = torch.zeros(self.runner.partition(u).padded, dtype=whole.dtype)
        padded[:whole.numel()] = whole
        for (a, e), (m0, m1) in self._node_chunks(u):
            dst[m0:m1].copy_(padded[a:e])

    def node(self, u: int) -> torch.Tensor:
        """Unit u's fp32 master as the node's store holds it (the node's chunks when data
        parallel: what a checkpoint saves): a view, or a split master joined or a quantized block
        dequantized (a copy)."""
        if self._quantized(u):
            return self._dequantized(u)
        if not self.split:
            return self.store.of(self.holds, u)
        hi, lo = self._halves(u)
        if self.node_whole:  # the node holds the whole unit, in the order of the copy
            return join(hi, lo)
        out = torch.empty(lo.numel())
        for (a, e), (m0, m1) in self._node_chunks(u):
            join(hi[a:e], lo[m0:m1], out[m0:m1])
        return out

    def set_node(self, u: int, t: torch.Tensor) -> None:
        """node(u) <- t (node leader; the working copy's other nodes' chunks are gathered by
        the trainer's working-copy refresh)."""
        if self._quantized(u):
            return self.write_whole(u, t)
        if not self.split:
            self.store.of(self.holds, u).copy_(t)
            return
        hi, lo = self._halves(u)
        if self.node_whole:
            split_(t, hi, lo)
            self._put_low(u, lo)
            return
        for (a, e), (m0, m1) in self._node_chunks(u):
            split_(t[m0:m1], hi[a:e], lo[m0:m1])

    def owned(self, u: int) -> torch.Tensor:
        """This rank's chunk of unit u's fp32 master (a split master's: joined, a copy)."""
        if not self.split:
            return self.runner.owned(self.sched.find(self.holds, u).name)
        if self.sched.find(Holds.MASTER_LOW, u).space == Space.DISK:  # one device: the whole unit
            return join(*self._halves(u))
        hi = self.runner.owned(self.sched.find(Holds.WORKING_COPY, u).name).contiguous()
        return join(hi, self.runner.owned(self.sched.find(Holds.MASTER_LOW, u).name).contiguous())

    def local_whole(self, u: int, numel: int) -> torch.Tensor:
        """One node's whole unit as fp32 (a copy), its first `numel` elements (the padding off)."""
        if self._quantized(u):
            return self._dequantized(u)[:numel]
        if self.split:
            hi, lo = self._halves(u)
            return join(hi[:numel], lo[:numel])
        return self.store.of(self.holds, u)[:numel].clone()
