"""build_schedule(model, policy): the one function that turns a model and a policy into the
ops of one training step.

Loop structure (per micro-batch m, blocks of K layers):
  forward : embed rows on the host -> load input -> for each block layer: [load weights]
            forward (no autograd), keep every K-th boundary (on device, or saved to host)
  head    : final norm + LM head + chunked loss, forward and backward in one op
  backward: blocks in reverse: [load checkpoint] -> recompute the block's inner boundaries ->
            layers in reverse: [load weights] backward (forward-with-grad + autograd.grad) ->
            offload grads (-> optimizer for this layer, in 'backward' mode)
  embedding grad on the host.
The optimizer runs after backward ('after'), per layer in backward ('backward'), or at the
start of the next step just before each layer's forward load ('pipelined', the previous
step's gradients: those ops carry prev_step=True).

Dependencies are not written by hand: each op declares the buffers it reads, writes and
frees, and `_Deps` derives RAW/WAR/WAW waits (keeping one per other lane, since lanes are
FIFO). The only waits added by hand are backpressure: a FORWARD or BACKWARD waits until at
most PENDING_D2H device->host transfers that free device memory are still in flight, so a
slow link cannot let device memory grow with depth. Weight slots are assigned by Belady's rule (evict the unit whose next use is furthest)
but never the slot the previous compute op is using, so a load always overlaps compute; a
unit still resident is not loaded again, which saves link traffic when K > 1 or slots > 2.
"""
from collections import defaultdict
from dataclasses import dataclass

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import work
from horizon_sim.schedule.limits import check_sizes
from horizon_sim.schedule.op import (
    DTYPE_BYTES_OF,
    EMBED,
    LANE_OF,
    Buffer,
    Holds,
    Op,
    OpKind,
    ScheduleMeta,
    Space,
)
from horizon_sim.schedule.schedule import Schedule
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import DTYPE_BYTES, Policy

K_ = OpKind
_INF = float("inf")
PENDING_D2H = 2


@dataclass(frozen=True, slots=True)
class _Use:
    """One compute op of the step, before emission."""
    kind: OpKind
    unit: int
    micro: int
    block_start: int | None = None  # backward: first compute op of the block starting here


class _Deps:
    """Derives an op's dependencies from its buffer accesses, in program order."""

    def __init__(self):
        self.lane_of: list = []
        self.last_write: dict[str, int] = {}
        self.reads_since: dict[str, list[int]] = defaultdict(list)
        self.accesses: dict[str, list[int]] = defaultdict(list)

    def add(self, op_id, kind, reads, writes, frees, extra=()) -> tuple[int, ...]:
        need: set[int] = set(extra)
        for n in reads:
            if n in self.last_write:
                need.add(self.last_write[n])
        for n in writes:
            need.update(self.reads_since[n])
            if n in self.last_write:
                need.add(self.last_write[n])
        for n in frees:
            need.update(self.accesses[n])
        lane = LANE_OF[kind]
        latest: dict = {}
        for d in need:  # same-lane waits are implied by FIFO; per other lane the latest suffices
            if d != op_id and self.lane_of[d] != lane and d > latest.get(self.lane_of[d], -1):
                latest[self.lane_of[d]] = d
        self.lane_of.append(lane)
        for n in reads:
            self.reads_since[n].append(op_id)
            self.accesses[n].append(op_id)
        for n in writes:
            self.last_write[n] = op_id
            self.reads_since[n] = []
            self.accesses[n].append(op_id)
        for n in frees:  # a later write starts a new lifetime with no history
            self.last_write.pop(n, None)
            self.reads_since.pop(n, None)
            self.accesses.pop(n, None)
        return tuple(sorted(latest.values()))


class _Builder:
    def __init__(self, model: ModelSpec, policy: Policy):
        check_sizes(model, policy)  # before any work that grows with the sizes
        if policy.act_ckpt_every > model.n_layers:
            raise HorizonError(f"policy act_ckpt_every={policy.act_ckpt_every} is larger than the model's "
                               f"{model.n_layers} layers; use 1..{model.n_layers}")
        self.m, self.p = model, policy
        self.L = model.n_layers
        self.HEAD = self.L
        self.act = DTYPE_BYTES[policy.compute_dtype]
        self.master_b = DTYPE_BYTES[policy.master_dtype]
        self.state_b = DTYPE_BYTES[policy.states_dtype]
        self.link_grad_b = DTYPE_BYTES[policy.grad_dtype]
        # Host grads accumulate over micro-batches in fp32; otherwise they stay as they arrive.
        self.host_grad_dtype = "fp32" if policy.micro_batches > 1 else policy.grad_dtype
        self.host_grad_b = DTYPE_BYTES[self.host_grad_dtype]
        self.tok = policy.micro_batch * policy.seq
        self.units = [EMBED, *range(self.L), self.HEAD]
        self.slot_bytes = max(model.layer_params, model.head_device_params) * self.act
        self.ops: list[Op] = []
        self.buffers: dict[str, Buffer] = {}
        self.deps = _Deps()
        self.wsrc = "wc" if policy.working_copy else "master"
        self.grads_static = policy.optimizer == "pipelined"  # they cross the step boundary
        self.optimized: set[int] = set()
        # Device->host transfers free device memory when they finish. If the link lags, the
        # compute lane must not run ahead and pile up their buffers (memory would then grow
        # with depth): a new producer waits until at most PENDING_D2H of them are in flight.
        self.pending_saves: list[int] = []
        self.pending_offloads: list[int] = []

    # ---- sizes ------------------------------------------------------------------------
    def host_params(self, u):
        m = self.m
        return m.embedding_params if u == EMBED else m.head_params if u == self.HEAD else m.layer_params

    def dev_params(self, u):
        return self.m.head_device_params if u == self.HEAD else self.m.layer_params

    def _name(self, u):
        return {EMBED: "emb", self.HEAD: "head"}.get(u, str(u))

    # ---- buffers ----------------------------------------------------------------------
    def buf(self, name, space, holds, shape, dtype, static=False, role="", *, unit=None, micro=None,
            layer=None, dma_only=False):
        """Declare a buffer once (its name is for display; readers use the typed fields) and
        return its name, which ops list."""
        if name not in self.buffers:
            shape = tuple(int(d) for d in shape)
            n = 1
            for d in shape:
                n *= d
            pooled = space == Space.HOST and not static  # the executor's exact-size host pool
            self.buffers[name] = Buffer(name, space, n * DTYPE_BYTES_OF[dtype], static, role, holds, unit, micro,
                                        layer, shape, dtype, pooled, dma_only)
        return name

    def _rows(self):  # (micro_batch, seq, hidden): an activation-sized buffer
        return (self.p.micro_batch, self.p.seq, self.m.hidden)

    def x(self, m, l):  # boundary activation entering block l (l = L: entering the head)
        return self.buf(f"x.m{m}.{l}", Space.DEVICE, Holds.ACTIVATION, self._rows(), self.p.compute_dtype,
                        role="activations", micro=m, layer=l)

    def dx(self, m, l):
        return self.buf(f"dx.m{m}.{l}", Space.DEVICE, Holds.ACTIVATION_GRAD, self._rows(), self.p.compute_dtype,
                        role="activations", micro=m, layer=l)

    def hgrad(self, u):
        # A tied embedding's grad sums the LM head's and the scatter-add's: keep it in fp32.
        dtype = "fp32" if u == EMBED and self.m.tied_embeddings else self.host_grad_dtype
        return self.buf(f"hgrad.{self._name(u)}", Space.HOST, Holds.HOST_GRAD, (self.host_params(u),), dtype,
                        static=self.grads_static, role="grads", unit=u)

    def host_store(self, u):
        """Static host buffers of a unit: master, moments, optional working copy."""
        n, p, pol = self._name(u), self.host_params(u), self.p
        names = [self.buf(f"master.{n}", Space.HOST, Holds.MASTER, (p,), pol.master_dtype, True, "master", unit=u),
                 self.buf(f"moments.{n}", Space.HOST, Holds.MOMENTS, (2, p), pol.states_dtype, True, "moments",
                          unit=u)]
        if pol.working_copy:
            names.append(self.buf(f"wc.{n}", Space.HOST, Holds.WORKING_COPY, (p,), pol.compute_dtype, True,
                                  "working_copy", unit=u))
        return names

    def gsq(self, u):
        return self.buf(f"gsq.{self._name(u)}", Space.HOST, Holds.GRAD_SQ, (1,), "fp64", True, "scalars", unit=u)

    def gnorm(self):
        return self.buf("gnorm", Space.HOST, Holds.GRAD_NORM, (1,), "fp64", True, "scalars")

    def dgrad(self, u, m):
        return self.buf(f"dgrad.{self._name(u)}.m{m}", Space.DEVICE, Holds.DEVICE_GRAD, (self.dev_params(u),),
                        self.p.compute_dtype, role="grads", unit=u, micro=m)

    def host_rows(self, name, holds, m, role, layer=None):
        return self.buf(name, Space.HOST, holds, self._rows(), self.p.compute_dtype, role=role, micro=m, layer=layer)

    def link_stage(self, target):
        """Where a DMA link lands a gradient piece that the host then adds or widens into
        `target` (the host cannot read bytes still in flight): page-locked, one per size in
        the executor's pool (horizon_exec/backend_cuda.py _through_stage)."""
        t = self.buffers[target]
        return self.buf(f"stage.{target}", Space.HOST, Holds.LINK_STAGE, t.shape, self.p.grad_dtype,
                        role="staging", unit=t.unit, dma_only=True)

    def device_constants(self):
        """Device tensors every step uses: RoPE tables, the step's labels and, under document
        masks, each token's document and position and the tables gathered at those."""
        p, m, c = self.p, self.m, dict(static=True, role="constants")
        self.buf("rope.cos", Space.DEVICE, Holds.ROPE_COS, (p.seq, m.hd), p.compute_dtype, **c)
        self.buf("rope.sin", Space.DEVICE, Holds.ROPE_SIN, (p.seq, m.hd), p.compute_dtype, **c)
        self.buf("labels", Space.DEVICE, Holds.LABELS, (p.batch, p.seq), "int64", **c)
        if p.doc_masks:
            self.buf("docs", Space.DEVICE, Holds.DOCS, (p.batch, p.seq), "int64", **c)
            self.buf("positions", Space.DEVICE, Holds.POSITIONS, (p.batch, p.seq), "int64", **c)
            rows = (p.batch, 1, p.seq, m.hd)
            self.buf("rope.cos.rows", Space.DEVICE, Holds.ROPE_COS_ROWS, rows, p.compute_dtype, **c)
            self.buf("rope.sin.rows", Space.DEVICE, Holds.ROPE_SIN_ROWS, rows, p.compute_dtype, **c)

    # ---- emission ---------------------------------------------------------------------
    def emit(self, kind, layer, micro=0, *, reads=(), writes=(), frees=(), after=(), **work):
        """Append an op; `after` adds waits that are not data hazards (backpressure)."""
        op_id = len(self.ops)
        deps = self.deps.add(op_id, kind, reads, writes, frees, extra=after)
        self.ops.append(Op(id=op_id, kind=kind, layer=layer, micro=micro, deps=deps,
                           reads=tuple(reads), writes=tuple(writes), frees=tuple(frees), **work))
        return op_id

    def optimizer(self, u, prev_step=False):
        p = self.host_params(u)
        per_param = 2 * self.master_b + 4 * self.state_b + self.host_grad_b
        per_param += self.act if self.p.working_copy else 0
        store = self.host_store(u)
        reads = [self.hgrad(u), *store[:2]]
        if self.p.clip:
            reads.append(self.gnorm())
        frees = () if self.grads_static else (self.hgrad(u),)
        self.emit(K_.OPTIMIZER, u, reads=reads, writes=store, frees=frees, params=p,
                  host_bytes=p * per_param, prev_step=prev_step)
        self.optimized.add(u)

    def weight_sources(self, u):
        units = [u] + ([EMBED] if u == self.HEAD and self.m.tied_embeddings else [])
        names = []
        for v in units:
            if self.p.optimizer == "pipelined" and v not in self.optimized:
                self.optimizer(v, prev_step=True)
            names.append(self.host_store(v)[2 if self.p.working_copy else 0])
        return names

    @staticmethod
    def _backpressure(pending: list[int]) -> tuple[int, ...]:
        """Wait for the transfer that would make PENDING_D2H + 1 outstanding."""
        return (pending[-PENDING_D2H],) if len(pending) >= PENDING_D2H else ()

    # ---- the step -----------------------------------------------------------------------
    def compute_sequence(self) -> list[_Use]:
        L, K = self.L, self.p.act_ckpt_every
        seq = []
        for m in range(self.p.micro_batches):
            seq += [_Use(K_.FORWARD, l, m) for l in range(L)]
            seq.append(_Use(K_.HEAD, self.HEAD, m))
            for s in reversed(range(0, L, K)):
                e = min(s + K, L)
                block = [_Use(K_.RECOMPUTE, j, m) for j in range(s, e - 1)]
                block += [_Use(K_.BACKWARD, j, m) for j in reversed(range(s, e))]
                seq.append(_Use(block[0].kind, block[0].unit, m, block_start=s))
                seq += block[1:]
        return seq

    def assign_slots(self, seq) -> list[tuple[int, bool]]:
        """(slot, needs_load) per compute use: Belady eviction, never the previous op's slot."""
        next_use = [_INF] * len(seq)
        seen: dict[int, int] = {}
        for i in reversed(range(len(seq))):
            next_use[i] = seen.get(seq[i].unit, _INF)
            seen[seq[i].unit] = i
        content: list[int | None] = [None] * self.p.slots
        content_next: list[float] = [_INF] * self.p.slots
        out, prev_slot = [], None
        for i, use in enumerate(seq):
            if use.unit in content:
                s, load = content.index(use.unit), False
            else:
                cands = [s for s in range(self.p.slots) if s != prev_slot]
                s = max(cands, key=lambda s: (content[s] is None, content_next[s], -s))
                load = True
            content[s], content_next[s] = use.unit, next_use[i]
            out.append((s, load))
            prev_slot = s
        return out

    def build(self) -> Schedule:
        m_, p = self.m, self.p
        L, K, tok, act, H = self.L, p.act_ckpt_every, self.tok, self.act, m_.hidden
        seq = self.compute_sequence()
        slots = self.assign_slots(seq)
        self.device_constants()
        wslot = [self.buf(f"w{s}", Space.DEVICE, Holds.WEIGHT_SLOT, (self.slot_bytes // act,), p.compute_dtype,
                          True, "weights", layer=s) for s in range(p.slots)]
        bnd = tok * H * act
        masked = [work.masked_attention(m_, u, p.seq, p.doc_masks) for u in range(L)]
        fwd_flops = [m_.layer_fwd_flops(tok, p.seq, causal=not mk) for mk in masked]
        mask_b = work.mask_bytes(p.micro_batch, p.seq, p.doc_masks)
        # Device traffic of the elementwise kernels (norms, RoPE, SiLU, residuals; GEMMs and
        # attention are costed by their FLOPs) and the temporaries each op holds at its peak,
        # counted kernel by kernel for the executor's template: see schedule/work.py.
        mb = p.micro_batch
        fwd_hbm = work.block_elementwise_bytes(m_, tok, p.seq, act, backward=False)
        bwd_hbm = work.block_elementwise_bytes(m_, tok, p.seq, act, backward=True)
        fwd_ws = [work.block_workspace_bytes(m_, mb, p.seq, act, backward=False, mask=mask_b * mk)
                  for mk in masked]
        bwd_ws = [work.block_workspace_bytes(m_, mb, p.seq, act, backward=True, attention=p.attention,
                                             mask=mask_b * mk) for mk in masked]
        head_hbm = work.head_elementwise_bytes(m_, tok, act)
        head_ws = work.head_workspace_bytes(m_, tok, p.loss_chunk_tokens, act)
        last_m = p.micro_batches - 1
        emb_src = self.host_store(EMBED)[2 if p.working_copy else 0]
        act_ckpt_on_host = p.act_ckpt_on == "host"

        def load_weights(u, s, m):
            srcs = self.weight_sources(u)
            cast_on_device = not p.working_copy and p.master_dtype != p.compute_dtype
            nbytes = self.dev_params(u) * (self.master_b if cast_on_device else act)
            self.emit(K_.LOAD_WEIGHTS, u, m, slot=s, reads=srcs, writes=[wslot[s]], link_bytes=nbytes,
                      workspace_bytes=self.dev_params(u) * self.master_b if cast_on_device else 0)

        def offload_grads(u, m):
            dgrad = self.dgrad(u, m)
            targets = [self.hgrad(u)] + ([self.hgrad(EMBED)] if u == self.HEAD and m_.tied_embeddings else [])
            acc = [t for t in targets if t in self.deps.last_write]  # accumulate into what exists
            # a piece the host adds or widens lands in a page-locked stage first (DMA links)
            stages = [self.link_stage(t) for t in targets
                      if t in acc or self.buffers[t].dtype != p.grad_dtype]
            writes = targets + ([self.gsq(u)] if m == last_m else []) + stages
            host_b = self.dev_params(u) * 8 if acc else 0  # read-add-write the fp32 host grad
            if acc and m == last_m:  # the squared norm is then taken of the accumulated host grad
                host_b += self.host_params(u) * self.host_grad_b
            self.pending_offloads.append(
                self.emit(K_.OFFLOAD_GRADS, u, m, reads=[dgrad, *acc], writes=writes, frees=[dgrad, *stages],
                          link_bytes=self.dev_params(u) * self.link_grad_b, host_bytes=host_b,
                          reduce_bytes=self.dev_params(u) * self.link_grad_b if m == last_m and not acc else 0))
            if p.optimizer == "backward" and m == last_m and u != self.HEAD:
                self.optimizer(u)

        for i, use in enumerate(seq):
            u, m = use.unit, use.micro
            s, needs_load = slots[i]
            if use.kind == K_.FORWARD and u == 0:
                if p.optimizer == "pipelined" and EMBED not in self.optimized:
                    self.optimizer(EMBED, prev_step=True)
                emb = self.host_rows(f"emb.m{m}", Holds.EMBEDDED, m, "staging")
                self.emit(K_.EMBED_FWD, EMBED, m, reads=[emb_src], writes=[emb],
                          host_bytes=tok * H * ((act if p.working_copy else self.master_b) + act))
                self.emit(K_.LOAD_INPUT, EMBED, m, reads=[emb], writes=[self.x(m, 0)], frees=[emb],
                          link_bytes=bnd)
            if use.block_start is not None and act_ckpt_on_host:
                ck = self.host_rows(f"ckpt.m{m}.{use.block_start}", Holds.ACT_CHECKPOINT, m, "act_checkpoints",
                                    layer=use.block_start)
                self.emit(K_.LOAD_CKPT, use.block_start, m, reads=[ck], writes=[self.x(m, use.block_start)],
                          frees=[ck], link_bytes=bnd)
            if needs_load:
                load_weights(u, s, m)
            w = wslot[s]
            if use.kind == K_.FORWARD:
                is_ckpt = u % K == 0
                frees = [] if is_ckpt else [self.x(m, u)]
                self.emit(K_.FORWARD, u, m, slot=s, reads=[self.x(m, u), w], writes=[self.x(m, u + 1)],
                          frees=frees, flops=fwd_flops[u], hbm_bytes=fwd_hbm, workspace_bytes=fwd_ws[u],
                          after=self._backpressure(self.pending_saves))
                if is_ckpt and act_ckpt_on_host:
                    ck = self.host_rows(f"ckpt.m{m}.{u}", Holds.ACT_CHECKPOINT, m, "act_checkpoints", layer=u)
                    self.pending_saves.append(
                        self.emit(K_.SAVE_CKPT, u, m, reads=[self.x(m, u)], writes=[ck],
                                  frees=[self.x(m, u)], link_bytes=bnd))
            elif use.kind == K_.HEAD:
                dgrad = self.dgrad(u, m)
                self.emit(K_.HEAD, u, m, slot=s, reads=[self.x(m, L), w], writes=[self.dx(m, L), dgrad],
                          frees=[self.x(m, L)], flops=3 * m_.head_fwd_flops(tok),
                          hbm_bytes=head_hbm, workspace_bytes=head_ws)
                offload_grads(u, m)
                if p.optimizer == "backward" and m == last_m:
                    self.optimizer(u)  # a tied matrix is updated with the embedding, later
            elif use.kind == K_.RECOMPUTE:
                self.emit(K_.RECOMPUTE, u, m, slot=s, reads=[self.x(m, u), w], writes=[self.x(m, u + 1)],
                          flops=fwd_flops[u], hbm_bytes=fwd_hbm, workspace_bytes=fwd_ws[u])
            else:  # BACKWARD
                dgrad = self.dgrad(u, m)
                self.emit(K_.BACKWARD, u, m, slot=s, reads=[self.x(m, u), self.dx(m, u + 1), w],
                          writes=[self.dx(m, u), dgrad], frees=[self.x(m, u), self.dx(m, u + 1)],
                          flops=3 * fwd_flops[u], hbm_bytes=bwd_hbm, workspace_bytes=bwd_ws[u],
                          after=self._backpressure(self.pending_offloads))
                offload_grads(u, m)
                if u == 0:
                    hdx = self.host_rows(f"hdx.m{m}", Holds.INPUT_GRAD, m, "staging")
                    self.emit(K_.OFFLOAD_INPUT_GRAD, EMBED, m, reads=[self.dx(m, 0)], writes=[hdx],
                              frees=[self.dx(m, 0)], link_bytes=bnd)
                    g = self.hgrad(EMBED)
                    exists = g in self.deps.last_write
                    # A fresh dense embedding grad is zeroed first; the last micro also sums
                    # its squares for the global norm. Both sweep the whole matrix.
                    sweeps = (0 if exists else 1) + (1 if m == last_m else 0)
                    self.emit(K_.EMBED_BWD, EMBED, m, reads=[hdx] + ([g] if exists else []),
                              writes=[g] + ([self.gsq(EMBED)] if m == last_m else []), frees=[hdx],
                              host_bytes=tok * H * (act + 2 * self.host_grad_b)
                              + sweeps * m_.embedding_params * self.host_grad_b)
                    if p.optimizer == "backward" and m == last_m:
                        self.optimizer(EMBED)
        # End of step: the global gradient norm (clipping, logging); 'after' then updates all.
        gnorm = self.gnorm()
        self.emit(K_.GRAD_NORM, -1, reads=[self.gsq(u) for u in self.units], writes=[gnorm],
                  host_bytes=8 * len(self.units))
        if p.optimizer == "after":
            for u in self.units:
                self.optimizer(u)
        meta = ScheduleMeta(model=m_.to_dict(), policy=p.to_dict(), n_layers=L,
                            slot_bytes=self.slot_bytes, tokens=p.tokens,
                            model_flops=m_.model_flops_per_token(p.seq, p.context_tokens) * p.tokens)
        return Schedule(ops=tuple(self.ops), buffers=dict(self.buffers), meta=meta)


def build_schedule(model: ModelSpec, policy: Policy) -> Schedule:
    """The ops of one steady-state training step of `model` under `policy`, checked."""
    return _Builder(model, policy).build().check()
