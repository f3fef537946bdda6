"""What each op kind does, by the buffers it names. `OpRunner(op)` runs one op on the calling
lane thread and then releases the buffers the op lists in `frees`.

Buffers are found by what they hold (Buffer.holds, .unit, .micro: the Schedule's typed
fields), never by their names. Units: layer -1 is the embedding [V, H], 0..L-1 the blocks, L
the head (final norm + LM head; when tied, the head's matrix is the embedding's master, and
its gradient goes to the embedding's host grad). Weight sources and gradient targets are the
op's reads/writes in order: a tied head's slot is [head host vector | embedding host vector],
and its gradient splits the same way, by the targets' declared sizes. A gradient goes into its
target fresh, or is added into it when the op also reads the target: host gradients
(OFFLOAD_GRADS, EMBED_BWD) and a unit's device sum over the micro-batches (BACKWARD and HEAD
of the layer order). Nothing here decides order: the engine calls ops as the schedule says. One
step's state flows one way: the trainer's StepInputs in (begin_step), the ops' StepOutputs out.
With the router load-balancing loss (an MoE model with router_aux_loss_coef > 0), the forward,
HEAD and backward ops of each micro-batch share its RouterAux sums (model/router_aux.py).
"""
import contextlib
import hashlib
import math
from dataclasses import dataclass, field, replace

import torch

from horizon_exec.dtypes import TORCH_DTYPE
from horizon_exec.errors import ExecError
from horizon_exec.model.families import final_norm, scale_embedded_, scales_embedding
from horizon_exec.model.dpo import dpo_head_fwd_bwd, row_logps
from horizon_exec.model.head import head_fwd_bwd, head_loss
from horizon_exec.model.adapters import AdaptedWeights, AdapterDropout
from horizon_exec.model.block import DecoderBlock
from horizon_exec.model.block_buffers import BlockBuffers
from horizon_exec.model.router_aux import RouterAux, RouterStats
from horizon_exec.runtime.kept_graph import KeptGraph
from horizon_exec.model.layout import block_layout, final_norm_names, head_device_layout, host_layout, unit_name
from horizon_exec.runtime.nonfinite import NonFiniteGuard
from horizon_exec.optim.adamw import AdamW, clip_coef
from horizon_exec.runtime.positions import AttentionInputs
from horizon_exec.runtime.sq_norm import sq_norm, sq_norm_rows
from horizon_sim.schedule.builder import embed_norm_over_rows
from horizon_sim.schedule.op import EMBED, Holds, Op, OpKind
from horizon_sim.schedule.partition import Part, Partition
from horizon_sim.specs.families import family


@dataclass(frozen=True, slots=True)
class StepInputs:
    """What the trainer gives one step's ops: set before the engine runs, never written by an op."""
    tokens: torch.Tensor | None
    """(batch, seq) int64 on the host (None for a flush, whose ops read no tokens)."""
    lr: float
    """The learning rate this step's optimizer ops apply."""
    n_step_tokens: int
    """Labelled tokens of the whole step: the loss's denominator."""
    guard: NonFiniteGuard
    """The step's non-finite detector: GRAD_NORM records what it found, the optimizer ops ask it."""
    router_aux: bool = False
    """The step trains with the router load-balancing loss (a training step of an MoE model
    whose router_aux_loss_coef > 0; eval and flush: False)."""
    dropout_step: int | None = None
    """A training step's index, which seeds its adapters' dropout masks (Policy.lora_dropout;
    model/adapters.AdapterDropout); None: no dropout (eval, flush)."""


@dataclass(slots=True)
class StepOutputs:
    """What one step's ops hand back to the trainer, which reads it once the engine is done:
    written only by ops (and the collectives they run)."""
    loss_parts: list
    """Each micro-batch's loss contribution (0-d tensors), set by its HEAD op."""
    temp_peak: dict = field(default_factory=dict)
    """op id -> measured peak of its device temporaries (CPU backend)."""
    global_loss: float | None = None
    """Data parallel: the step's loss summed over every rank (NORM_ALL_REDUCE)."""
    router: RouterAux | None = None
    """The step's load-balancing sums and aux (StepInputs.router_aux), written by the forward,
    HEAD and backward ops; None without the aux loss."""
    global_aux: float | None = None
    """Data parallel: the step's aux summed over every rank's share (NORM_ALL_REDUCE)."""
    adapter_grad_norm: float | None = None
    """Adapters: the global norm of their gradients (ADAPTER_UPDATE), before clipping."""
    dpo_stats: list = field(default_factory=list)
    """DPO: each micro-batch's reward sums (model/dpo.py), set by its HEAD op."""

    def loss(self) -> float:
        """This rank's share of the step's loss: the token-mean cross-entropy's, plus coef times
        its share of the aux."""
        ce = float(sum(part.item() for part in self.loss_parts if part is not None))
        return ce if self.router is None else ce + self.router.coef * self.router.value()

    def aux(self) -> float | None:
        """This rank's share of the step's router aux loss (unweighted), or None without it."""
        return None if self.router is None else self.router.value()


class OpRunner:
    def __init__(self, *, model, policy, sched, buffers, store, arena, backend, adamw: AdamW, dist=None, disk=None,
                 seed: int = 0, temporaries: str = "every"):
        from horizon_exec.dist.context import single
        self.m, self.p, self.sched = model, policy, sched
        self.disk = disk  # the disk tier's file (disk_store.DiskStore), when the Schedule has one
        self.sr_base = seed  # the run's seed: a bf16 master's stochastic rounding draws from it
        self.dist = dist or single()
        self.buf, self.store, self.arena, self.backend = buffers, store, arena, backend
        self.adamw = adamw
        self.act = TORCH_DTYPE[policy.compute_dtype]
        self.link_dtype = TORCH_DTYPE[policy.grad_dtype]
        self.L = model.n_layers
        self.learned_positions = family(model.family).learned_positions
        self._blocks: dict = {}  # a block shape's spec -> its DecoderBlock (ModelSpec.block_spec)
        self._layouts: dict = {}  # a block shape's spec -> its layout
        self.head_layout = head_device_layout(model)
        self._views: dict = {}  # (slot, the unit's shape or 'head') -> named views of the slot (bound once)
        self.block_buffers = BlockBuffers(model, backend)  # non-parameter tensors (DeepSeek-V3's router bias)
        # temporaries='once' (RuntimeConfig.track_memory): Op -> its temporaries as measured on
        # its first run (memtrack.TempProfile). An Op is its whole description (kind, unit,
        # micro-batch, slot, buffers), so an equal Op runs the same kernels on the same shapes.
        self._temp_profiles: dict | None = {} if temporaries == "once" else None
        # Device constants (the Schedule's static device buffers): RoPE tables (and per-token
        # positions and documents under document masks) and the step's labels.
        self.attn = AttentionInputs(model, policy, buffers, backend)
        self.labels = buffers.find(Holds.LABELS)
        self.adapters = None  # LoRA adapters on the device (Policy.lora_rank): runtime/adapters.py
        if policy.adapters:
            from horizon_exec.runtime.adapters import DeviceAdapters
            self.adapters = DeviceAdapters(model, policy, buffers)
        self.quant = None  # a quantized frozen base (Policy.base_quant): its blocks' packing per shape (model/quant.py)
        if policy.quantized_base:
            from horizon_exec.model.quant import QuantUnits
            self.quant = QuantUnits(model, policy.base_quant, policy.compute_dtype)
        self._g32 = None  # host scratch: a host grad in the master dtype (optimizer lane only)
        self.inputs: StepInputs | None = None
        self.outputs: StepOutputs | None = None
        self.table = {
            OpKind.EMBED_FWD: self.embed_fwd, OpKind.LOAD_INPUT: self.copy_h2d,
            OpKind.LOAD_WEIGHTS: self.load_weights, OpKind.FORWARD: self.forward, OpKind.RECOMPUTE: self.forward,
            OpKind.SAVE_CKPT: self.copy_d2h, OpKind.LOAD_CKPT: self.copy_h2d, OpKind.HEAD: self.head,
            OpKind.HEAD_LOSS: self.head_loss, OpKind.BACKWARD: self.backward,
            OpKind.BACKWARD_SAVED: self.backward_saved, OpKind.OFFLOAD_GRADS: self.offload_grads,
            OpKind.OFFLOAD_INPUT_GRAD: self.copy_d2h, OpKind.EMBED_BWD: self.embed_bwd,
            OpKind.GRAD_NORM: self.grad_norm, OpKind.OPTIMIZER: self.optimizer,
            OpKind.DISK_READ: self.disk_read, OpKind.DISK_WRITE: self.disk_write,
            OpKind.ADAPTER_UPDATE: self.adapter_update, OpKind.ADAPTER_HOST_UPDATE: self.adapter_update,
            OpKind.OFFLOAD_ADAPTER_GRADS: self.offload_adapter_grads,
            OpKind.REF_FORWARD: self.forward,  # (it reads no adapters: the base alone)
        }
        if self.dist.world > 1:
            from horizon_exec.dist.collectives import Collectives
            self.table.update(Collectives(self, self.dist).table())

    def retrack(self) -> None:
        """temporaries='once': measure every op again on its next run (a measured device peak;
        validate's probe does this on the unmeasured step of each turn)."""
        if self._temp_profiles is not None:
            self._temp_profiles.clear()

    def begin_step(self, inputs: StepInputs, labels=None, docs=None) -> StepOutputs:
        """A step's inputs in, and the outputs its ops will fill (returned: the trainer reads
        them when the engine is done); labels (batch, seq) int64 go to the device once per
        step (None: a flush, which computes nothing), and docs (batch, seq) int64 (document
        masks only; None = one document per sequence)."""
        M = self.p.micro_batches
        router = RouterAux(self.m, M, self.p.micro_batch * self.p.seq, 1.0 / (M * self.dist.world)) \
            if inputs.router_aux else None
        self.inputs, self.outputs = inputs, StepOutputs(loss_parts=[None] * M, router=router, dpo_stats=[None] * M)
        if labels is not None:
            self.backend.h2d(self.labels, labels)
            self.attn.begin_step(docs)
        return self.outputs

    def __call__(self, op: Op) -> None:
        self.table[op.kind](op)
        for name in op.frees:
            self.buf.free(name)

    # ---- helpers ----------------------------------------------------------------------------
    def host_numel(self, u: int) -> int:
        """Parameters unit u keeps on the host (what its whole-unit buffers hold before padding)."""
        return host_layout(self.m, u).numel

    def shared_numel(self, u: int, reader: int) -> int:
        """Of unit u's host parameters, those an op of unit `reader` moves: a tied head takes
        the embedding's token rows, not its learned positions (GPT-2's wpe, after them)."""
        if u == EMBED and reader == self.L:
            return self.m.vocab * self.m.hidden
        return self.host_numel(u)

    def dev_numel(self, u: int) -> int:
        return self.m.head_device_params if u == self.L else self.m.block_spec(u).layer_params

    def partition(self, u: int) -> Partition:
        """How unit u is split over the ranks (horizon_sim/schedule/partition.py)."""
        return Partition(self.host_numel(u), self.dist.layout)

    def owned(self, name: str) -> torch.Tensor:
        """This rank's chunk of a unit's buffer: the part it updates (one rank: all of it;
        moments: (2, chunk))."""
        b, t = self.buf.declared[name], self.buf.get(name)
        a, e = self.partition(b.unit).owned_in(b.part, self.dist.local_rank, self.dist.node)
        return t.view(2, -1)[:, a:e] if b.holds in (Holds.MOMENTS, Holds.MOMENTS_STAGE) else t[a:e]

    def _rows(self, m):  # the micro-batch's sequences
        mb = self.p.micro_batch
        return slice(m * mb, (m + 1) * mb)

    def block(self, u: int):
        """Block u's forward: its shape's DecoderBlock (a model with dense blocks before its MoE
        ones has two), called with the block's buffers (model/block_buffers.py) added to the
        weights it reads; (w, x, cos, sin, window, docs, router=) -> y."""
        spec = self.m.block_spec(u)
        if spec not in self._blocks:
            self._blocks[spec] = DecoderBlock(spec)
        blk, bufs = self._blocks[spec], self.block_buffers.of(u)
        if not bufs:
            return blk

        def run(w, *a, **k):
            if isinstance(w, AdaptedWeights):  # its adapters' bookkeeping travels with the mapping
                w.update(bufs)
                return blk(w, *a, **k)
            return blk({**w, **bufs}, *a, **k)
        return run

    def block_layout(self, u: int):
        """Block u's layout in a slot and in its device gradient (its shape's)."""
        spec = self.m.block_spec(u)
        if spec not in self._layouts:
            self._layouts[spec] = block_layout(spec)
        return self._layouts[spec]

    def _weights(self, op: Op) -> dict:
        """Named views of the slot the op computes with (bound once per slot and unit shape)."""
        is_head = op.unit == self.L
        shape = "head" if is_head else self.m.block_spec(op.unit)
        key = (op.slot, shape)
        if key not in self._views:
            flat = self.buf.find(Holds.WEIGHT_SLOT, layer=op.slot)
            self._views[key] = (self.head_layout if is_head else self.block_layout(op.unit)).views(flat)
        return self._views[key]

    def _block_weights(self, op: Op):
        """The weights a block op computes with (the slot's views), carrying the block's adapters
        when the op reads them (model/adapters.py)."""
        w = self._weights(op)
        lora = self._adapters_of(op)
        if lora is None:
            return w
        return AdaptedWeights(w, lora, self.adapters.scale, self._dropout(op))

    def _adapters_of(self, op: Op) -> dict | None:
        """The adapters a block op computes with, {module: (A, B)}: the block's on the device, or
        (adapters on the host) the copy its load put in the slot's adapter buffer; None when the
        op reads none."""
        if self.adapters is None:
            return None
        slot = self.buf.all(op.reads, Holds.ADAPTER_SLOT)
        if slot:
            return self.adapters.views(self.buf.get(slot[0]), op.unit)
        return self.adapters.weights(op.unit) if self.buf.all(op.reads, Holds.ADAPTERS) else None

    def _adapter_grad_sums(self, op: Op) -> dict:
        """Where a block's backward adds its adapters' gradient, {module: (dA, dB)}: the block's
        step sums on the device, or (adapters on the host) the slot's gradient buffer, zeroed
        first (OFFLOAD_ADAPTER_GRADS adds it into the host sum)."""
        gslot = self.buf.all(op.writes, Holds.ADAPTER_GRAD_SLOT)
        if not gslot:
            return self.adapters.grad_pairs(op.unit)
        flat = self.buf.get(gslot[0])
        flat[:self.adapters.numel(op.unit)].zero_()
        return self.adapters.views(flat, op.unit)

    def offload_adapter_grads(self, op):
        """One backward's adapter gradient (the slot's device buffer) -> added into the block's
        host sum, or copied there by the step's first (the op then does not read the sum)."""
        g = self.buf.get(self.buf.one(op.reads, Holds.ADAPTER_GRAD_SLOT))
        name = self.buf.one(op.writes, Holds.ADAPTER_GRADS)
        host = self.buf.get(name)
        n = host.numel()
        if name in op.reads:
            self.backend.d2h_add(host, g[:n])
        else:
            self.backend.d2h(host, g[:n])

    def _dropout(self, op: Op):
        """The adapters' dropout for a block op of a training step (None without it, in eval)."""
        step = self.inputs.dropout_step
        if not self.p.lora_dropout or step is None:
            return None
        return AdapterDropout(self.p.lora_dropout, (self.sr_base, step, self.dist.rank, op.unit, op.micro))

    def _check_applied(self, op: Op, w) -> None:
        """Every adapter of the block was added by its family's forward (a family that computed
        a target's projection without `adapters.linear` would train without it)."""
        lora = getattr(w, "lora", None)
        if lora is not None and w.applied != set(lora):
            missing = sorted(set(lora) - w.applied)
            raise ExecError(f"{op.label}: the {self.m.family} block's forward did not apply the adapters of "
                            f"{', '.join(missing)}; this family cannot run adapters on them")

    @contextlib.contextmanager
    def _scope(self, op):
        """Context of a compute op (CPU: a temporaries tracker; its peak is kept per op). With
        temporaries='once', an op tracked before replays its measured profile instead: its
        temporaries over its run, slice by slice, added to the buffers the other lanes held
        meanwhile, count toward the device peak and must fit the budget (memtrack.TempProfile)."""
        prof = self._temp_profiles.get(op) if self._temp_profiles is not None else None
        if prof is not None:
            t0, live0 = self.arena.watch()
            ok = False
            try:
                yield
                ok = True
            finally:
                self.outputs.temp_peak[op.id] = prof.peak
                if ok:
                    self.arena.replayed(op.label, lambda t1, ch: prof.replay_peak(t0, t1, live0, ch))
                else:
                    self.arena.unwatch()
            return
        cm = self.backend.compute_scope(self.arena, op.label)
        ok = False
        try:
            with cm:
                yield
            ok = True
        finally:
            self.outputs.temp_peak[op.id] = getattr(cm, "peak", 0)
            if ok and self._temp_profiles is not None and hasattr(cm, "profile"):
                self._temp_profiles[op] = cm.profile

    def set_sq_norm(self, name: str, g, rows=None) -> None:
        """The unit's GRAD_SQ buffer `name` <- ||g||^2 (rows: of g's rows only, the others
        being zero), reduced where g lives (device or host), stored on the host."""
        sq = sq_norm(g) if rows is None else sq_norm_rows(g, rows)
        out = self.buf.get(name)
        if sq.device == out.device:
            out.copy_(sq.reshape(1))
        else:
            self.backend.d2h(out, sq.reshape(1))

    # ---- embedding (CPU lane) -----------------------------------------------------------------
    def embed_fwd(self, op):
        """The micro-batch's embedded rows (mb, T, H) compute dtype <- rows of the embedding's
        working copy or master."""
        V, H = self.m.vocab, self.m.hidden
        src = self.buf.get(op.reads[0])
        out = self.buf.out(op.writes[0]).view(-1, self.m.hidden)
        ids = self.inputs.tokens[self._rows(op.micro)].reshape(-1)
        if src.dtype == out.dtype:
            torch.index_select(src[:V * H].view(V, H), 0, ids, out=out)
        else:
            out.copy_(src[:V * H].view(V, H).index_select(0, ids))
        scale_embedded_(self.m, out)
        if self.learned_positions:  # + the rows of each token's position (GPT-2's wpe), in out's dtype
            pos, rows = self._positions(op, src)
            out.add_(rows.index_select(0, pos).to(out.dtype))

    def _positions(self, op, unit):
        """(each token's position (n,), the learned position rows (P, H) of the embedding unit's
        vector `unit`: after its token rows)."""
        V, H = self.m.vocab, self.m.hidden
        pos = self.attn.token_positions(self._rows(op.micro)).reshape(-1)
        return pos, unit[V * H:(V + self.m.max_position) * H].view(-1, H)

    def embed_bwd(self, op):
        """The embedding's host grad (V*H,) += scatter of the input-gradient rows (zeroed
        first when the op starts its life), but the rows of the padding token (ModelSpec.
        padding_idx: transformers' nn.Embedding gives its row no gradient from the lookup)."""
        hdx = self.buf.get(self.buf.one(op.reads, Holds.INPUT_GRAD)).view(-1, self.m.hidden)
        gname = self.buf.one(op.writes, Holds.HOST_GRAD)
        if gname in op.reads:
            g = self.buf.get(gname)
        else:
            g = self.buf.out(gname)
            g.zero_()
        ids = self.inputs.tokens[self._rows(op.micro)].reshape(-1)
        V, H = self.m.vocab, self.m.hidden
        g2 = g[:V * H].view(V, H)
        if self.learned_positions:  # every token's row, padding's too, lands on its position's
            pos, rows = self._positions(op, g)
            rows.index_add_(0, pos, hdx.to(g.dtype))
        if self.m.padding_idx is not None and bool((pads := ids == self.m.padding_idx).any()):
            ids, hdx = ids[~pads], hdx[~pads]
        if scales_embedding(self.m):  # d(x * s)/dx = s, in the gradient's dtype as autograd has it
            hdx = scale_embedded_(self.m, hdx.clone())
        g2.index_add_(0, ids, hdx.to(g.dtype))
        for sq in self.buf.all(op.writes, Holds.GRAD_SQ):
            if embed_norm_over_rows(self.m, self.inputs.tokens.numel()):  # zeroed at the step's first
                self.set_sq_norm(sq, g2, rows=torch.unique(self.inputs.tokens))  # micro: its token rows
            else:  # many tokens, or a tied head's gradient landed here too: a sweep
                self.set_sq_norm(sq, g)

    # ---- copies across the link ------------------------------------------------------------
    def copy_h2d(self, op):
        """LOAD_INPUT (embedded rows -> the layer-0 input), LOAD_CKPT (a boundary kept on the host)."""
        self.backend.h2d(self.buf.out(op.writes[0]), self.buf.get(op.reads[0]))

    def copy_d2h(self, op):
        """SAVE_CKPT (a boundary -> the host), OFFLOAD_INPUT_GRAD (the layer-0 input's grad)."""
        self.backend.d2h(self.buf.out(op.writes[0]), self.buf.get(op.reads[0]))

    def load_weights(self, op):
        """The slot[:n] <- concatenation of the op's sources (working copies or masters, cast
        to the compute dtype on the device); a quantized base's block: its bytes, then
        dequantized on the device into the slot (on this lane: a CUDA copy stream orders the
        kernels after the bytes land). Adapters on the host: the block's adapters (A and B, the
        first row of its ADAPTERS) into the slot's adapter buffer too."""
        slot = self.buf.get(op.writes[0])
        lora = self.buf.all(op.reads, Holds.ADAPTERS)
        if lora:
            a = self.adapters.state[op.unit][0]  # (the store holds it flat: the adapters' own (3, n) view)
            self.backend.h2d(self.buf.get(self.buf.one(op.writes, Holds.ADAPTER_SLOT))[:a.numel()], a)
            op = replace(op, reads=tuple(r for r in op.reads if r not in lora))  # the weights' sources
        if self.buf.declared[op.reads[0]].holds == Holds.QUANT_BASE:
            src = self.buf.get(op.reads[0])
            staged = self.backend.empty(src.shape, torch.uint8)
            self.backend.h2d(staged, src)
            self.quant.of(op.unit).unpack_(slot[:self.dev_numel(op.unit)], staged)
            return
        off = 0
        for name in op.reads:
            src = self.buf.get(name)[:self.shared_numel(self.buf.declared[name].unit, op.unit)]  # not the padding
            self.backend.h2d(slot[off:off + src.numel()], src)
            off += src.numel()
        want = self.dev_numel(op.unit)
        if off != want:
            raise ExecError(f"{op.label}: sources {op.reads} hold {off} parameters, the unit needs {want}")

    def offload_grads(self, op):
        """The unit's device grads (one micro-batch) -> its host grad targets, cast to
        grad_dtype before the link; accumulate into targets the op reads, overwrite the others;
        the unit's squared norm on its last micro-batch."""
        # the unit's device grads, or (data parallel) this device's reduce-scattered slice of them
        g = self.buf.get(self.buf.one(op.reads, Holds.DEVICE_GRAD_SHARD, Holds.DEVICE_GRAD))
        if g.dtype != self.link_dtype:
            g = g.to(self.link_dtype)  # device-side cast: what crosses the link
        sq = next(iter(self.buf.all(op.writes, Holds.GRAD_SQ)), None)
        off = 0
        for t in self.buf.all(op.writes, Holds.HOST_GRAD):
            target = self.buf.declared[t]
            # a local slice takes the whole reduce-scattered piece; a whole unit its real
            # elements (the rest of the buffer is padding to whole chunks: kept zero)
            n = target.numel if target.part == Part.LOCAL else self.shared_numel(target.unit, op.unit)
            own = target.unit == op.unit
            piece = g[off:off + n]
            off += n
            if t in op.reads:
                host = self.buf.get(t)
                self.backend.d2h_add(host[:n], piece)
                if sq and own:
                    self.set_sq_norm(sq, host)          # the final accumulated host grad
            else:
                host = self.buf.out(t)
                self.backend.d2h(host[:n], piece)
                host[n:].zero_()
                if sq and own:
                    self.set_sq_norm(sq, piece)         # on the device (one micro-batch)
        if off != g.numel():
            raise ExecError(f"{op.label}: targets take {off} of {g.numel()} gradient elements")

    # ---- compute lane -------------------------------------------------------------------------
    def forward(self, op):
        """FORWARD / RECOMPUTE: the boundary after block l = block_l(the boundary before), no
        autograd; a kept layer's FORWARD (it writes a SAVED_ACTIVATIONS buffer) keeps its graph."""
        if self.buf.all(op.writes, Holds.SAVED_ACTIVATIONS):
            return self.forward_kept(op)
        x = self.buf.get(op.reads[0])
        w = self._block_weights(op)
        stats = self._router_stats(op)
        with self._scope(op), torch.no_grad():
            y = self.block(op.unit)(w, x, *self.attn.rows(self._rows(op.micro), op.unit), router=stats)   # (mb, T, H)
            if stats is not None:
                self.outputs.router.add(op.micro, stats)
        self._check_applied(op, w)
        self.buf.put(op.writes[0], y)

    def _router_stats(self, op) -> RouterStats | None:
        """A RouterStats for the block's router when the step has the aux loss and the op is a
        FORWARD (a RECOMPUTE's layer was counted by its forward), else None."""
        if self.outputs.router is None or op.kind != OpKind.FORWARD:
            return None
        return RouterStats()

    def forward_kept(self, op):
        """A kept layer's forward, with grad: its output, and its autograd graph held as the
        SAVED_ACTIVATIONS buffer (charged its declared bytes) until its BACKWARD_SAVED. The
        graph saves the weights as their place in the slot (kept_graph.py), not the slot's
        tensors: the slot is reloaded with other units before the backward."""
        x = self.buf.get(self.buf.one(op.reads, Holds.ACTIVATION))
        slot = self.buf.find(Holds.WEIGHT_SLOT, layer=op.slot)
        w = self._weights(op)
        stats = self._router_stats(op)
        lora = self._adapters_of(op)
        with self._scope(op):
            graph = KeptGraph.record(self.block(op.unit), w, slot, x, self.attn.rows(self._rows(op.micro), op.unit), stats,
                                     lora=lora, lora_scale=self.adapters.scale if lora is not None else 1.0,
                                     dropout=self._dropout(op) if lora is not None else None)
            if stats is not None:
                self.outputs.router.add(op.micro, stats)
        self.buf.put(self.buf.one(op.writes, Holds.ACTIVATION), graph.output)
        self.buf.hold(self.buf.one(op.writes, Holds.SAVED_ACTIVATIONS), graph)

    def _device_grad(self, op) -> tuple[torch.Tensor, bool]:
        """The op's device gradient buffer, and whether its gradients are added into it (the
        op reads it: a unit's sum over the micro-batches, layer order) or written fresh."""
        name = self.buf.one(op.writes, Holds.DEVICE_GRAD)
        add = name in op.reads
        return (self.buf.get(name) if add else self.buf.out(name)), add

    def backward(self, op):
        """The input's grad and the block's weight grads = autograd of block_l at its input
        against its output's grad: forward with grad and autograd.grad on this one layer only
        (with the router aux loss, also of the router's probability sum against its constant
        gradient: model/router_aux.py)."""
        if self.adapters is not None:
            return self.adapter_backward(op)
        x = self.buf.get(self.buf.one(op.reads, Holds.ACTIVATION))
        dy = self.buf.get(self.buf.one(op.reads, Holds.ACTIVATION_GRAD))
        w = self._weights(op)
        dgrad, add = self._device_grad(op)
        gviews = self.block_layout(op.unit).views(dgrad)
        router = self.outputs.router
        stats = RouterStats() if router is not None else None
        with self._scope(op):
            with torch.enable_grad():
                xg = x.detach().requires_grad_()
                wp = {k: v.detach().requires_grad_() for k, v in w.items()}
                y = self.block(op.unit)(wp, xg, *self.attn.rows(self._rows(op.micro), op.unit), router=stats)
                outs, gouts = ([y], [dy]) if stats is None else ([y, stats.prob_sum], [dy, router.grad(op.micro)])
                grads = torch.autograd.grad(outs, [xg, *wp.values()], gouts)
            del y, outs, stats
            for k, gk in zip(wp, grads[1:]):
                (gviews[k].add_ if add else gviews[k].copy_)(gk)
            dx = grads[0]
            del grads, wp
        self.buf.put(self.buf.one(op.writes, Holds.ACTIVATION_GRAD), dx)

    def adapter_backward(self, op):
        """A block's backward on a frozen base: forward with grad (the adapters as the leaves,
        the base's weights constant) and autograd.grad for the input's gradient (none for block
        0: the embedding is frozen too) and the adapters', added into the step's sums."""
        x = self.buf.get(self.buf.one(op.reads, Holds.ACTIVATION))
        dy = self.buf.get(self.buf.one(op.reads, Holds.ACTIVATION_GRAD))
        want_dx = bool(self.buf.all(op.writes, Holds.ACTIVATION_GRAD))
        w = self._weights(op)
        router = self.outputs.router
        stats = RouterStats() if router is not None else None
        sums = self._adapter_grad_sums(op)
        if not sums and not want_dx:  # block 0 without adapters of its own (expert targets, dense block): no gradient
            return
        with self._scope(op):
            with torch.enable_grad():
                xg = x.detach().requires_grad_(want_dx)
                lora = {k: (a.detach().requires_grad_(), b.detach().requires_grad_())
                        for k, (a, b) in self._adapters_of(op).items()}
                wa = AdaptedWeights(w, lora, self.adapters.scale, self._dropout(op))
                y = self.block(op.unit)(wa, xg, *self.attn.rows(self._rows(op.micro), op.unit), router=stats)
                self._check_applied(op, wa)
                outs, gouts = ([y], [dy]) if stats is None else ([y, stats.prob_sum], [dy, router.grad(op.micro)])
                leaves = [t for pair in lora.values() for t in pair]
                grads = torch.autograd.grad(outs, ([xg] if want_dx else []) + leaves, gouts)
            del y, outs, stats, wa
            for (ga, gb), da, db in zip(sums.values(), grads[want_dx::2], grads[want_dx + 1::2]):
                ga.add_(da)
                gb.add_(db)
            dx = grads[0] if want_dx else None
            del grads, lora
        if want_dx:
            self.buf.put(self.buf.one(op.writes, Holds.ACTIVATION_GRAD), dx)

    def backward_saved(self, op):
        """A kept layer's backward from the graph its FORWARD kept (no forward again): the input's
        grad and the block's weight grads, the weights read from the slot the unit is in now."""
        graph = self.buf.get(self.buf.one(op.reads, Holds.SAVED_ACTIVATIONS))
        dy = self.buf.get(self.buf.one(op.reads, Holds.ACTIVATION_GRAD))
        slot = self.buf.find(Holds.WEIGHT_SLOT, layer=op.slot)
        if self.adapters is not None:  # the adapters' gradients into the step's sums
            router = self.outputs.router
            with self._scope(op):
                dx, grads = graph.backward(dy, slot, router.grad(op.micro) if router is not None else None)
                for k, (ga, gb) in self._adapter_grad_sums(op).items():
                    ga.add_(grads[f"{k}.lora_A"])
                    gb.add_(grads[f"{k}.lora_B"])
                del grads
            if self.buf.all(op.writes, Holds.ACTIVATION_GRAD):
                self.buf.put(self.buf.one(op.writes, Holds.ACTIVATION_GRAD), dx)
            return
        dgrad, add = self._device_grad(op)
        gviews = self.block_layout(op.unit).views(dgrad)
        router = self.outputs.router
        with self._scope(op):
            dx, wgrads = graph.backward(dy, slot, router.grad(op.micro) if router is not None else None)
            for k, gk in wgrads.items():
                (gviews[k].add_ if add else gviews[k].copy_)(gk)
            del wgrads
        self.buf.put(self.buf.one(op.writes, Holds.ACTIVATION_GRAD), dx)

    def head(self, op):
        """The head input's grad and the head's weight grads from the chunked norm + LM head
        + loss (fwd and bwd)."""
        x = self.buf.get(self.buf.one(op.reads, Holds.ACTIVATION))
        w = self._weights(op)
        if self.adapters is not None:
            return self.frozen_head(op, x, w)
        dgrad, add = self._device_grad(op)
        with self._scope(op):
            # the kernels write the compute dtype: into a sum (fp32, or to add to) through a
            # temporary of the head's size (the Schedule counts it in the op's workspace)
            staged = add or dgrad.dtype != self.act
            mine = torch.empty(self.dev_numel(op.unit), dtype=self.act, device=x.device) if staged else dgrad
            gv = self.head_layout.views(mine)
            dx, loss = self._head_pass(op, x, w, [gv[n] for n in final_norm_names(self.m)], gv["lm_head.weight"])
            if staged:
                (dgrad[:mine.numel()].add_ if add else dgrad[:mine.numel()].copy_)(mine)
                del mine, gv
            if self.outputs.router is not None:  # every layer has run this micro-batch's forward
                self.outputs.router.close(op.micro)
        self.outputs.loss_parts[op.micro] = loss
        self.buf.put(self.buf.one(op.writes, Holds.ACTIVATION_GRAD), dx)

    def frozen_head(self, op, x, w):
        """A frozen head (adapters): the loss and the head input's gradient, no weight gradients."""
        with self._scope(op):
            dx, loss = self._head_pass(op, x, w)
            if self.outputs.router is not None:
                self.outputs.router.close(op.micro)
        self.outputs.loss_parts[op.micro] = loss
        self.buf.put(self.buf.one(op.writes, Holds.ACTIVATION_GRAD), dx)

    def _head_pass(self, op, x, w, g_norm_out=None, g_lm_out=None):
        """(dx, the micro-batch's loss part) of the head's chunked pass, its weight gradients into
        g_norm_out and g_lm_out (None: a frozen head): the token cross-entropy (head.py), or DPO's
        pairs against the reference's log-probabilities the op reads (model/dpo.py; its reward
        sums into the step's outputs)."""
        labels = self.labels[self._rows(op.micro)].reshape(-1)
        common = dict(eps=self.m.norm_eps, chunk=min(self.p.loss_chunk_tokens, labels.numel()),
                      loss_kernel=self.p.loss_kernel, norm=final_norm(self.m), softcap=self.m.logit_softcap)
        w_norm, w_lm = [w[n] for n in final_norm_names(self.m)], w["lm_head.weight"]
        if self.p.objective != "dpo":
            return head_fwd_bwd(x, w_norm, w_lm, labels, self.inputs.n_step_tokens, g_norm_out=g_norm_out,
                                g_lm_out=g_lm_out, **common)
        ref = self.buf.get(self.buf.one(op.reads, Holds.REF_LOGPS))[self._rows(op.micro)]
        dx, loss, self.outputs.dpo_stats[op.micro] = dpo_head_fwd_bwd(
            x, w_norm, w_lm, labels, ref, 1.0 / self.inputs.n_step_tokens, self.p, g_norm_out=g_norm_out,
            g_lm_out=g_lm_out, **common)
        return dx, loss

    def adapter_update(self, op):
        """ADAPTER_UPDATE: the adapters' global gradient norm (the step's loss and norm checked
        for non-finite values here, as GRAD_NORM does), then their AdamW on the device."""
        total = self.adapters.sq_norm()
        guard = self.inputs.guard
        loss = self.outputs.loss() if self.outputs.global_loss is None else self.outputs.global_loss
        guard.after_grad_norm(loss, total)
        self.outputs.adapter_grad_norm = math.sqrt(total) if total >= 0 else math.nan
        if guard.may_update("adapters", lambda: total, lambda: loss):
            self.adapters.update(self.adamw, self.inputs.lr, self.p.grad_clip, total)
        else:  # a skipped step is no step: the sums start again from zero
            for g in self.adapters.grads.values():
                g.zero_()

    def head_loss(self, op):
        """HEAD_LOSS (eval): the micro-batch's summed token loss, forward only; nothing written
        but the step context's loss part. DPO's reference pass (the op writes REF_LOGPS): each
        row's completion log-probability instead, into the micro-batch's rows of that buffer."""
        x = self.buf.get(op.reads[0])
        w = self._weights(op)
        labels = self.labels[self._rows(op.micro)].reshape(-1)
        if op.writes:  # DPO's reference pass: each row's completion log-probability (model/dpo.py)
            with self._scope(op), torch.no_grad():
                h = final_norm(self.m)(x.reshape(-1, x.shape[-1]), *[w[n] for n in final_norm_names(self.m)],
                                       self.m.norm_eps)
                lp = row_logps(h, w["lm_head.weight"], labels, x.shape[0], min(self.p.loss_chunk_tokens, labels.numel()),
                               self.m.logit_softcap)
                self.buf.get(self.buf.one(op.writes, Holds.REF_LOGPS))[self._rows(op.micro)] = lp
            return
        with self._scope(op), torch.no_grad():
            loss = head_loss(x, [w[n] for n in final_norm_names(self.m)], w["lm_head.weight"], labels, self.m.norm_eps,
                             min(self.p.loss_chunk_tokens, labels.numel()), self.p.loss_kernel, final_norm(self.m),
                             self.m.logit_softcap)
        self.outputs.loss_parts[op.micro] = loss

    def _sr_seed(self, u: int) -> int:
        """A bf16 master under stochastic rounding: the seed of this update's draws, from the
        run's seed, the unit, this rank's chunk and the unit's next Adam step (so a resumed run
        draws what the uninterrupted one would); 0: round to nearest even."""
        if self.p.master_rounding != "stochastic":
            return 0
        chunk = self.partition(u).chunk_index(self.dist.local_rank, self.dist.node)
        key = f"{self.sr_base}/{u}/{chunk}/{int(self.store.steps[u].item()) + 1}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") or 1

    # ---- the disk tier (disk lane) ----------------------------------------------------------------
    def disk_read(self, op):
        """A unit's moments (and low halves) from the disk tier's file into their RAM stages."""
        for disk, stage in zip(op.reads, op.writes):
            self.disk.read(disk, self.buf.out(stage))

    def disk_write(self, op):
        """The updated ones back to the file (the stages are freed after)."""
        for stage, disk in zip(op.reads, op.writes):
            self.disk.write(disk, self.buf.get(stage))

    # ---- host optimizer (CPU lane) ---------------------------------------------------------------
    def grad_norm(self, op):
        """The global norm = sqrt(sum of the units' squared norms)."""
        total = sum(float(self.buf.get(n).item()) for n in op.reads)
        if self.dist.world > 1:  # this rank's share: NORM_ALL_REDUCE sums the squares, takes the
            self.buf.get(op.writes[0]).fill_(total)  # root and checks the step's loss and norm
            return
        self.buf.get(op.writes[0]).fill_(math.sqrt(total) if total >= 0 else math.nan)
        # Every HEAD op is done (its gradient's norm is among the reads): the loss is known.
        self.inputs.guard.after_grad_norm(self.outputs.loss(), total)

    def optimizer(self, op):
        """AdamW on the unit's master with its host grad (clipped by the global norm when
        clipping is on), then refresh its working copy."""
        u, inputs = op.unit, self.inputs
        if not op.prev_step:  # prev_step ops apply a step the trainer found finite
            if not inputs.guard.may_update(unit_name(self.m, u), lambda: self.store.scalar(Holds.GRAD_SQ, u),
                                           self.outputs.loss):
                return  # no update: master, moments, step counter and working copy stay as they are
        # this rank's chunk of each (one rank: the whole unit)
        g = self.owned(self.buf.one(op.reads, Holds.HOST_GRAD))
        exp_avg, exp_avg_sq = self.owned(self.buf.one(op.writes, Holds.MOMENTS_STAGE, Holds.MOMENTS))
        coef = clip_coef(self.p.grad_clip, self.store.scalar(Holds.GRAD_NORM)) if self.p.clip else 1.0
        if self.p.split_master:  # the working copy is the master's high half, updated with it
            self.adamw.step_split(self.owned(self.buf.one(op.writes, Holds.WORKING_COPY)),
                                  self.owned(self.buf.one(op.writes, Holds.MASTER_LOW_STAGE, Holds.MASTER_LOW)),
                                  g, exp_avg, exp_avg_sq,
                                  self.store.steps[u], coef, lr=inputs.lr)
            return
        p = self.owned(self.buf.one(op.writes, Holds.MASTER))
        wc = next(iter(self.buf.all(op.writes, Holds.WORKING_COPY)), None)
        if g.dtype != p.dtype and self._g32 is None:  # torch path's reused chunk of scratch: O(1)
            self._g32 = torch.empty(self.adamw.chunk_params, dtype=p.dtype)
        wc = self.owned(wc) if wc else None
        same = wc is not None and wc.dtype == p.dtype  # an fp32 copy (several nodes, fp32 compute)
        self.adamw.step(p, g, exp_avg, exp_avg_sq, self.store.steps[u], coef, lr=inputs.lr,
                        working_copy=None if same else wc, scratch=self._g32, sr_seed=self._sr_seed(u))
        if same:
            wc.copy_(p)
