"""The Trainer's weights by transformers name: init, the master read and written whole (views of
the host store, or a split or node-sharded master joined), and the working copy refreshed from
the master after anything writes it. Held by the Trainer (trainer.py, which drives the steps
and forwards its weight methods here); it reads the model, the policy, the data-parallel
context and the Runtime's store, master, runner, units and params (assemble.py)."""
import torch

from horizon_exec.model.layout import host_layout
from horizon_sim.errors import HorizonError
from horizon_exec.runtime.master import viewless_master
from horizon_sim.schedule import Holds


class Weights:
    """A Trainer's weights by transformers name (module docstring); Trainer forwards to it."""

    def __init__(self, model, policy, dist, runtime):
        self.model, self.dist = model, dist
        self.split_master = policy.split_master  # (False with adapters: Policy resolves it so) the master is the working copy's high halves + low halves
        self.viewless = viewless_master(policy)  # no views of whole units: read and written through Master
        self.store, self.master, self.runner = runtime.store, runtime.master, runtime.runner
        self.units, self._params = runtime.units, runtime.params

    @torch.no_grad()
    def init(self, seed: int) -> None:
        """transformers-style init from `seed`: matrices N(0, 0.02), norms 1, biases 0 (the
        same weights whatever the number of ranks: each node's leader draws every unit and
        keeps its node's chunks)."""
        gen = torch.Generator().manual_seed(seed)
        if self.dist.is_leader:
            for u in self.units:
                lay = host_layout(self.model, u)
                in_place = self.master.node_whole and not self.viewless
                whole = self.store.of(self.master.holds, u)[:lay.numel] if in_place else torch.empty(lay.numel)
                for name, t in lay.views(whole).items():
                    if name.endswith("norm.weight"):
                        t.fill_(1.0)
                    elif name.endswith(".bias"):
                        t.zero_()
                    else:
                        t.copy_(torch.randn(t.shape, generator=gen) * self.model.init_std)
                if not in_place:
                    self.master.write_whole(u, whole)
        self.refresh_working_copy()
        self.set_reference()

    def set_reference(self) -> None:
        """Full fine-tuning's DPO: the reference model's weights (REF_WEIGHTS, the compute dtype) <-
        the master as it is now, the run's start (after an init or a load; a resumed run reads its
        checkpoint's). Nothing to do otherwise."""
        if not self.store.has(Holds.REF_WEIGHTS, self.units[0]):
            return
        for u in self.units:  # the node's one copy, whole (its leader writes it)
            n = host_layout(self.model, u).numel
            if not self.master.node_whole:  # several nodes shard the master: every rank takes part in its gather
                whole = self.gather_master(u)
            elif self.dist.is_leader:
                whole = self.master.local_whole(u, n)
            else:
                continue
            if self.dist.is_leader:
                self.store.of(Holds.REF_WEIGHTS, u)[:n].copy_(whole)
        self.dist.barrier()

    def refresh_working_copy(self) -> None:
        """Working copies <- the masters, after anything wrote the masters directly (a loaded
        checkpoint, new weights; data parallel: the node's leader writes the shared
        copy, or with several nodes each rank its chunk and the nodes gather; every rank waits
        until it is done)."""
        d = self.dist
        if d.layout.nodes > 1:
            d.barrier()  # the node's leader has written the master (each rank copies its chunk)
        for u in self.units:
            if not self.store.has(Holds.WORKING_COPY, u):
                continue
            wc = self.store.of(Holds.WORKING_COPY, u)
            if d.layout.nodes == 1:  # (a split master's high halves are its working copy: written with it)
                if d.is_leader and not self.split_master:
                    master = self.store.of(self.master.holds, u)
                    wc[:master.numel()].copy_(master)
                continue
            part = self.runner.partition(u)
            a, e = part.owned_range(d.local_rank, d.node)
            if not self.split_master:
                wc[a:e].copy_(self.master.owned(u))
            la, le = part.local_range(d.local_rank)
            from horizon_exec.dist.collectives import all_gather_into
            all_gather_into(wc[la:le], wc[a:e].clone(), group=d.groups["cross"])
        d.barrier()

    def gather_master(self, u: int) -> torch.Tensor:
        """Unit u's whole fp32 master (a copy) on every rank: a collective of the calling
        thread (every rank calls it); for checks and exports of a several-node run."""
        lay = host_layout(self.model, u)
        d = self.dist
        if self.master.node_whole:  # (no collective: every rank's node holds the unit whole)
            return self.master.local_whole(u, lay.numel)
        from horizon_exec.dist.collectives import all_gather_into
        part = self.runner.partition(u)
        mine = self.master.owned(u).contiguous()
        got = torch.empty(d.world * part.chunk, dtype=torch.float32)
        all_gather_into(got, mine, group=d.groups["main"])
        by_rank = got.view(d.world, part.chunk)  # world rank r = node * N + local rank
        order = [part.chunk_index(r % d.layout.devices_per_node, r // d.layout.devices_per_node) for r in range(d.world)]
        whole = torch.empty(d.world, part.chunk, dtype=torch.float32)
        whole[order] = by_rank
        return whole.reshape(-1)[:lay.numel]

    def unit_master(self, u: int) -> torch.Tensor:
        """Unit u's fp32 master on one node: a view of the store, or a split master joined."""
        return self.gather_master(u) if self.viewless else self.store.of(self.master.holds, u)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Master weights by transformers names: views into the host store (no lm_head.weight
        when tied). Copy them before stepping again if you keep them. Several nodes hold the
        master in shards: gather_master() per unit instead."""
        if not self.master.node_whole:
            raise HorizonError(f"the master is sharded over {self.dist.layout.nodes} nodes: no process holds it whole "
                               "(gather a unit with Trainer.gather_master)")
        if self.viewless:  # no fp32 tensor to view: joined (dequantized) copies, a unit at a time
            out = {}
            for u in self.units:
                out.update(host_layout(self.model, u).views(self.gather_master(u)))
            return out
        return dict(self._params)

    @torch.no_grad()
    def load_state_dict(self, sd: dict) -> None:
        """The master <- sd (every parameter by transformers name), then the working copy."""
        names = [e.name for u in self.units for e in host_layout(self.model, u).entries]
        missing = [n for n in names if n not in sd]
        if missing:
            raise HorizonError(f"state dict lacks {len(missing)} parameter(s), e.g. {missing[0]!r}")
        if not self.master.node_whole:
            raise HorizonError(f"load_state_dict of a run sharded over {self.dist.layout.nodes} nodes is not supported")
        if self.dist.is_leader:  # the node's one copy
            for u in self.units:
                lay = host_layout(self.model, u)
                if self.viewless:
                    whole = torch.empty(lay.numel)
                    for name, t in lay.views(whole).items():
                        t.copy_(sd[name])
                    self.master.write_whole(u, whole)
                else:
                    for name, t in lay.views(self.store.of(self.master.holds, u)[:lay.numel]).items():
                        t.copy_(sd[name])
        self.refresh_working_copy()
        self.set_reference()
