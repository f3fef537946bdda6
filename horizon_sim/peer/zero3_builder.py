"""build_zero3_schedule(model, zero3): one training step of DeepSpeed ZeRO-3 with parameters and
optimizer offloaded to CPU (one GPU), as a Schedule for the same simulator, in the same ops
vocabulary (plus BACKWARD_SAVED, FETCHED_WEIGHTS, SAVED_ACTIVATIONS). It reads as the step:

  host      fp32 master, fp32 Adam moments, fp32 gradient partition and the bf16 parameter
            partition the device fetches from: 18 bytes per parameter, static (DeepSpeed's
            estimate_zero3_model_states_mem_needs arithmetic, without its 1.5x buffer factor);
            DeepSpeedCPUAdam's tile buffers and copy-on-write copies when knobs say so
            (host_extras.py)
  forward   per micro-batch, units in order (the embedding, the layers, the head): each unit's
            parameters fetched to the device ahead of use (LOAD_WEIGHTS into a FETCHED_WEIGHTS
            buffer: up to prefetch_bucket_params of it while the previous unit computes, the rest
            on demand) and released after use unless it is used again within
            max_reuse_distance_params of fetches (and max_live_params allows); each layer keeps
            what its backward needs on the device (SAVED_ACTIVATIONS): every saved tensor of the
            persistent autograd graph, or with act_ckpt only its input
  head      logits of every token at once (one loss chunk), forward and backward in one op
  backward  layers in reverse: parameters fetched again where they were released; BACKWARD
            (act_ckpt: forward again with grad, then grad) or BACKWARD_SAVED (the graph's
            backward only); the layer-0 backward also makes the embedding's dense gradient, with
            the embedding's weight fetched again (its pre-backward hook) and kept until its
            gradient has gone; a tied LM head's gradient waits on the device for it and the two
            go down as one (holds_tied_head_grad);
            gradients gathered into buckets of reduce_bucket_params and offloaded as fp32 into
            the host partition (OFFLOAD_GRADS: 4 bytes per parameter over the link; added to
            the earlier micro-batches' on the host); overlap_comm off: the next backward waits
            for each bucket's offload; on: at most MAX_REDUCE_EVENTS offloads are in flight
            when the next is issued (the backward waits for the oldest), and the bucket itself
            is one persistent device buffer of reduce_bucket_params in the compute dtype; each
            offload holds partition_grads' device temporaries for its largest tensor
            (zero3_grad_path.py); pin_memory off: the gradient copies run at the link's
            pageable rate and the host sits in each, so the next backward, and the part of the
            next fetch that is not prefetched, start after it
  hooks     before a unit's kernels, the host runs DeepSpeed's module hooks (HOOKS on the CPU
            lane: modules x hook calls x hook_us, plus tensor_op_us per tensor it copies or
            reduces); with sync_per_wait they start only once the unit's copies have landed
            (the wait synchronises the copy stream), and the unit's compute waits for them
  copies    per_tensor_fetch: a unit's fetch is one copy per parameter tensor (each pays the
            link's latency); fp32_grad_copy: each bucket's gradients go down into the host
            partition and come back up (RELOAD_GRADS), in the compute dtype, and the last
            micro-batch's go down once more, cast to fp32, into the optimizer's gradient
            (accumulation on the device), or with host_cast_at_boundary (v0.6-v0.7) in the
            compute dtype, cast by the host; per_param_norm: a norm
            pass over each fp32 gradient on the device and a host loop over the tensors
  end       the global norm over the host gradients, then per unit the unscale of its fp32
            gradients (HOST_PASS), DeepSpeedCPUAdam (OPTIMIZER) and the cast of the updated
            master into the partition the next step fetches (HOST_PASS), after the backward:
            nothing overlaps them

What is approximated, and why: DeepSpeed fetches, prefetches and waits module by module along
its recorded trace; here a unit (layer) is the grain: its copies are per tensor, but issued as
two groups (its first prefetch_bucket_params early, the rest once the compute before it is done)
and its hooks are one op before its compute.
Parameters below stage3_param_persistence_threshold (norm weights) stay on the device in
DeepSpeed; here they travel with their layer (a few KB per layer). One device; ZeRO-3 over
several GPUs (the all-gathers and reduce-scatters across them) is not modelled yet.
"""
from horizon_sim.errors import HorizonError
from horizon_sim.peer.host_extras import declare_host_extras
from horizon_sim.peer.zero3_counts import modules, tensors
from horizon_sim.peer.zero3_grad_path import (ADAM_BYTES_PER_PARAM, UNSCALE_BYTES_PER_PARAM, cast_bytes_per_param,
                                              partition_grads_temporaries)
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.schedule import work
from horizon_sim.schedule.op import DTYPE_BYTES_OF, EMBED, Family, Holds, OpKind, Space
from horizon_sim.schedule.schedule import Schedule
from horizon_sim.schedule.step_builder import StepBuilder
from horizon_sim.specs.model import ModelSpec


MAX_REDUCE_EVENTS = 2
"""DeepSpeed 0.19 stage 3 (deepspeed/runtime/zero/stage3.py): `max_param_reduce_events = 2`;
__reduce_and_partition_ipg_grads synchronises the oldest reduce event before it issues a bucket
while more than that many are outstanding, so the host thread, and with it the backward, stalls
until the offload three buckets back is done. The gradients waiting for their bucket are what the
device holds on top of it: a bounded number, whatever the link's speed."""


class Zero3StepBuilder(StepBuilder):
    family = Family.ZERO3_OFFLOAD

    @property
    def reduce_window(self) -> int:
        """With overlap_comm, the backward after an offload waits for the offload this many back
        (MAX_REDUCE_EVENTS' docstring)."""
        return MAX_REDUCE_EVENTS + 1

    def __init__(self, model: ModelSpec, zero3: Zero3Policy, synchronous: bool = False):
        super().__init__(model, zero3.horizon_policy())
        self.zero3, self.synchronous = zero3, synchronous
        self.a = DTYPE_BYTES_OF[zero3.compute_dtype]
        self.bf16 = zero3.compute_dtype == "bf16"
        self.tokens = zero3.micro_batch * zero3.seq
        self.fetched: set[int] = set()  # units whose parameters are on the device now
        self.compute_ends: list[int] = []  # compute ops in order (prefetch is relative to them)
        self.bucket: list[tuple[int, str]] = []  # (unit, device grad) gathered for the next offload
        self.offloads: list[int] = []  # OFFLOAD_GRADS ops so far, in order
        self.stall: tuple[int, ...] = ()  # what the next backward waits for (overlap_comm's bound)
        self.copies_of: dict[int, list[int]] = {}  # a unit's LOAD_WEIGHTS ops of its latest fetch
        self.held: list[tuple[int, str]] = []  # gradients autograd holds until the embedding's backward

    # ---- sizes -----------------------------------------------------------------------------------
    def params(self, u: int) -> int:
        """Parameters unit u brings to the device (the embedding's matrix too: the peer looks
        rows up there)."""
        return self.bufs.host_params(u) if u == EMBED else self.bufs.dev_params(u)

    def grad_params(self, u: int) -> int:
        """Gradient elements unit u adds to an offload: a tied head's norm alone (its matrix's
        gradient is the embedding's: autograd sums the two before it calls the weight's one
        AccumulateGrad, so DeepSpeed's hook sees one gradient, once)."""
        return self.bufs.host_params(u) if u == self.head and self.model.tied_embeddings else self.params(u)

    @property
    def holds_tied_head_grad(self) -> bool:
        """A tied LM head's gradient waits on the device for the embedding's backward: the tied
        weight's AccumulateGrad runs once, after both its uses have sent their gradients
        (PyTorch autograd sums a node's inputs before it runs the node), and DeepSpeed's
        gradient hook hangs off that node (stage3.py create_reduce_and_remove_grad_hooks)."""
        return self.model.tied_embeddings

    # ---- emission ----------------------------------------------------------------------------------
    def extra_waits(self, op_id: int) -> tuple[int, ...]:
        return (op_id - 1,) if self.synchronous and op_id else ()  # one thread does everything, in order

    def emit(self, kind, unit, micro=0, **kw) -> int:
        op_id = super().emit(kind, unit, micro, **kw)
        if kind in (OpKind.FORWARD, OpKind.HEAD, OpKind.BACKWARD, OpKind.BACKWARD_SAVED):
            self.compute_ends.append(op_id)
        return op_id

    # ---- buffers -----------------------------------------------------------------------------------
    def w(self, u: int) -> str:
        b = self.bufs
        return b.declare(f"fetched.{b.unit_label(u)}", Space.DEVICE, Holds.FETCHED_WEIGHTS, (self.params(u),),
                         self.zero3.compute_dtype, role="weights", unit=u)

    def saved(self, m: int, u: int) -> str:
        """What layer u keeps on the device for its backward: its input (act_ckpt), else every
        tensor autograd saved in its forward."""
        n = (self.tokens * self.model.hidden * self.a if self.zero3.act_ckpt else
             work.block_saved_bytes(self.model.block_spec(u), self.zero3.micro_batch, self.zero3.seq, self.a))
        return self.bufs.declare(f"saved.m{m}.{u}", Space.DEVICE, Holds.SAVED_ACTIVATIONS, (n,), "uint8",
                                 role="activations", micro=m, layer=u)

    def partition(self, u: int) -> str:
        """The parameters the device fetches from: DeepSpeed's offloaded partition, bf16 (the
        working copy's place) or, in fp32, a second fp32 copy beside the optimizer's master."""
        b = self.bufs
        if self.bf16:
            return b.weights_of(u)
        return b.declare(f"params.{b.unit_label(u)}", Space.HOST, Holds.WORKING_COPY, (b.host_params(u),), "fp32",
                         True, "working_copy", unit=u)

    def device_grad(self, u: int, m: int) -> str:
        b = self.bufs
        return b.declare(f"dgrad.{b.unit_label(u)}.m{m}", Space.DEVICE, Holds.DEVICE_GRAD, (self.params(u),),
                         self.zero3.compute_dtype, role="grads", unit=u, micro=m)

    def host_grad(self, u: int) -> str:
        """DeepSpeed's fp32 gradient partition on the host: static, every step."""
        b = self.bufs
        n = self.params(u) if u != self.head or not self.model.tied_embeddings else self.model.head_params
        return b.declare(f"hgrad.{b.unit_label(u)}", Space.HOST, Holds.HOST_GRAD, (n,), "fp32", True, "grads", unit=u)

    # ---- fetch and release ----------------------------------------------------------------------------
    def fetch(self, u: int, m: int) -> None:
        """Unit u's parameters to the device before its next compute op: up to the prefetch
        bucket while the compute op before that one runs, the rest once it is done."""
        if u in self.fetched:
            return
        n, elem = self.params(u), self.a
        early = min(n, self.zero3.prefetch_bucket_params)
        k = len(self.compute_ends)
        before_prev = (self.compute_ends[k - 2],) if k >= 2 else ()
        prev = (self.compute_ends[k - 1],) if k >= 1 else ()
        src = self.partition(u)
        # per tensor: the early group carries its share of the unit's tensors (at least one)
        t = tensors(self.model, u) if self.zero3.per_tensor_fetch else 1
        t_early = t if n == early else min(t - 1, max(1, round(t * early / n)))
        ids = [self.emit(OpKind.LOAD_WEIGHTS, u, m, reads=[src], writes=[self.w(u)], link_bytes=early * elem,
                         copies=t_early, after=before_prev)]
        if n > early:  # on demand, at the unit's own hook: after the host is back from the last offload
            ids.append(self.emit(OpKind.LOAD_WEIGHTS, u, m, reads=[src, self.w(u)], writes=[self.w(u)],
                                 link_bytes=(n - early) * elem, copies=max(1, t - t_early),
                                 after=(*prev, *self.host_blocked_by())))
        self.copies_of[u] = ids
        self.fetched.add(u)

    def hooks(self, us: tuple[int, ...], m: int, calls: int, grad_tensor_ops: int = 0) -> tuple[int, ...]:
        """The host's fixed cost before the compute op on units `us` is issued: `calls` hook calls
        on each of their modules, tensor_op_us for each tensor fetched for it and
        `grad_tensor_ops` calls per tensor on its gradients. Returns what the compute op waits
        for (nothing when the hooks cost nothing). With sync_per_wait the hooks start once the
        units' copies have landed: the host sits in the wait until then."""
        z, mdl = self.zero3, self.model
        fetched = [u for u in us if u in self.copies_of]
        fetch_calls = sum(tensors(mdl, u) if z.per_tensor_fetch else 1 for u in fetched)
        grad_calls = grad_tensor_ops * sum(tensors(mdl, u) for u in us)
        fixed = sum(modules(mdl, u) for u in us) * calls * z.hook_us + (fetch_calls + grad_calls) * z.tensor_op_us
        if fixed <= 0:
            return ()
        wait = [i for u in fetched for i in self.copies_of[u]] if z.sync_per_wait else []
        op = self.emit(OpKind.HOOKS, us[-1], m, after=tuple(wait), fixed_us=fixed)
        for u in fetched:
            del self.copies_of[u]
        return (op,)

    def keep_after_forward(self, u: int) -> bool:
        """DeepSpeed keeps a fetched parameter whose next use comes within max_reuse_distance
        parameters' worth of fetches (and within max_live_params): the layers near the head
        (their backward comes right after), or every layer of a small model. The distance is
        counted along its recorded trace of module visits (partitioned_param_coordinator.py
        __params_to_release: the parameters of every module visit from the next one on, until
        the count reaches the limit; v0.7.0 l.445-451, 0.19.8 l.656-662), and the trace records
        a visit at every forward and every backward hook (parameter_offload.py record_module in
        pre_sub_module_forward_function and pre_sub_module_backward_function, v0.7.0
        l.445-482): the head once more in the backward, and each later layer twice with
        activation checkpointing (the recompute runs its forward hooks again before its
        backward ones)."""
        if u == EMBED:  # its next use is the layer-0 backward's scatter, which needs no parameters
            return False
        visits = 2 if self.zero3.act_ckpt else 1
        between = sum(self.params(v) for v in range(u + 1, self.head + 1)) + self.params(self.head)
        between += visits * sum(self.params(v) for v in range(u + 1, self.head))  # the backward's, before u's
        live = sum(self.params(v) for v in self.fetched)
        return between < self.zero3.max_reuse_distance_params and live <= self.zero3.max_live_params

    def release(self, u: int) -> list[str]:
        """Unit u's fetched parameters go after the op that frees them (it lists the names)."""
        self.fetched.discard(u)
        return [self.w(u)]

    # ---- gradients ------------------------------------------------------------------------------------
    def host_blocked_by(self) -> tuple[int, ...]:
        """What the host thread sits in before it can issue more: with pageable gradient buffers
        (pin_memory off) the last offload, whose copies to and from pageable memory return only
        once done (Zero3Policy.pin_memory); pinned, nothing."""
        return tuple(self.offloads[-1:]) if not self.zero3.pin_memory else ()

    def gather_grad(self, u: int, m: int, last: bool) -> None:
        if u == self.head and self.holds_tied_head_grad:
            self.held.append((u, self.device_grad(u, m)))
            return
        if u == EMBED:
            self.bucket += self.held
            self.held = []
        self.bucket.append((u, self.device_grad(u, m)))
        if last or sum(self.grad_params(v) for v, _ in self.bucket) >= self.zero3.reduce_bucket_params:
            self.offload(m)

    def offload(self, m: int) -> None:
        """The bucket's gradients -> their fp32 host partitions (the module docstring's 'copies'
        say how many bytes cross, and where they are cast), added into what earlier micro-batches
        left there; with pin_memory off at the link's pageable rate (Op.pageable)."""
        if not self.bucket:
            return
        units = [u for u, _ in self.bucket]
        dgrads = [g for _, g in self.bucket]
        n = sum(self.grad_params(u) for u in units)
        acc = m > 0
        last = m == self.zero3.micro_batches - 1
        z = self.zero3
        hg = [self.host_grad(u) for u in units]
        writes = hg + ([self.bufs.grad_sq(u) for u in units] if last else [])
        if z.overlap_comm and len(self.offloads) >= self.reduce_window:
            self.stall = (self.offloads[-self.reduce_window],)  # reduce_window's docstring
        reads = dgrads + (hg if acc else []) + [self.ipg_bucket()]
        t = sum(tensors(self.model, u) for u in units)
        norm = n * 4 if last and z.per_param_norm else 0  # _constant_buffered_norm2 of each fp32 gradient
        pageable = not z.pin_memory
        ws = partition_grads_temporaries(self.model, self.zero3, units, last)
        weights = self.embedding_backward_fetch() if EMBED in units else []
        if z.fp32_grad_copy:
            # fp32_grad_copy's docstring: down into the pinned partition, back up (before the add
            # when accumulating), and at the boundary down again into the optimizer's gradient:
            # cast on the device, 4 bytes, or (host_cast_at_boundary) a bytes cast by the host
            host_cast = last and z.host_cast_at_boundary
            boundary = (n * (self.a if host_cast else 4)) if last else 0
            self.emit(OpKind.OFFLOAD_GRADS, units[0], m, reads=reads, writes=writes, frees=dgrads + weights,
                      link_bytes=n * self.a + boundary, copies=t * (2 if last else 1), reduce_bytes=norm,
                      host_bytes=n * (self.a + 4) if host_cast else 0, fault_bytes=n * self.a if host_cast else 0,
                      workspace_bytes=ws, pageable=pageable)
            done = self.emit(OpKind.RELOAD_GRADS, units[0], m, reads=hg, writes=hg, link_bytes=n * self.a, copies=t,
                             pageable=pageable)
        else:
            done = self.emit(OpKind.OFFLOAD_GRADS, units[0], m, reads=reads, writes=writes, frees=dgrads + weights,
                             link_bytes=n * 4, host_bytes=n * 12 if acc else 0, reduce_bytes=norm,
                             workspace_bytes=ws, pageable=pageable)
        self.offloads.append(done)
        self.bucket = []

    def ipg_bucket(self) -> str:
        """DeepSpeed's contiguous gradient bucket, allocated once at start-up and kept (stage3.py:
        `bucket.buffer = torch.empty(self.reduce_bucket_size, ...)` when contiguous_gradients,
        which ds_config sets), in the compute dtype. Counted up to the model's size: a GPU
        reserves all of it, but only a model smaller than the bucket can tell, and that is where
        the CPU accelerator (the peer's real runs here) never touches, so never makes resident,
        the rest."""
        n = min(self.zero3.reduce_bucket_params, sum(self.params(u) for u in self.units))
        return self.bufs.declare("ipg_bucket", Space.DEVICE, Holds.GRAD_BUCKET, (n,), self.zero3.compute_dtype, True,
                                 "grads")

    # ---- the phases ---------------------------------------------------------------------------------
    def forward(self, m: int) -> None:
        b, L = self.bufs, self.model.n_layers
        a, mb, seq = self.a, self.zero3.micro_batch, self.zero3.seq
        fwd_hbm = {s: work.block_elementwise_bytes(s, self.tokens, seq, a, backward=False) for s, _ in self.model.block_shapes}
        ws = {s: work.block_workspace_bytes(s, mb, seq, a, backward=False) for s, _ in self.model.block_shapes}
        self.fetch(EMBED, m)
        for u in range(L):
            bs = self.model.block_spec(u)
            self.fetch(u, m)
            hooked = self.hooks((EMBED, u) if u == 0 else (u,), m, calls=2)  # pre- and post-forward
            reads = [self.w(u)] + ([b.activation(m, u)] if u > 0 else [self.w(EMBED)])
            frees = ([b.activation(m, u)] if u > 0 else [])
            if u == 0:
                frees += self.release(EMBED)
            if not self.keep_after_forward(u):
                frees += self.release(u)
            self.emit(OpKind.FORWARD, u, m, reads=reads, writes=[b.activation(m, u + 1), self.saved(m, u)], frees=frees,
                      flops=bs.layer_fwd_flops(self.tokens, seq), hbm_bytes=fwd_hbm[bs], workspace_bytes=ws[bs],
                      after=hooked)
        self.fetch(self.head, m)
        tok = self.tokens
        hooked = self.hooks((self.head,), m, calls=4, grad_tensor_ops=self.grad_tensor_ops(m))  # forward and backward
        self.emit(OpKind.HEAD, self.head, m, reads=[b.activation(m, L), self.w(self.head)],
                  writes=[b.activation_grad(m, L), self.device_grad(self.head, m)], frees=[b.activation(m, L), *self.release(self.head)],
                  flops=3 * self.model.head_fwd_flops(tok), hbm_bytes=work.head_elementwise_bytes(self.model, tok, a),
                  workspace_bytes=work.head_workspace_bytes(self.model, tok, tok, a), after=hooked)
        self.gather_grad(self.head, m, last=False)

    def backward(self, m: int) -> None:
        b, L, zero3 = self.bufs, self.model.n_layers, self.zero3
        a, mb, seq = self.a, zero3.micro_batch, zero3.seq
        per = {}
        for bs, _ in self.model.block_shapes:
            full_ws = work.block_workspace_bytes(bs, mb, seq, a, backward=True)
            saved_b = work.block_saved_bytes(bs, mb, seq, a)
            # the graph's backward holds its transients only: what the forward saved is a buffer
            per[bs] = dict(hbm=work.block_elementwise_bytes(bs, self.tokens, seq, a, backward=True),
                           ws=full_ws if zero3.act_ckpt else max(0, full_ws - saved_b),
                           flops=(3 if zero3.act_ckpt else 2) * bs.layer_fwd_flops(self.tokens, seq))
        kind = OpKind.BACKWARD if zero3.act_ckpt else OpKind.BACKWARD_SAVED
        for u in reversed(range(L)):
            bwd_hbm, ws, flops = (per[self.model.block_spec(u)][k] for k in ("hbm", "ws", "flops"))
            self.fetch(u, m)
            if u == 0:  # the embedding's pre-backward hook fetches its weight (embedding_backward_fetch)
                self.fetch(EMBED, m)
            # pre- and post-backward, and the recompute's forward pair; layer 0 also makes the embedding's grad
            hooked = self.hooks((u, EMBED) if u == 0 else (u,), m, calls=4 if zero3.act_ckpt else 2,
                                grad_tensor_ops=self.grad_tensor_ops(m))
            writes = [self.device_grad(u, m)] + ([b.activation_grad(m, u)] if u > 0 else [self.device_grad(EMBED, m)])
            if not zero3.overlap_comm:
                after = self.offloads[-1:]
            elif not zero3.pin_memory:  # the host is in the last offload's pageable copies until they end
                after, self.stall = self.host_blocked_by(), ()
            else:
                after, self.stall = self.stall, ()
            after = (*after, *hooked)
            self.emit(kind, u, m, reads=[self.saved(m, u), b.activation_grad(m, u + 1), self.w(u)], writes=writes,
                      frees=[self.saved(m, u), b.activation_grad(m, u + 1), *self.release(u)], flops=flops,
                      hbm_bytes=bwd_hbm, workspace_bytes=ws, after=tuple(after))
            self.gather_grad(u, m, last=False)
        self.gather_grad(EMBED, m, last=True)

    def embedding_backward_fetch(self) -> list[str]:
        """The embedding's weight, fetched again for its backward, which reads only the token
        ids: DeepSpeed hooks the pre-backward of every module (parameter_offload.py
        _pre_backward_module_hook on the module's outputs, v0.7.0 l.375-392; 0.19.8 the same),
        and the post-backward hook that would release it hangs off the module's inputs, which for
        an embedding need no gradient, so it stays until the gradients have gone (the step's
        partition_all_parameters). Returns what the last offload frees with it."""
        return self.release(EMBED) if EMBED in self.fetched else []

    def grad_tensor_ops(self, m: int) -> int:
        """Eager calls partition_grads makes per gradient tensor in micro-batch m: the copy into
        the host partition, its `.to(device)` back (fp32_grad_copy), the boundary copy and the
        per-parameter norm (per_param_norm, last micro-batch)."""
        z, last = self.zero3, m == self.zero3.micro_batches - 1
        return 1 + (1 + last if z.fp32_grad_copy else 0) + (1 if z.per_param_norm and last else 0)

    def grad_norm(self) -> None:
        """The global norm; with per_param_norm DeepSpeed sums the per-tensor norms in a Python
        loop (complete_grad_norm_calculation_for_cpu_offload: a square and an add per tensor)."""
        b = self.bufs
        loop = 2 * sum(tensors(self.model, u) for u in self.units) * self.zero3.tensor_op_us \
            if self.zero3.per_param_norm else 0.0
        self.emit(OpKind.GRAD_NORM, -1, reads=[b.grad_sq(u) for u in self.units], writes=[b.grad_norm_scalar()],
                  host_bytes=8 * len(self.units), fixed_us=loop)

    def end(self) -> None:
        """The global norm, then per unit DeepSpeed's three host passes: the unscale of the fp32
        gradients, DeepSpeedCPUAdam, the cast into the partition the next step fetches."""
        b = self.bufs
        self.grad_norm()
        for u in self.units:
            params, hg = self.bufs.buffers[self.host_grad(u)].numel, self.host_grad(u)
            store = b.host_store(u)[:2]
            self.emit(OpKind.HOST_PASS, u, reads=[hg, b.grad_norm_scalar()], writes=[hg],
                      host_bytes=params * UNSCALE_BYTES_PER_PARAM)
            self.emit(OpKind.OPTIMIZER, u, reads=[hg, *store], writes=store, params=params,
                      host_bytes=params * ADAM_BYTES_PER_PARAM)
            self.emit(OpKind.HOST_PASS, u, reads=store[:1], writes=[self.partition(u)],
                      host_bytes=params * cast_bytes_per_param(self.a))

    def build(self) -> Schedule:
        m, zero3 = self.model, self.zero3
        self.bufs.device_constants()
        self.ipg_bucket()
        for u in self.units:  # the host store first, in the units' order
            self.bufs.host_store(u)
            self.partition(u)
            self.host_grad(u)
        declare_host_extras(self.bufs, zero3, self.units)
        for mb in range(zero3.micro_batches):
            self.forward(mb)
            self.backward(mb)
        self.end()
        p = self.policy
        return self.schedule(slot_bytes=0, model_flops=m.model_flops_per_token(p.seq, p.context_tokens) * p.tokens)


def build_zero3_schedule(model: ModelSpec, zero3: Zero3Policy, synchronous: bool = False) -> Schedule:
    """One step of DeepSpeed ZeRO-3 offload on one device (module docstring), checked; with
    offload_param off, ZeRO-2 offload's (zero2_builder.py).
    synchronous: every op waits for the one before it, as on DeepSpeed's CPU accelerator, whose
    streams are no-ops (its copies, compute and CPU Adam run one after another in one thread)."""
    if not isinstance(zero3, Zero3Policy):
        raise HorizonError(f"zero3 policy {zero3!r} is not a Zero3Policy")
    if not zero3.offload_param:
        if synchronous:
            raise HorizonError("the ZeRO-2 offload peer is planned on a GPU only; DeepSpeed's CPU accelerator "
                               "runs are ZeRO-3's (validate --peer zero3-offload)")
        from horizon_sim.peer.zero2_builder import build_zero2_schedule
        return build_zero2_schedule(model, zero3)
    if synchronous:
        zero3 = zero3.on_cpu_accelerator()
    return Zero3StepBuilder(model, zero3, synchronous).build().check()
