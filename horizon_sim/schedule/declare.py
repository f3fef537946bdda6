"""The buffers of one step, declared with their typed fields (op.Buffer): what each holds,
its unit, micro-batch or boundary, shape and dtype. Names are made here, for display and
JSON; nothing reads meaning out of them. Each `declare` method returns the name ops list."""
from horizon_sim.errors import HorizonError
from horizon_sim.schedule.op import DTYPE_BYTES_OF, EMBED, Buffer, Holds, Space
from horizon_sim.schedule.partition import Part, Partition
from horizon_sim.specs.layout import ONE, Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.specs.quant import unit_bytes


def shard(n: int, k: int) -> int:
    """One of k equal shares of n elements (the last rank's may hold padding)."""
    return -(-n // k)


class Declarations:
    def __init__(self, model: ModelSpec, policy: Policy, layout: Layout = ONE):
        self.m, self.p = model, policy
        self.layout = layout
        self.shared = layout.ranks > 1  # the host store is the node's, mapped by each rank
        self.head = model.n_layers
        self.buffers: dict[str, Buffer] = {}
        self.grads_static = policy.optimizer == "pipelined"  # they cross the step boundary
        # The layer order sums a unit's gradients over the micro-batches on the device and
        # offloads the sum once (device_grad(u, None)); one micro-batch has nothing to sum.
        self.grads_summed_on_device = policy.mb_order == "layer" and policy.micro_batches > 1
        # Host grads that the host adds micro-batches into are fp32; the others stay as they
        # cross the link: one micro-batch, or the layer order, which writes a unit's sum once
        # (its values are grad_dtype's already: nothing is lost, 2 bytes a parameter saved).
        self.host_grad_dtype = "fp32" if policy.micro_batches > 1 and not self.grads_summed_on_device \
            else policy.grad_dtype
        a = DTYPE_BYTES_OF[policy.compute_dtype]
        # Several nodes hold the master in shards: every node keeps a whole copy to stream
        # from (in fp32 compute too, where a single node would load the master itself).
        self.has_copy = policy.working_copy or layout.nodes > 1
        # Adapters on a frozen base: the host keeps the base in the compute dtype only, which is
        # what the loads stream (as a working copy); the adapters and their state are the device's.
        self.adapters = policy.adapters
        if self.adapters:
            self.has_copy = True
        # full fine-tuning's DPO keeps its reference model's weights on the host (adapters: the base is it)
        # (several nodes: each holds the reference whole, as it holds the working copy)
        self.own_reference = policy.objective == "dpo" and not policy.adapters
        self.on_disk = policy.disk_tier != "none"
        self.low_on_disk = policy.disk_tier == "moments+low"
        if self.on_disk and self.shared:
            raise HorizonError(f"policy disk_tier={policy.disk_tier!r} runs on one device for now, not "
                               f"{layout.devices_per_node} x {layout.nodes}: drop --disk-tier, or run one device (planner: "
                               "--gpus/--nodes; train: --nproc-per-node/--nnodes)")
        self.slot_bytes = max(model.max_layer_params, model.head_device_params) * a  # a slot holds any block

    # ---- sizes ---------------------------------------------------------------------------------
    def host_params(self, u: int) -> int:
        """Parameters unit `u` keeps on the host (a tied head: its norm; the matrix is the embedding's)."""
        m = self.m
        return m.embedding_params if u == EMBED else m.head_params if u == self.head else m.block_spec(u).layer_params

    def dev_params(self, u: int) -> int:
        """Parameters unit `u` needs on the device (the head: its LM head matrix even when tied)."""
        return self.m.head_device_params if u == self.head else self.m.block_spec(u).layer_params

    def host_reduced(self, u: int) -> bool:
        """Units whose gradient is accumulated on the host from more than one source (the
        embedding's scatter-add, a tied head's matrix): with several devices per node each rank
        keeps the whole of it and the node's ranks sum it in shared memory (HOST_REDUCE); the
        others are reduce-scattered on the devices first (REDUCE_SCATTER)."""
        return u == EMBED or (u == self.head and self.m.tied_embeddings)

    def partition(self, u: int) -> Partition:
        """How unit u's host parameters are split over the ranks (partition.py)."""
        return Partition(self.host_params(u), self.layout)

    def grad_part(self, u: int) -> Part:
        """What of unit u's gradient this rank holds on the host (before the nodes' reduce):
        the whole (accumulated on the host, then summed over the node's ranks), else its
        local slice (the devices' reduce-scatter left it that)."""
        return Part.WHOLE if self.host_reduced(u) or self.layout.devices_per_node == 1 else Part.LOCAL

    def rank_grad_params(self, u: int) -> int:
        """Elements of unit u's gradient this rank holds on the host (before the nodes' reduce)."""
        return self.partition(u).numel(self.grad_part(u))

    def owned_params(self, u: int) -> int:
        """Elements of unit u this rank updates: 1/N of the node's 1/M."""
        return self.partition(u).chunk

    def unit_label(self, u: int) -> str:
        return {EMBED: "emb", self.head: "head"}.get(u, str(u))

    # ---- declaring ---------------------------------------------------------------------------------
    def declare(self, name, space, holds, shape, dtype, static=False, role="", *, unit=None, micro=None,
                layer=None, dma_only=False, node_shared=False, part=Part.WHOLE) -> str:
        """Declare a buffer once and return its name."""
        if name not in self.buffers:
            shape = tuple(int(d) for d in shape)
            n = 1
            for d in shape:
                n *= d
            pooled = space == Space.HOST and not static  # the executor's exact-size host pool
            self.buffers[name] = Buffer(name, space, n * DTYPE_BYTES_OF[dtype], static, role, holds, unit, micro,
                                        layer, shape, dtype, pooled, dma_only, node_shared, part)
        return name

    def _rows(self):  # (micro_batch, seq, hidden): an activation-sized buffer
        return (self.p.micro_batch, self.p.seq, self.m.hidden)

    def activation(self, m: int, layer: int) -> str:
        """The boundary activation entering block `layer` (layer L: entering the head)."""
        return self.declare(f"x.m{m}.{layer}", Space.DEVICE, Holds.ACTIVATION, self._rows(), self.p.compute_dtype,
                            role="activations", micro=m, layer=layer)

    def saved_activations(self, m: int, layer: int, nbytes: int) -> str:
        """What a kept layer's forward saved for its backward (its autograd graph), `nbytes`
        (kept_work.kept_saved_bytes), from its FORWARD to its BACKWARD_SAVED."""
        return self.declare(f"saved.m{m}.{layer}", Space.DEVICE, Holds.SAVED_ACTIVATIONS, (nbytes,), "uint8",
                            role="activations", micro=m, layer=layer)

    def ref_activation(self, m: int, layer: int) -> str:
        """The reference pass's boundary entering block `layer` (DPO; layer 0 is the step's own input)."""
        return self.declare(f"xr.m{m}.{layer}", Space.DEVICE, Holds.REF_ACTIVATION, self._rows(), self.p.compute_dtype,
                            role="activations", micro=m, layer=layer)

    def ref_logps(self) -> str:
        """Each row's completion log-probability under the reference (DPO), for the whole step."""
        return self.declare("ref_logps", Space.DEVICE, Holds.REF_LOGPS, (self.p.batch,), "fp32", True, "constants")

    def activation_grad(self, m: int, layer: int) -> str:
        return self.declare(f"dx.m{m}.{layer}", Space.DEVICE, Holds.ACTIVATION_GRAD, self._rows(),
                            self.p.compute_dtype, role="activations", micro=m, layer=layer)

    def host_rows(self, name: str, holds: Holds, m: int, role: str, layer: int | None = None) -> str:
        """An activation-sized host buffer: embedded rows, a kept boundary, the input's grad."""
        return self.declare(name, Space.HOST, holds, self._rows(), self.p.compute_dtype, role=role, micro=m,
                            layer=layer)

    def weight_slot(self, s: int) -> str:
        a = DTYPE_BYTES_OF[self.p.compute_dtype]
        return self.declare(f"w{s}", Space.DEVICE, Holds.WEIGHT_SLOT, (self.slot_bytes // a,), self.p.compute_dtype,
                            True, "weights", layer=s)

    def device_grad(self, u: int, m: int | None) -> str:
        """A unit's device grads of micro-batch m, in the compute dtype; m None: summed over
        the step's micro-batches (the layer order), in fp32 like the host's sum in the micro
        order. Padded to whole chunks when the node's devices reduce-scatter them."""
        n = self.partition(u).padded if self.layout.devices_per_node > 1 and not self.host_reduced(u) else self.dev_params(u)
        return self.declare(f"dgrad.{self.unit_label(u)}.{self._micro_label(m)}", Space.DEVICE, Holds.DEVICE_GRAD,
                            (n,), self._dgrad_dtype(m), role="grads", unit=u, micro=m)

    def device_grad_shard(self, u: int, m: int | None) -> str:
        """This device's slice of a unit's weight grads (device_grad(u, m)) after the node's reduce-scatter."""
        return self.declare(f"dgrad.{self.unit_label(u)}.{self._micro_label(m)}.shard", Space.DEVICE,
                            Holds.DEVICE_GRAD_SHARD, (self.partition(u).numel(Part.LOCAL),), self._dgrad_dtype(m),
                            role="grads", unit=u, micro=m, part=Part.LOCAL)

    @staticmethod
    def _micro_label(m: int | None) -> str:
        return "sum" if m is None else f"m{m}"

    def _dgrad_dtype(self, m: int | None) -> str:
        return self.p.compute_dtype if m is not None else "fp32"

    def host_grad(self, u: int) -> str:
        # A tied embedding's grad sums the LM head's and the scatter-add's, and the embedding's
        # scatter-add runs per micro-batch on the host in either order: keep those in fp32.
        summed_on_host = u == EMBED and (self.m.tied_embeddings or self.p.micro_batches > 1)
        dtype = "fp32" if summed_on_host else self.host_grad_dtype
        return self.declare(f"hgrad.{self.unit_label(u)}", Space.HOST, Holds.HOST_GRAD, (self.rank_grad_params(u),),
                            dtype, static=self.grads_static, role="grads", unit=u, part=self.grad_part(u))

    def host_store(self, u: int) -> list[str]:
        """A unit's static host buffers: master (a split master: its low halves), moments, and the
        working copy when there is one (a split master: its high halves); adapters: the frozen
        base's weights alone."""
        n, part, p, sh = self.unit_label(u), self.partition(u), self.p, self.shared
        if self.adapters:  # (data parallel: one copy per node, mapped by its ranks)
            if self.quantized(u):
                return [self.declare(f"qbase.{n}", Space.HOST, Holds.QUANT_BASE, (self.quant_bytes(u),), "uint8", True,
                                     "base", unit=u, node_shared=sh)]
            return [self.declare(f"base.{n}", Space.HOST, Holds.BASE_WEIGHTS, (part.padded,), p.compute_dtype, True,
                                 "base", unit=u, node_shared=sh)]
        # Several ranks: the node holds its ranks' chunks of the master and moments (each rank
        # updates its own), and the whole working copy every device streams from.
        store = Part.NODE if sh else Part.WHOLE
        node = part.numel(store)
        low_space = Space.DISK if self.low_on_disk else Space.HOST
        master = (self.declare(f"master_lo.{n}", low_space, Holds.MASTER_LOW, (node,), "int16", True, "master",
                               unit=u, node_shared=sh, part=store) if p.split_master else
                  self.declare(f"master.{n}", Space.HOST, Holds.MASTER, (node,), p.master_dtype, True, "master",
                               unit=u, node_shared=sh, part=store))
        names = [master,
                 self.declare(f"moments.{n}", Space.DISK if self.on_disk else Space.HOST, Holds.MOMENTS, (2, node),
                              p.states_dtype, True, "moments", unit=u, node_shared=sh, part=store)]
        if self.has_copy:
            names.append(self.declare(f"wc.{n}", Space.HOST, Holds.WORKING_COPY, (part.padded,), p.compute_dtype,
                                      True, "working_copy", unit=u, node_shared=sh))
        if self.own_reference:  # DPO's reference model: the weights as the run started
            names.append(self.declare(f"ref.{n}", Space.HOST, Holds.REF_WEIGHTS, (part.padded,), p.compute_dtype,
                                      True, "reference", unit=u, node_shared=sh))
        return names

    def disk_stages(self, u: int) -> list[tuple[str, str]]:
        """The disk tier: (disk buffer, its RAM stage from the unit's DISK_READ to its DISK_WRITE)
        for the unit's moments, and its master's low halves when they are on disk too."""
        store, label = self.host_store(u), self.unit_label(u)
        out = [(store[1], self.declare(f"moments_stage.{label}", Space.HOST, Holds.MOMENTS_STAGE,
                                       self.buffers[store[1]].shape, self.p.states_dtype, role="disk_stages",
                                       unit=u))]
        if self.low_on_disk:
            out.append((store[0], self.declare(f"master_lo_stage.{label}", Space.HOST, Holds.MASTER_LOW_STAGE,
                                               self.buffers[store[0]].shape, "int16", role="disk_stages", unit=u)))
        return out

    def ref_weights_of(self, u: int) -> str:
        """Unit u's reference weights (full fine-tuning's DPO)."""
        return self.host_store(u)[-1]

    def quantized(self, u: int) -> bool:
        """Unit u's base is stored quantized (Policy.base_quant: the blocks, not the embedding or the head)."""
        return self.p.quantized_base and 0 <= u < self.head

    def quant_bytes(self, u: int) -> int:
        """Quantized block u's host buffer, in bytes (specs/quant.py; its shape's)."""
        return unit_bytes(self.m.block_spec(u), self.p.base_quant, self.p.compute_dtype)

    def weights_of(self, u: int) -> str:
        """What a unit's weights load from: its working copy, else its master (adapters: the base)."""
        return self.host_store(u)[0 if self.adapters else 2 if self.has_copy else 0]

    def adapter_params(self, u: int) -> int:
        """Adapter parameters of unit u (blocks only: the embedding and the head are frozen)."""
        from horizon_sim.schedule.work import adapter_params, layer_policy
        return adapter_params(self.m.block_spec(u), layer_policy(self.m, self.p, u)) if 0 <= u < self.head else 0

    @property
    def adapters_space(self) -> Space:
        """Where the adapters, their moments and gradient sums live (Policy.adapters_on)."""
        return Space.HOST if self.p.adapters_on == "host" else Space.DEVICE

    def adapters_of(self, u: int) -> str:
        """A block's adapters and their AdamW moments (fp32), for the whole run (device or host)."""
        return self.declare(f"lora.{u}", self.adapters_space, Holds.ADAPTERS, (3, self.adapter_params(u)), "fp32", True,
                            "adapters", unit=u)

    def adapter_grads(self, u: int) -> str:
        """A block's adapter gradient (fp32), summed over the step's micro-batches (device or host)."""
        return self.declare(f"lora_grad.{u}", self.adapters_space, Holds.ADAPTER_GRADS, (self.adapter_params(u),),
                            "fp32", True, "adapters", unit=u)

    @property
    def max_adapter_params(self) -> int:
        """The most adapter parameters of any block: what a device slot for them holds."""
        return max((self.adapter_params(u) for u in range(self.m.n_layers)), default=0)

    def adapter_slot(self, s: int) -> str:
        """Adapters on the host: weight slot s's block's adapters (A and B, fp32) on the device."""
        return self.declare(f"lora_slot{s}", Space.DEVICE, Holds.ADAPTER_SLOT, (self.max_adapter_params,), "fp32",
                            True, "adapters", layer=s)

    def adapter_grad_slot(self, s: int) -> str:
        """Adapters on the host: one backward's adapter gradient (fp32) of slot s's block on the
        device, until it is offloaded."""
        return self.declare(f"lora_gslot{s}", Space.DEVICE, Holds.ADAPTER_GRAD_SLOT, (self.max_adapter_params,), "fp32",
                            True, "adapters", layer=s)

    def grad_sq(self, u: int) -> str:
        return self.declare(f"gsq.{self.unit_label(u)}", Space.HOST, Holds.GRAD_SQ, (1,), "fp64", True, "scalars",
                            unit=u)

    def grad_norm_scalar(self) -> str:
        return self.declare("gnorm", Space.HOST, Holds.GRAD_NORM, (1,), "fp64", True, "scalars")

    def link_stage(self, target: str) -> str:
        """Where a DMA link lands a gradient piece that the host then adds or widens into
        `target` (the host cannot read bytes still in flight): page-locked, one per size in
        the executor's pool (horizon_exec/device/cuda.py _through_stage)."""
        t = self.buffers[target]
        return self.declare(f"stage.{target}", Space.HOST, Holds.LINK_STAGE, t.shape, self.p.grad_dtype,
                            role="staging", unit=t.unit, dma_only=True)

    def device_constants(self) -> None:
        """Device tensors every step uses: RoPE tables, the step's labels and, under document
        masks, each token's document and position and the tables gathered at those."""
        p, m, c = self.p, self.m, dict(static=True, role="constants")
        k = (m.rope_table_count,) if m.rope_table_count > 1 else ()  # a table per RoPE base (Gemma 3)
        self.declare("rope.cos", Space.DEVICE, Holds.ROPE_COS, (*k, p.seq, m.rope_width), p.compute_dtype, **c)
        self.declare("rope.sin", Space.DEVICE, Holds.ROPE_SIN, (*k, p.seq, m.rope_width), p.compute_dtype, **c)
        self.declare("labels", Space.DEVICE, Holds.LABELS, (p.batch, p.seq), "int64", **c)
        if p.doc_masks:
            self.declare("docs", Space.DEVICE, Holds.DOCS, (p.batch, p.seq), "int64", **c)
            self.declare("positions", Space.DEVICE, Holds.POSITIONS, (p.batch, p.seq), "int64", **c)
            rows = (*k, p.batch, 1, p.seq, m.rope_width)
            self.declare("rope.cos.rows", Space.DEVICE, Holds.ROPE_COS_ROWS, rows, p.compute_dtype, **c)
            self.declare("rope.sin.rows", Space.DEVICE, Holds.ROPE_SIN_ROWS, rows, p.compute_dtype, **c)
