"""Zero2StepBuilder: one training step of DeepSpeed ZeRO-2 offload on one GPU (stage 2 with
offload_optimizer, no offload_param: Zero3Policy(offload_param=False), the family zero2-offload),
in the ZeRO-3 peer's vocabulary. What differs from ZeRO-3 offload (zero3_builder.py):

  device    every parameter, in the compute dtype, for the whole step (DEVICE_PARAMS, static):
            nothing is fetched or released; the reduce buckets (two of reduce_bucket_params with
            overlap_comm, one without: stage_1_and_2.py setup_buckets), which hold the gradients
            (each parameter's hook copies its gradient in as autograd makes it: autograd's own
            tensor lives only until then and is not counted); activations as ZeRO-3
  hooks     no module hooks: a gradient hook per parameter (the copy into the bucket) and, at
            the reduce, per tensor the fp32 cast, its copy to the host and the norm, each an
            eager call (tensor_op_us)
  gradients per reduce bucket, as under ZeRO-3, into the fp32 host gradient (4 bytes a
            parameter over the link, cast on the device: async_inplace_copy_grad_to_fp32_
            buffer_from_gpu); with several micro-batches (fp32_grad_copy) each also goes down in
            the compute dtype into a host accumulation buffer and the next micro-batch's comes
            back up to be added on the device (async_accumulate_grad_in_cpu_via_gpu). The
            backward that writes into a bucket again waits for the offload that read it last
  end       the global norm, DeepSpeedCPUAdam over every unit, then the updated parameters to
            the device (UPLOAD_PARAMS): DeepSpeed 0.19 casts them on the host into a pinned
            buffer in the compute dtype once the whole group's Adam is done and copies it
            (adam_copies_params off); DeepSpeed of 2020-21 copied each tile from inside the Adam
            while it updated the next (on). The next step's forward reads them: the step ends
            when they have landed.

Host memory: fp32 master, moments and gradient (16 bytes a parameter), plus the compute-dtype
buffer of 0.19's cast (2 with bf16; none with adam_copies_params) and, with several
micro-batches and fp32_grad_copy, the accumulation buffer in the compute dtype; and what the
knobs adam_tile_params and fork_copies add (peer/host_extras.py).
"""
from horizon_sim.peer.host_extras import declare_host_extras
from horizon_sim.peer.zero3_builder import Zero3StepBuilder
from horizon_sim.peer.zero3_counts import tensors
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.schedule.op import EMBED, Family, Holds, OpKind, Space
from horizon_sim.schedule.schedule import Schedule
from horizon_sim.specs.model import ModelSpec

ZERO2_BUCKETS = 2
"""DeepSpeed 0.19 stage 2 with overlap_comm and contiguous_gradients (stage_1_and_2.py
setup_buckets): two gradient buffers of reduce_bucket_size, used in turn; before gradients go
into one, the compute stream waits for the reuse event of the offload that last read it
(without overlap_comm: one buffer, the same wait)."""

ADAM_BYTES_PER_PARAM = 4 + 2 * 4 + 4 * 4
"""DeepSpeedCPUAdam per parameter with nothing else written: read the fp32 gradient, read and
write the fp32 master and both fp32 moments (the tiled copy writes the compute-dtype value too)."""


class Zero2StepBuilder(Zero3StepBuilder):
    family = Family.ZERO2_OFFLOAD

    def __init__(self, model: ModelSpec, zero2: Zero3Policy):
        super().__init__(model, zero2)
        self.current = 0  # the bucket gradients go into now
        self.bucket_elems = 0
        self.grad_target: dict[tuple[int, int], str] = {}  # (unit, micro-batch) -> where its gradients are

    # ---- sizes and buffers ------------------------------------------------------------------------
    def params(self, u: int) -> int:
        """Parameters of unit u as DeepSpeed holds them: the model's own tensors, a tied LM head's
        matrix once (it is the embedding's, and its gradient is the embedding's)."""
        return self.bufs.host_params(u)

    def w(self, u: int) -> str:
        b = self.bufs
        return b.declare(f"params.{b.unit_label(u)}", Space.DEVICE, Holds.DEVICE_PARAMS, (self.params(u),),
                         self.zero3.compute_dtype, True, "weights", unit=u)

    def cast_buffer(self, u: int) -> str:
        """DeepSpeed 0.19's pinned host buffer the updated parameters are cast into before their
        copy (param_buffer_of_bit16_for_cpu_offload_groups), in the compute dtype."""
        b = self.bufs
        if self.bf16:
            return b.weights_of(u)
        return b.declare(f"cast.{b.unit_label(u)}", Space.HOST, Holds.WORKING_COPY, (self.params(u),), "fp32",
                         True, "working_copy", unit=u)

    def host_acc(self, u: int) -> str:
        """The compute-dtype host buffer micro-batches' gradients are accumulated through
        (accumulated_grads_in_cpu, pinned), with several micro-batches and fp32_grad_copy."""
        b = self.bufs
        return b.declare(f"hacc.{b.unit_label(u)}", Space.HOST, Holds.HOST_GRAD_ACC, (self.params(u),),
                         self.zero3.compute_dtype, True, "grads", unit=u)

    def ipg_bucket(self, i: int = 0) -> str:
        """Gradient buffer i (ZERO2_BUCKETS' docstring), reduce_bucket_params in the compute
        dtype (at most the model's size, as ZeRO-3's: zero3_builder.ipg_bucket), static."""
        z = self.zero3
        n = min(z.reduce_bucket_params, sum(self.params(u) for u in self.units))
        return self.bufs.declare(f"ipg_bucket.{i}", Space.DEVICE, Holds.GRAD_BUCKET, (n,), z.compute_dtype, True,
                                 "grads", layer=i)  # `layer` tells the buffers apart, as weight slots

    @property
    def accumulates_on_device(self) -> bool:
        return self.zero3.micro_batches > 1 and self.zero3.fp32_grad_copy

    # ---- nothing is fetched ------------------------------------------------------------------------
    def fetch(self, u: int, m: int) -> None:
        return

    def release(self, u: int) -> list[str]:
        return []

    def keep_after_forward(self, u: int) -> bool:
        return True

    def hooks(self, us: tuple[int, ...], m: int, calls: int, grad_tensor_ops: int = 0) -> tuple[int, ...]:
        """No module hooks: only the eager calls on each gradient tensor (grad_tensor_ops)."""
        fixed = grad_tensor_ops * sum(tensors(self.model, u) for u in us) * self.zero3.tensor_op_us
        if fixed <= 0:
            return ()
        return (self.emit(OpKind.HOOKS, us[-1], m, fixed_us=fixed),)

    def grad_tensor_ops(self, m: int) -> int:
        """Eager calls per gradient tensor in micro-batch m: the copy into the bucket; with
        accumulation its copy down and (after the first micro-batch) the copy up and the add; at
        the boundary the fp32 cast and its copy down, and the norm (per_param_norm)."""
        z, last = self.zero3, m == self.zero3.micro_batches - 1
        acc = (1 + 2 * (m > 0)) if self.accumulates_on_device else 0
        return 1 + acc + (2 + z.per_param_norm if last else 0)

    # ---- gradients ------------------------------------------------------------------------------------
    def device_grad(self, u: int, m: int) -> str:
        """Where unit u's gradients of micro-batch m go: the current bucket (its gradient hooks
        copy each one in as autograd makes it), after flushing the bucket when they would not
        fit (reduce_independent_p_g_buckets_and_remove_grads). A unit larger than a bucket keeps
        its own gradient until its offload (DeepSpeed's extra-large parameters)."""
        key = (u, m)
        if key in self.grad_target:
            return self.grad_target[key]
        n, cap = self.params(u), self.zero3.reduce_bucket_params
        if self.bucket and self.bucket_elems + n > cap:
            self.offload(m)
        name = super().device_grad(u, m) if n > cap else self.ipg_bucket(self.current)
        self.grad_target[key] = name
        return name

    def gather_grad(self, u: int, m: int, last: bool) -> None:
        self.bucket.append((u, self.device_grad(u, m)))
        self.bucket_elems += self.params(u)
        if last:
            self.offload(m)

    def offload(self, m: int) -> None:
        """The bucket's gradients to the host (module docstring, 'gradients'); the next ones go
        into the other buffer, and the backward that writes into this one again waits for this
        offload (its data dependency: the reuse event)."""
        if not self.bucket:
            return
        z = self.zero3
        units = [u for u, _ in self.bucket]
        srcs = list(dict.fromkeys(g for _, g in self.bucket))
        own = [g for g in srcs if self.bufs.buffers[g].holds == Holds.DEVICE_GRAD]
        n = sum(self.params(u) for u in units)
        last = m == z.micro_batches - 1
        hg = [self.host_grad(u) for u in units]
        sq = [self.bufs.grad_sq(u) for u in units] if last else []
        t = sum(tensors(self.model, u) for u in units)
        pageable = not z.pin_memory  # every host buffer of stage_1_and_2.py is pinned only with pin_memory
        # at the boundary, on the device: the norm of each compute-dtype gradient, the fp32 cast
        reduce = (n * self.a * z.per_param_norm + n * (self.a + 4)) if last else 0
        if self.accumulates_on_device:
            acc = [self.host_acc(u) for u in units]
            if m > 0:  # the sum so far comes up and is added on the device
                self.emit(OpKind.RELOAD_GRADS, units[0], m, reads=acc + srcs, writes=srcs, link_bytes=n * self.a,
                          copies=t, pageable=pageable)
            done = self.emit(OpKind.OFFLOAD_GRADS, units[0], m, reads=srcs, writes=acc + (hg if last else []) + sq,
                             frees=own, link_bytes=n * self.a + (n * 4 if last else 0),
                             copies=t * (2 if last else 1), reduce_bytes=reduce, pageable=pageable)
        else:  # one fp32 copy down per micro-batch, added on the host after the first
            done = self.emit(OpKind.OFFLOAD_GRADS, units[0], m, reads=srcs + (hg if m > 0 else []), writes=hg + sq,
                             frees=own, link_bytes=n * 4, host_bytes=n * 12 if m > 0 else 0, reduce_bytes=reduce,
                             pageable=pageable)
        self.offloads.append(done)
        self.bucket, self.bucket_elems = [], 0
        if z.overlap_comm:
            self.current = (self.current + 1) % ZERO2_BUCKETS

    # ---- the optimizer and the way back --------------------------------------------------------------
    def end(self) -> None:
        b, z = self.bufs, self.zero3
        self.grad_norm()
        per = ADAM_BYTES_PER_PARAM + (self.a if z.adam_copies_params else 0)
        adam = []
        for u in self.units:
            params = self.params(u)
            store = b.host_store(u)[:2]
            adam.append(self.emit(OpKind.OPTIMIZER, u, reads=[self.host_grad(u), *store, b.grad_norm_scalar()],
                                  writes=store, params=params, host_bytes=params * per))
        for u in self.units:
            params, master = self.params(u), b.host_store(u)[0]
            if z.adam_copies_params:  # the tile goes while the Adam updates the next (its data dependency)
                self.emit(OpKind.UPLOAD_PARAMS, u, reads=[master], writes=[self.w(u)], link_bytes=params * self.a,
                          pageable=not z.pin_memory)
            else:  # once the group's Adam is done: the cast pass on the host, then the copy
                self.emit(OpKind.UPLOAD_PARAMS, u, reads=[master], writes=[self.cast_buffer(u), self.w(u)],
                          link_bytes=params * self.a, host_bytes=params * (4 + self.a), after=tuple(adam),
                          pageable=not z.pin_memory)

    def build(self) -> Schedule:
        m, z = self.model, self.zero3
        self.bufs.device_constants()
        for i in range(ZERO2_BUCKETS if z.overlap_comm else 1):
            self.ipg_bucket(i)
        for u in self.units:  # the host store first, in the units' order, then the device's copy
            self.bufs.host_store(u)
            if not z.adam_copies_params:
                self.cast_buffer(u)
            self.host_grad(u)
            if self.accumulates_on_device:
                self.host_acc(u)
            self.w(u)
        declare_host_extras(self.bufs, z, self.units)
        for mb in range(z.micro_batches):
            self.forward(mb)
            self.backward(mb)
        self.end()
        p = self.policy
        return self.schedule(slot_bytes=0, model_flops=m.model_flops_per_token(p.seq, p.context_tokens) * p.tokens)


def build_zero2_schedule(model: ModelSpec, zero2: Zero3Policy) -> Schedule:
    """One step of DeepSpeed ZeRO-2 offload on one device (module docstring), checked."""
    return Zero2StepBuilder(model, zero2).build().check()
