"""build_schedule(model, policy): the one function that turns a model and a policy into the
ops of one training step. It reads as the step's phases:

  forward   per micro-batch: the embedding rows gathered on the host and loaded, then per
            block [its weights loaded] forward (no autograd); every K-th boundary is kept
            (on the device, or saved to the host)
  head      final norm + LM head + chunked loss, forward and backward in one op, its
            gradients offloaded
  backward  blocks in reverse: [the block's checkpoint reloaded] its inner boundaries
            recomputed, then its layers in reverse: [weights loaded] backward (forward with
            grad + autograd.grad), gradients offloaded; the layer-0 input's gradient goes to
            the host
  embedding its gradient scattered on the host
  end       the global gradient norm
Kept layers (Policy.keep_last: the last ones of the forward) run their forward with grad and
keep its graph on the device (SAVED_ACTIVATIONS, from the FORWARD to the backward); their
backward is BACKWARD_SAVED (no recompute, no checkpoint), first in the backward; the K-blocks
cover the layers before them (sequence.py).
and the optimizer wherever its mode puts it (place_optimizer, the one place that decides).
The policy's mb_order says how the micro-batches interleave (sequence.py): 'micro' runs the
phases per micro-batch; 'layer' runs each unit for every micro-batch while its weights are
resident, and sums a unit's device gradients over the micro-batches (the first writes the sum,
the others read it and add: device_grad) before one offload.

Data parallel (devices_per_node N, nodes M; the Schedule is one rank's step, every rank runs
the same on its own share of the batch): a unit's device gradients are reduce-scattered over
the node's devices before they cross the link, so each offloads 1/N (the embedding's and a tied
head's, accumulated on the host, are summed in the node's shared memory instead); across nodes
each rank's share is reduce-scattered so node j keeps 1/M, each rank updates its 1/(N M), and the
updated working-copy slices are all-gathered from every node, and the node's ranks wait for each
other before any loads the unit again (UPDATE_BARRIER); the global norm's partial sums are
all-reduced. The host store is the node's, one copy mapped by its ranks (Buffer.node_shared).

Dependencies are not written by hand: each op declares the buffers it reads, writes and frees,
and deps.Deps derives the waits. The only waits added by hand are backpressure: a FORWARD or
BACKWARD waits until at most PENDING_D2H device->host transfers that free device memory are
still in flight, so a slow link cannot let device memory grow with depth. The order of the
compute ops and their weight slots: sequence.py; the buffers: declare.py.
"""
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import kept_work, work
from horizon_sim.schedule.limits import check_sizes
from horizon_sim.schedule.op import EMBED, Holds, OpKind
from horizon_sim.schedule.partition import Part
from horizon_sim.schedule.schedule import Schedule
from horizon_sim.schedule.sequence import REFERENCE_KINDS, Use, assign_slots, compute_sequence, reference_sequence
from horizon_sim.schedule.step_builder import StepBuilder
from horizon_sim.specs.families import family
from horizon_sim.specs.layout import ONE, Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import DTYPE_BYTES, Policy
from horizon_sim.specs import quant

PENDING_D2H = 2
"""Device->host transfers that free device memory allowed in flight before the compute lane
waits (backpressure)."""



def embed_norm_over_rows(model, step_tokens: int) -> bool:
    """Whether the embedding gradient's squared norm is taken over the step's token rows rather
    than by a sweep of the matrix: untied (a tied head's gradient fills every row), no learned
    positions (their rows are not the tokens'), and tokens under half the vocabulary (at most
    that many rows are nonzero; gathering costs twice a sweep per element)."""
    return (not model.tied_embeddings and not family(model.family).learned_positions
            and 2 * step_tokens < model.vocab)

class TrainStepBuilder(StepBuilder):
    def __init__(self, model: ModelSpec, policy: Policy, layout: Layout = ONE):
        check_sizes(model, policy)  # before any work that grows with the sizes
        if not isinstance(layout, Layout):
            raise HorizonError(f"layout={layout!r} must be a Layout (devices per node x nodes)")
        nodes = layout.nodes
        if nodes > 1 and not policy.working_copy and policy.compute_dtype != policy.master_dtype:
            raise HorizonError(f"{nodes} nodes need the bf16 working copy (each node holds 1/{nodes} of the "
                               "master, and every device streams the whole model): drop --no-working-copy")
        if policy.act_ckpt_every > model.n_layers:
            raise HorizonError(f"policy act_ckpt_every={policy.act_ckpt_every} is larger than the model's "
                               f"{model.n_layers} layers; use 1..{model.n_layers}")
        if policy.keep_last > model.n_layers:
            raise HorizonError(f"policy keep_last={policy.keep_last} is larger than the model's {model.n_layers} "
                               f"layers; use 0..{model.n_layers} or all")
        super().__init__(model, policy, layout)
        self.first_kept = model.n_layers - policy.kept_layers(model.n_layers)  # layers from here keep their graph
        self.last_micro = policy.micro_batches - 1
        self.tokens = policy.micro_batch * policy.seq  # per micro-batch
        self.optimized: set[int] = set()
        self.optimizer_op: dict[int, int] = {}  # unit -> its (this step's) OPTIMIZER op
        self.waiting_grads: list[int] = []  # units whose host grad waits for its optimizer (bounded)
        self.disk_write: dict | None = None  # the disk tier: the last update's DISK_WRITE, not yet emitted
        # transfers that free device memory, for backpressure
        self.pending_saves: list[int] = []
        self.pending_offloads: list[int] = []
        self._work()

    # ---- the work of the compute ops (schedule/work.py) -------------------------------------------
    def _work(self) -> None:
        """Each block op's FLOPs, device traffic and temporaries, per layer. Layers differ by their
        mask, their window and their shape (a model with dense blocks before its MoE ones: each
        block's own spec, ModelSpec.block_spec); each distinct kind is priced once."""
        model, p, a = self.model, self.policy, DTYPE_BYTES[self.policy.compute_dtype]
        mb, tok, L = p.micro_batch, self.tokens, model.n_layers
        masked = [work.masked_attention(model, layer, p.seq, p.doc_masks) for layer in range(L)]
        mask_b = work.mask_bytes(mb, p.seq, p.doc_masks)
        specs = [model.block_spec(layer) for layer in range(L)]
        windows = [model.window(layer) for layer in range(L)]
        pols = [work.layer_policy(model, p, layer) for layer in range(L)]  # (adapters on some layers' experts)
        keys = [(specs[i], masked[i], windows[i], pols[i]) for i in range(L)]
        kinds = sorted(set(keys), key=lambda k: (k[1], k[2], k[0].n_experts, k[3].lora_targets))
        per = {k: self._kind_work(*k, tok, a, mask_b) for k in kinds}
        rows = [per[k] for k in keys]
        for f in ("fwd_flops", "saved_bwd_flops", "bwd_flops", "fwd_hbm", "bwd_hbm", "fwd_ws", "bwd_ws", "saved_b",
                  "kept_fwd_ws", "saved_bwd_ws", "saved_bwd_hbm"):
            setattr(self, f, [r[f] for r in rows])
        self.head_hbm = work.head_elementwise_bytes(model, tok, a, p.loss_kernel)
        self.head_ws = work.head_workspace_bytes(model, tok, p.loss_chunk_tokens, a, p.loss_kernel)
        # a forward-only pass of the head (eval; DPO's reference, and its head's first pass)
        self.head_loss_hbm = work.head_loss_elementwise_bytes(model, tok, a, p.loss_kernel)
        self.head_loss_ws = work.head_loss_workspace_bytes(model, tok, p.loss_chunk_tokens, a, p.loss_kernel)
        self.boundary_bytes = tok * model.hidden * a
        # DPO's reference forward: the base's blocks without their adapters
        self.ref_fwd = ([r["base_fwd"] for r in rows], [r["ref_fwd_hbm"] for r in rows],
                        [r["ref_fwd_ws"] for r in rows])

    def _kind_work(self, m, masked: bool, window: int, p, tok: int, a: int, mask_b: int) -> dict:
        """One kind of block's work (m its block spec, p the policy as its layers see it): what
        _work lists per layer."""
        mb = p.micro_batch
        mk = mask_b * masked
        base_fwd = m.layer_fwd_flops(tok, p.seq, causal=not masked)
        # Adapters (a frozen base): the adapters' GEMMs in every block op; a backward computes the
        # base's input gradients only (its GEMMs' forward FLOPs once more, the attention's twice),
        # not its weight gradients, then the adapters' backward (twice their forward).
        if p.adapters:
            lora_fwd = work.gemm_flops(work.adapter_gemms(m, p, tok, backward=False))
            base_gemm = work.gemm_flops(work.block_gemms(m, tok, backward=False))
            fwd, saved_bwd = base_fwd + lora_fwd, base_gemm + 2 * (base_fwd - base_gemm) + 2 * lora_fwd
        else:
            fwd, saved_bwd = base_fwd, 2 * base_fwd
        # Device traffic of the elementwise kernels (norms, RoPE, SiLU, residuals; GEMMs and
        # attention are costed by their FLOPs), a chunked attention's own passes over its scores
        # (by the layer's window), and the temporaries each op holds at its peak.
        sc = {bw: work.softcap_elementwise_bytes(m, mb, p.seq, a, bw, window, p.doc_masks) for bw in (False, True)}
        fwd_hbm = work.block_elementwise_bytes(m, tok, p.seq, a, backward=False) + sc[False]
        bwd_hbm = work.block_elementwise_bytes(m, tok, p.seq, a, backward=True) + sc[False] + sc[True]  # forward again
        ws = {bw: work.block_workspace_bytes(m, mb, p.seq, a, backward=bw, attention=p.attention, mask=mk, window=window)
              for bw in (False, True)}
        # kept layers (kept_work.py): the graph's bytes, and what their two ops hold beyond it
        # (adapters: the frozen base's graph keeps less, and the adapters' inputs and products more)
        lora_saved = work.adapter_saved_bytes(m, p, tok, a) - work.frozen_saved_bytes(m, tok, a) if p.adapters else 0
        r = dict(base_fwd=base_fwd, fwd_flops=fwd, saved_bwd_flops=saved_bwd, bwd_flops=fwd + saved_bwd,
                 fwd_hbm=fwd_hbm, bwd_hbm=bwd_hbm, fwd_ws=ws[False], bwd_ws=ws[True],
                 saved_b=kept_work.kept_saved_bytes(m, mb, p.seq, a, p.attention, mk) + lora_saved,
                 kept_fwd_ws=kept_work.kept_forward_workspace_bytes(m, mb, p.seq, mk),
                 saved_bwd_ws=kept_work.saved_backward_workspace_bytes(m, mb, p.seq, a, mk),
                 saved_bwd_hbm=kept_work.saved_backward_elementwise_bytes(m, tok, p.seq, a) + sc[True],
                 ref_fwd_hbm=fwd_hbm, ref_fwd_ws=ws[False])
        if p.adapters:
            self._adapter_work(m, p, r, tok, a)
        return r

    @staticmethod
    def _adapter_work(m, p, r: dict, tok: int, a: int) -> None:
        """A block kind's bytes and temporaries with adapters on a frozen base (r, in place): the
        adapters' own kernels added, the frozen base's weight-gradient kernels taken off
        (schedule/work.py)."""
        lf = work.adapter_elementwise_bytes(m, p, tok, a, backward=False)
        lb = work.adapter_elementwise_bytes(m, p, tok, a, backward=True) - work.frozen_backward_bytes(m, tok, a)
        r["fwd_hbm"] += lf
        r["bwd_hbm"] += lf + lb
        r["saved_bwd_hbm"] += lb
        r["fwd_ws"] += work.adapter_workspace_bytes(m, p, tok, a, backward=False)
        r["kept_fwd_ws"] += work.adapter_workspace_bytes(m, p, tok, a, backward=False)
        r["bwd_ws"] += work.adapter_workspace_bytes(m, p, tok, a, backward=True)
        r["saved_bwd_ws"] += work.adapter_in_flight_bytes(m, p, tok, with_input=True)  # one adapter's gradients in flight

    # ---- emission ------------------------------------------------------------------------------
    @staticmethod
    def _backpressure(pending: list[int]) -> tuple[int, ...]:
        """Wait for the transfer that would make PENDING_D2H + 1 outstanding."""
        return (pending[-PENDING_D2H],) if len(pending) >= PENDING_D2H else ()

    # ---- the optimizer -----------------------------------------------------------------------------
    def place_optimizer(self, event: str, unit: int | None = None, micro: int = 0) -> None:
        """Where each optimizer mode updates a unit (the one place that decides):
          pipelined  'load': just before the unit's weights are first loaded this step, with
                     the previous step's gradients (prev_step ops; exact global-norm clipping)
          backward   'grads': as soon as the unit's host gradient is final (its last
                     micro-batch's offload; the embedding: its scatter), before the global norm
          after      'end': every unit once backward is over (the published code's order)"""
        mode = self.policy.optimizer
        if event == "load" and mode == "pipelined" and unit not in self.optimized:
            self.optimizer(unit, prev_step=True)
        elif event == "grads" and mode == "backward" and micro == self.last_micro:
            self.optimizer(unit)
        elif event == "end" and mode == "after":
            for u in self.units:
                self.optimizer(u)

    def optimizer(self, u: int, prev_step: bool = False) -> None:
        b, p = self.bufs, self.policy
        params = b.owned_params(u)
        # bytes moved per parameter: the master read and written, the moments read and written,
        # the gradient read, the working copy written (a split master: both halves read and
        # written, the high half being the copy: 26 with fp32 moments and bf16 grads, not 28)
        state_b = DTYPE_BYTES[p.states_dtype]
        per_param = 4 * state_b + DTYPE_BYTES[b.buffers[b.host_grad(u)].dtype]
        if p.split_master:
            per_param += 2 * (p.master_bytes + DTYPE_BYTES[p.compute_dtype])
        else:
            per_param += 2 * DTYPE_BYTES[p.master_dtype] + (DTYPE_BYTES[p.compute_dtype] if b.has_copy else 0)
        store = b.host_store(u)
        here = dict(zip(store, store))  # what the update touches of each store buffer: itself, or its stage
        if b.on_disk:  # read into stages ahead of the update; the previous unit's write after it
            pairs = b.disk_stages(u)
            here.update(pairs)
            disk, stages = [d for d, _ in pairs], [s for _, s in pairs]
            nbytes = sum(b.buffers[s].bytes for s in stages)
            self.emit(OpKind.DISK_READ, u, reads=disk, writes=stages, disk_bytes=nbytes, prev_step=prev_step)
            self.flush_disk_write()
        master, moments = here[store[0]], here[store[1]]
        reads = [b.host_grad(u), master, moments, *(store[2:] if p.split_master else [])] + ([b.grad_norm_scalar()] if p.clip else [])
        frees = () if b.grads_static else (b.host_grad(u),)
        op_id = self.emit(OpKind.OPTIMIZER, u, reads=reads, writes=[master, moments, *store[2:]], frees=frees,
                          params=params, host_bytes=params * per_param, prev_step=prev_step)
        if b.on_disk:
            self.disk_write = dict(unit=u, reads=stages, writes=disk, frees=stages, disk_bytes=nbytes,
                                   prev_step=prev_step)
        self.optimized.add(u)
        if not prev_step:
            self.optimizer_op[u] = op_id
        per_node, nodes = self.layout.devices_per_node, self.layout.nodes
        if nodes > 1:  # every node needs every node's updated slice of the working copy
            wc = b.weights_of(u)
            rank_part = b.partition(u).numel(Part.LOCAL) * DTYPE_BYTES[p.compute_dtype]
            self.emit(OpKind.NET_ALL_GATHER, u, reads=[wc], writes=[wc], peers=nodes,
                      net_bytes=rank_part * (nodes - 1) // nodes, prev_step=prev_step)
        if per_node > 1:  # the node's ranks each updated a slice of the shared copy: all must be done
            w = b.weights_of(u)
            self.emit(OpKind.UPDATE_BARRIER, u, reads=[w], writes=[w], peers=per_node, prev_step=prev_step)

    def flush_disk_write(self) -> None:
        """Emit the pending DISK_WRITE. It goes after the next unit's DISK_READ on the disk lane
        (FIFO), so the read of unit i+1 overlaps the update of unit i, and a third stage is
        never live: a read waits for the write two units back, ahead of it on the lane."""
        if self.disk_write:
            w, self.disk_write = self.disk_write, None
            self.emit(OpKind.DISK_WRITE, w.pop("unit"), **w)

    # ---- copies ----------------------------------------------------------------------------------
    def load_weights(self, u: int, slot: str, m: int) -> None:
        """A unit's weights -> a device slot (a tied head: its norm, then the embedding matrix)."""
        b, p = self.bufs, self.policy
        units = [u] + ([EMBED] if u == self.head and self.model.tied_embeddings else [])
        for v in units:
            self.place_optimizer("load", v)
        s = int(b.buffers[slot].layer)
        # adapters on the host: the block's adapters (A and B, fp32) cross with its weights
        lora_in, lora_out = ([b.adapters_of(u)], [b.adapter_slot(s)]) if self.host_adapters(u) else ([], [])
        lora_bytes = 4 * b.adapter_params(u) if lora_in else 0
        if b.quantized(u):  # a quantized base: its bytes cross, then the device dequantizes them into the slot
            a, bs = DTYPE_BYTES[p.compute_dtype], self.model.block_spec(u)
            self.emit(OpKind.LOAD_WEIGHTS, u, m, slot=s, reads=[b.weights_of(u), *lora_in],
                      writes=[slot, *lora_out], link_bytes=b.quant_bytes(u) + lora_bytes, params=quant.quantized_params(bs),
                      hbm_bytes=quant.dequant_traffic_bytes(bs, p.base_quant, a),
                      workspace_bytes=quant.dequant_workspace_bytes(bs, p.base_quant, p.compute_dtype))
            return
        cast_on_device = not b.has_copy and p.master_dtype != p.compute_dtype
        elem = DTYPE_BYTES[p.master_dtype] if cast_on_device else DTYPE_BYTES[p.compute_dtype]
        self.emit(OpKind.LOAD_WEIGHTS, u, m, slot=s, reads=[b.weights_of(v) for v in units] + lora_in,
                  writes=[slot, *lora_out], link_bytes=b.dev_params(u) * elem + lora_bytes,
                  workspace_bytes=b.dev_params(u) * DTYPE_BYTES[p.master_dtype] if cast_on_device else 0)

    def host_adapters(self, u: int) -> bool:
        """Block u's adapters live on the host (Policy.adapters_on), and it has some."""
        return self.policy.adapters_on == "host" and 0 <= u < self.model.n_layers and self.bufs.adapter_params(u) > 0

    def _bound_host_grads(self, u: int) -> tuple[int, ...]:
        """policy.max_host_grads: before unit u's host gradient is made, wait for the updates
        that bring the gradients still waiting down to one fewer than the bound (like the device
        side's pending offloads; the wait shows up as d2h, then compute, stalls)."""
        k = self.policy.max_host_grads
        if not k or u == EMBED:
            return ()
        waits = []
        while len(self.waiting_grads) >= k:
            waits.append(self.optimizer_op[self.waiting_grads.pop(0)])
        self.waiting_grads.append(u)
        return tuple(waits)

    def grad_target(self, u: int, m: int) -> tuple[str, bool]:
        """The device buffer micro-batch m's gradients of unit u go to, and whether they are
        added into it (it is then among the op's reads: what the executor goes by). The micro
        order: micro-batch m's own, offloaded after it. The layer order
        (Declarations.grads_summed_on_device): the unit's sum over the step, which micro-batch 0
        writes and the others add into, offloaded once after the last."""
        b = self.bufs
        return (b.device_grad(u, None), m > 0) if b.grads_summed_on_device else (b.device_grad(u, m), False)

    def grad_write_bytes(self, dgrad: str, add: bool) -> int:
        """Bytes a backward moves writing its weight gradients (compute dtype, as autograd returns
        them) into their device buffer: copy_ reads them and writes the buffer; add_ into a sum
        (the layer order's fp32 one) also reads the sum (runtime/ops.py)."""
        buf = self.bufs.buffers[dgrad]
        a, s = DTYPE_BYTES[self.policy.compute_dtype], DTYPE_BYTES[buf.dtype]
        return buf.numel * (a + s + (s if add else 0))

    def grads_made(self, u: int, m: int) -> None:
        """Micro-batch m's gradients of unit u are on the device: offload them (the layer
        order: the sum, after the last micro-batch) and let the optimizer mode act."""
        if not self.bufs.grads_summed_on_device or m == self.last_micro:
            self.offload_grads(u, m)
        self.place_optimizer("grads", u, m)

    def offload_grads(self, u: int, m: int) -> None:
        """A unit's device gradients -> its host gradient (a tied head's matrix part -> the
        embedding's), added into what earlier micro-batches left; the unit's squared norm on
        its last micro-batch."""
        b, p = self.bufs, self.policy
        dgrad, per_node = self.grad_target(u, m)[0], self.layout.devices_per_node
        if per_node > 1 and not b.host_reduced(u):  # sum over the node's devices, keep 1/N
            full, dgrad = dgrad, b.device_grad_shard(u, b.buffers[dgrad].micro)
            nbytes = b.buffers[full].bytes
            self.emit(OpKind.REDUCE_SCATTER, u, m, reads=[full], writes=[dgrad], frees=[full], peers=per_node,
                      net_bytes=nbytes * (per_node - 1) // per_node)
        targets = [b.host_grad(u)] + ([b.host_grad(EMBED)] if u == self.head and self.model.tied_embeddings else [])
        acc = [t for t in targets if self.deps.written(t)]  # accumulate into what exists
        # a piece the host adds or widens lands in a page-locked stage first (DMA links)
        stages = [b.link_stage(t) for t in targets if t in acc or b.buffers[t].dtype != p.grad_dtype]
        last = m == self.last_micro
        writes = targets + ([b.grad_sq(u)] if last else []) + stages
        elems = b.buffers[dgrad].numel  # the unit's, or this device's 1/N of it
        host_b = elems * 8 if acc else 0  # read-add-write the fp32 host grad
        if acc and last:  # the squared norm is then taken of the accumulated host grad
            host_b += b.buffers[b.host_grad(u)].numel * DTYPE_BYTES[b.buffers[b.host_grad(u)].dtype]
        link_b = elems * DTYPE_BYTES[p.grad_dtype]
        # a device sum (fp32) is narrowed to grad_dtype on the device before the link
        summed = b.buffers[dgrad].micro is None and b.buffers[dgrad].dtype != p.grad_dtype
        self.pending_offloads.append(
            self.emit(OpKind.OFFLOAD_GRADS, u, m, reads=[dgrad, *acc], writes=writes, frees=[dgrad, *stages],
                      link_bytes=link_b, host_bytes=host_b, reduce_bytes=link_b if last and not acc else 0,
                      workspace_bytes=link_b if summed else 0, after=self._bound_host_grads(u)))
        if last:
            self.reduce_across_ranks(u)

    def reduce_across_ranks(self, u: int) -> None:
        """A unit's gradient is final on this rank: sum it over the node's ranks where it was
        accumulated on the host, then over the nodes, so this rank holds the sum of its share;
        its squared norm is taken of that share."""
        b = self.bufs
        g, gb = b.host_grad(u), DTYPE_BYTES[b.buffers[b.host_grad(u)].dtype]
        part, per_node, nodes = b.partition(u).numel(Part.LOCAL), self.layout.devices_per_node, self.layout.nodes
        if per_node > 1 and b.host_reduced(u):  # read the node's N slices of this rank's 1/N, write it
            self.emit(OpKind.HOST_REDUCE, u, reads=[g], writes=[g, b.grad_sq(u)],
                      host_bytes=(b.host_params(u) + 2 * part) * gb)
        if nodes > 1:
            self.emit(OpKind.NET_REDUCE_SCATTER, u, reads=[g], writes=[g, b.grad_sq(u)], peers=nodes,
                      net_bytes=part * gb * (nodes - 1) // nodes,
                      host_bytes=2 * part * gb * (nodes - 1) // nodes + b.owned_params(u) * gb)

    # ---- the phases ------------------------------------------------------------------------------
    def embed(self, m: int) -> None:
        """The micro-batch's embedding rows gathered on the host, then loaded as the layer-0 input."""
        b, p, a = self.bufs, self.policy, DTYPE_BYTES[self.policy.compute_dtype]
        self.place_optimizer("load", EMBED)
        src = b.weights_of(EMBED)
        emb = b.host_rows(f"emb.m{m}", Holds.EMBEDDED, m, "staging")
        src_b = a if b.has_copy else DTYPE_BYTES[p.master_dtype]
        self.emit(OpKind.EMBED_FWD, EMBED, m, reads=[src], writes=[emb],
                  host_bytes=self.tokens * self.model.hidden * (src_b + a))
        self.emit(OpKind.LOAD_INPUT, EMBED, m, reads=[emb], writes=[b.activation(m, 0)], frees=[emb],
                  link_bytes=self.boundary_bytes)

    def act_ckpt(self, m: int, layer: int) -> str:
        return self.bufs.host_rows(f"ckpt.m{m}.{layer}", Holds.ACT_CHECKPOINT, m, "act_checkpoints", layer=layer)

    def saved(self, m: int, u: int) -> str:
        """Kept layer u's graph of micro-batch m (its SAVED_ACTIVATIONS buffer)."""
        return self.bufs.saved_activations(m, u, self.saved_b[u])

    def forward(self, use: Use, slot: str) -> None:
        b, p, u, m = self.bufs, self.policy, use.unit, use.micro
        graph = u >= self.first_kept  # keeps its graph: needs no checkpoint
        kept = u % p.act_ckpt_every == 0 and not graph
        writes = [b.activation(m, u + 1)] + ([self.saved(m, u)] if graph else [])
        self.emit(OpKind.FORWARD, u, m, slot=b.buffers[slot].layer, reads=[b.activation(m, u), slot, *self.lora(u, slot)],
                  writes=writes,
                  frees=[] if kept else [b.activation(m, u)], flops=self.fwd_flops[u], hbm_bytes=self.fwd_hbm[u],
                  workspace_bytes=self.kept_fwd_ws[u] if graph else self.fwd_ws[u],
                  after=self._backpressure(self.pending_saves))
        if kept and p.act_ckpt_on == "host":
            self.pending_saves.append(
                self.emit(OpKind.SAVE_CKPT, u, m, reads=[b.activation(m, u)], writes=[self.act_ckpt(m, u)],
                          frees=[b.activation(m, u)], link_bytes=self.boundary_bytes))

    def lora(self, u: int, slot: str) -> list[str]:
        """What a block op reads of the adapters: the block's (none without them); adapters on the
        host: the device copy its load put beside its weights in `slot`."""
        if self.host_adapters(u):
            return [self.bufs.adapter_slot(int(self.bufs.buffers[slot].layer))]
        return [self.bufs.adapters_of(u)] if self.policy.adapters and self.policy.adapters_on == "device" else []

    def head_op(self, use: Use, slot: str) -> None:
        b, u, m = self.bufs, use.unit, use.micro
        x, dx = b.activation(m, u), b.activation_grad(m, u)
        # DPO: a first forward pass for the rows' log-probabilities, then the gradient's, reading the reference's
        dpo = self.policy.objective == "dpo"
        ref, passes, hbm = ([b.ref_logps()], 1, self.head_hbm + self.head_loss_hbm) if dpo else ([], 0, self.head_hbm)
        if self.policy.adapters:  # a frozen head: the input's gradient only
            self.emit(OpKind.HEAD, u, m, slot=b.buffers[slot].layer, reads=[x, slot, *ref], writes=[dx], frees=[x],
                      flops=(2 + passes) * self.model.head_fwd_flops(self.tokens), hbm_bytes=hbm,
                      workspace_bytes=self.head_ws)
            return
        dgrad, add = self.grad_target(u, m)
        # The head's kernels write its gradients in the compute dtype; into a device sum
        # (fp32, or one to add to) they go through a temporary of the head's size.
        a = DTYPE_BYTES[self.policy.compute_dtype]
        staged = add or b.buffers[dgrad].dtype != self.policy.compute_dtype
        self.emit(OpKind.HEAD, u, m, slot=b.buffers[slot].layer, reads=[x, slot] + ([dgrad] if add else []) + ref,
                  writes=[dx, dgrad], frees=[x], flops=(3 + passes) * self.model.head_fwd_flops(self.tokens),
                  hbm_bytes=hbm, workspace_bytes=self.head_ws + (b.dev_params(u) * a if staged else 0))
        self.grads_made(u, m)  # a tied matrix is updated with the embedding, later

    def ref_forward(self, use: Use, slot: str) -> None:
        """DPO's reference pass through block u (adapters: the base without them, from the step's own
        input at block 0, kept for the step's forward; full fine-tuning: the reference copy's weights,
        from its own embedded input), then along the reference's boundaries."""
        b, u, m = self.bufs, use.unit, use.micro
        shared = u == 0 and not b.own_reference
        src = b.activation(m, 0) if shared else b.ref_activation(m, u)
        flops, hbm, ws = (t[u] for t in self.ref_fwd)
        self.emit(OpKind.REF_FORWARD, u, m, slot=b.buffers[slot].layer, reads=[src, slot],
                  writes=[b.ref_activation(m, u + 1)], frees=[] if shared else [src], flops=flops, hbm_bytes=hbm,
                  workspace_bytes=ws)

    def ref_embed(self, m: int) -> None:
        """Full fine-tuning's DPO: the micro-batch's rows of the reference's embedding, loaded as
        the reference pass's input."""
        b, a = self.bufs, DTYPE_BYTES[self.policy.compute_dtype]
        emb = b.host_rows(f"embr.m{m}", Holds.REF_EMBEDDED, m, "staging")
        self.emit(OpKind.EMBED_FWD, EMBED, m, reads=[b.ref_weights_of(EMBED)], writes=[emb],
                  host_bytes=self.tokens * self.model.hidden * 2 * a)
        self.emit(OpKind.LOAD_INPUT, EMBED, m, reads=[emb], writes=[b.ref_activation(m, 0)], frees=[emb],
                  link_bytes=self.boundary_bytes)

    def load_ref_weights(self, u: int, slot: str, m: int) -> None:
        """Full fine-tuning's DPO: a unit's reference weights -> a slot (a tied head: its norm, then
        the reference embedding's matrix)."""
        b, a = self.bufs, DTYPE_BYTES[self.policy.compute_dtype]
        units = [u] + ([EMBED] if u == self.head and self.model.tied_embeddings else [])
        self.emit(OpKind.LOAD_WEIGHTS, u, m, slot=int(b.buffers[slot].layer), reads=[b.ref_weights_of(v) for v in units],
                  writes=[slot], link_bytes=b.dev_params(u) * a)

    def ref_head(self, use: Use, slot: str) -> None:
        """DPO's reference pass at the head: each row's completion log-probability, into REF_LOGPS."""
        b, u, m = self.bufs, use.unit, use.micro
        x = b.ref_activation(m, u)
        self.emit(OpKind.HEAD_LOSS, u, m, slot=b.buffers[slot].layer, reads=[x, slot], writes=[b.ref_logps()], frees=[x],
                  flops=self.model.head_fwd_flops(self.tokens), hbm_bytes=self.head_loss_hbm,
                  workspace_bytes=self.head_loss_ws)

    def reload_block(self, use: Use) -> None:
        """A backward block begins: its checkpoint comes back from the host."""
        b, m, s = self.bufs, use.micro, use.block_start
        ck = self.act_ckpt(m, s)
        self.emit(OpKind.LOAD_CKPT, s, m, reads=[ck], writes=[b.activation(m, s)], frees=[ck], link_bytes=self.boundary_bytes)

    def recompute(self, use: Use, slot: str) -> None:
        b, u, m = self.bufs, use.unit, use.micro
        self.emit(OpKind.RECOMPUTE, u, m, slot=b.buffers[slot].layer, reads=[b.activation(m, u), slot, *self.lora(u, slot)],
                  writes=[b.activation(m, u + 1)], flops=self.fwd_flops[u], hbm_bytes=self.fwd_hbm[u],
                  workspace_bytes=self.fwd_ws[u])

    def adapter_backward(self, kind: OpKind, u: int, m: int, slot: str, graph: list[str], hbm: int, ws: int) -> None:
        """A block's backward on a frozen base: its input's gradient (none for block 0: the
        embedding is frozen too) and its adapters' gradient, added into the step's sum."""
        b = self.bufs
        host = self.host_adapters(u)
        # adapters on the host: this backward's gradient in the slot's device buffer, then added
        # into the block's host sum; else added into the device sum
        dy, g = b.activation_grad(m, u + 1), b.adapter_grad_slot(int(b.buffers[slot].layer)) if host else b.adapter_grads(u)
        add = not host and self.deps.written(g)
        n = b.adapter_params(u)
        self.emit(kind, u, m, slot=b.buffers[slot].layer, reads=[*graph, dy, slot, *self.lora(u, slot)] + ([g] if add else []),
                  writes=([b.activation_grad(m, u)] if u > 0 else []) + [g], frees=[*graph, dy],
                  flops=(self.bwd_flops if kind == OpKind.BACKWARD else self.saved_bwd_flops)[u],
                  hbm_bytes=hbm + n * 4 * (2 if add else 1), workspace_bytes=ws)
        if host:
            h = b.adapter_grads(u)
            summed = self.deps.written(h)  # a later micro-batch adds into the sum (read, read, write)
            self.emit(OpKind.OFFLOAD_ADAPTER_GRADS, u, m, reads=[g] + ([h] if summed else []), writes=[h],
                      link_bytes=4 * n, host_bytes=12 * n if summed else 0)

    def backward(self, use: Use, slot: str) -> None:
        b, u, m = self.bufs, use.unit, use.micro
        if self.policy.adapters:
            return self.adapter_backward(OpKind.BACKWARD, u, m, slot, [b.activation(m, u)], self.bwd_hbm[u],
                                         self.bwd_ws[u])
        x, dy, dx = b.activation(m, u), b.activation_grad(m, u + 1), b.activation_grad(m, u)
        dgrad, add = self.grad_target(u, m)
        self.emit(OpKind.BACKWARD, u, m, slot=b.buffers[slot].layer, reads=[x, dy, slot] + ([dgrad] if add else []),
                  writes=[dx, dgrad], frees=[x, dy],
                  flops=self.bwd_flops[u], hbm_bytes=self.bwd_hbm[u] + self.grad_write_bytes(dgrad, add),
                  workspace_bytes=self.bwd_ws[u],
                  after=self._backpressure(self.pending_offloads))
        self.grads_made(u, m)
        if u == 0:
            self.embedding_grad(m)

    def backward_saved(self, use: Use, slot: str) -> None:
        """A kept layer's backward from its forward's graph (no recompute)."""
        b, u, m = self.bufs, use.unit, use.micro
        if self.policy.adapters:
            return self.adapter_backward(OpKind.BACKWARD_SAVED, u, m, slot, [self.saved(m, u)], self.saved_bwd_hbm[u],
                                         self.saved_bwd_ws[u])
        dy, dx = b.activation_grad(m, u + 1), b.activation_grad(m, u)
        dgrad, add = self.grad_target(u, m)
        self.emit(OpKind.BACKWARD_SAVED, u, m, slot=b.buffers[slot].layer,
                  reads=[self.saved(m, u), dy, slot] + ([dgrad] if add else []), writes=[dx, dgrad],
                  frees=[self.saved(m, u), dy], flops=self.saved_bwd_flops[u],
                  hbm_bytes=self.saved_bwd_hbm[u] + self.grad_write_bytes(dgrad, add),
                  workspace_bytes=self.saved_bwd_ws[u], after=self._backpressure(self.pending_offloads))
        self.grads_made(u, m)
        if u == 0:
            self.embedding_grad(m)

    def embedding_grad(self, m: int) -> None:
        """The layer-0 input's gradient to the host, scattered into the embedding's gradient."""
        b, a = self.bufs, DTYPE_BYTES[self.policy.compute_dtype]
        hdx = b.host_rows(f"hdx.m{m}", Holds.INPUT_GRAD, m, "staging")
        self.emit(OpKind.OFFLOAD_INPUT_GRAD, EMBED, m, reads=[b.activation_grad(m, 0)], writes=[hdx], frees=[b.activation_grad(m, 0)],
                  link_bytes=self.boundary_bytes)
        g = b.host_grad(EMBED)
        exists = self.deps.written(g)
        last = m == self.last_micro
        # A fresh dense embedding grad is zeroed first (a sweep of the whole matrix); the last
        # micro also sums its squares for the global norm: over the step's token rows when they
        # are few against the vocabulary (the rest is zero; gathered, so 2 x the bytes), else
        # (or when a tied head's gradient landed in it too) a sweep (ops.embed_bwd decides alike).
        step_tokens = self.tokens * self.policy.micro_batches
        rows = last and embed_norm_over_rows(self.model, step_tokens)
        sweeps = (0 if exists else 1) + (1 if last and not rows else 0)
        grad_b = DTYPE_BYTES[b.buffers[g].dtype]
        self.emit(OpKind.EMBED_BWD, EMBED, m, reads=[hdx] + ([g] if exists else []),
                  writes=[g] + ([b.grad_sq(EMBED)] if last else []), frees=[hdx],
                  host_bytes=self.tokens * self.model.hidden * (a + 2 * grad_b)
                  + sweeps * self.model.embedding_params * grad_b
                  + (step_tokens * self.model.hidden * 2 * grad_b if rows else 0))
        if last:
            self.reduce_across_ranks(EMBED)
        self.place_optimizer("grads", EMBED, m)

    def end(self) -> None:
        """The global gradient norm (clipping, logging), then the 'after' mode's updates
        (adapters: their norm, clipping and AdamW in one pass on the device)."""
        if self.policy.adapters:
            return self.adapter_update()
        self.grad_norm()
        self.place_optimizer("end")

    def adapter_update(self) -> None:
        """Every block's adapters updated on the device once the backward is over: the global
        norm of their gradients (a read), then AdamW (the adapters and both moments read and
        written, the gradient read and zeroed for the next step): 36 bytes a parameter."""
        b, blocks = self.bufs, range(self.model.n_layers)
        state, grads = [b.adapters_of(u) for u in blocks], [b.adapter_grads(u) for u in blocks]
        n = sum(b.adapter_params(u) for u in blocks)
        peers, nodes = self.layout.devices_per_node, self.layout.nodes
        if peers > 1:  # every device's sums added up (a ring all-reduce: 2 (N - 1) / N of the bytes sent)
            self.emit(OpKind.ADAPTER_ALL_REDUCE, -1, reads=grads, writes=grads, peers=peers,
                      net_bytes=2 * 4 * n * (peers - 1) // peers)
        if nodes > 1:  # then every node's sums, among the ranks of one local rank (a ring over the NICs)
            self.emit(OpKind.ADAPTER_NET_ALL_REDUCE, -1, reads=grads, writes=grads, peers=nodes,
                      net_bytes=2 * 4 * n * (nodes - 1) // nodes)
        kind = OpKind.ADAPTER_HOST_UPDATE if self.policy.adapters_on == "host" else OpKind.ADAPTER_UPDATE
        work_ = dict(host_bytes=36 * n) if kind == OpKind.ADAPTER_HOST_UPDATE else dict(hbm_bytes=36 * n)
        self.emit(kind, -1, reads=state + grads, writes=state + grads, params=n, **work_)

    # ---- the step ------------------------------------------------------------------------------
    def build(self) -> Schedule:
        model, p, b = self.model, self.policy, self.bufs
        b.device_constants()
        slots = [b.weight_slot(s) for s in range(p.slots)]
        seq = compute_sequence(model.n_layers, p.act_ckpt_every, p.micro_batches, p.mb_order,
                               kept=model.n_layers - self.first_kept)
        dpo = p.objective == "dpo"
        if dpo:  # the reference's pass first, from the same embedded input
            seq = reference_sequence(model.n_layers, p.micro_batches, p.mb_order) + seq
        compute = {OpKind.FORWARD: self.forward, OpKind.HEAD: self.head_op, OpKind.RECOMPUTE: self.recompute,
                   OpKind.BACKWARD: self.backward, OpKind.BACKWARD_SAVED: self.backward_saved,
                   OpKind.REF_FORWARD: self.ref_forward, OpKind.HEAD_LOSS: self.ref_head}
        own = b.own_reference  # full fine-tuning's DPO: the reference pass has weights and an input of its own
        first = OpKind.REF_FORWARD if dpo and not own else OpKind.FORWARD
        for use, (s, needs_load) in zip(seq, assign_slots(seq, p.slots, own)):
            ref = use.kind in REFERENCE_KINDS
            if use.kind == first and use.unit == 0:
                self.embed(use.micro)
            elif own and use.kind == OpKind.REF_FORWARD and use.unit == 0:
                self.ref_embed(use.micro)
            if use.block_start is not None and p.act_ckpt_on == "host":
                self.reload_block(use)
            if needs_load:
                (self.load_ref_weights if own and ref else self.load_weights)(use.unit, slots[s], use.micro)
            compute[use.kind](use, slots[s])
        self.end()
        self.flush_disk_write()
        step = per_token = model.model_flops_per_token(p.seq, p.context_tokens)
        if p.adapters:  # no weight gradients of the base (2N a token less); the adapters' 6 a parameter
            per_token += 6 * sum(b.adapter_params(u) for u in range(model.n_layers)) - 2 * model.model_flops_params
        if dpo:  # and the reference's forward: a third of the full step's count
            per_token += step / 3
        return self.schedule(slot_bytes=b.slot_bytes, model_flops=per_token * p.tokens)


def build_schedule(model: ModelSpec, policy: Policy, layout: Layout = ONE) -> Schedule:
    """The ops of one steady-state training step of `model` under `policy`, checked: one
    rank's step when the layout has several ranks (every rank runs `policy.batch` sequences)."""
    return TrainStepBuilder(model, policy, layout).build().check()
