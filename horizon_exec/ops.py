"""What each op kind does, by the buffers it names. `OpRunner(op)` runs one op on the calling
lane thread and then releases the buffers the op lists in `frees`.

Units: layer -1 is the embedding [V, H], 0..L-1 the blocks, L the head (final norm + LM head;
when tied, the head's matrix is the embedding's master, and its gradient goes to hgrad.emb).
Weight sources and gradient targets are taken from the op's reads/writes in order: a tied
head's slot is [head host vector | embedding host vector], and its gradient splits the same
way. Nothing here decides order: the engine calls ops as the schedule says.
"""
import contextlib
import math

import torch

from horizon_exec.buffers import TORCH_DTYPE
from horizon_exec.errors import ExecError
from horizon_exec.head import head_fwd_bwd, next_token_labels
from horizon_exec.layers import DecoderBlock
from horizon_exec.layout import block_layout, head_device_layout, unit_name
from horizon_exec.optim import AdamW, clip_coef
from horizon_exec.positions import AttentionInputs
from horizon_exec.store import host_numel
from horizon_sim.schedule.op import Op, OpKind as K


def _pick(names, prefix, default=ExecError):
    for n in names:
        if n.startswith(prefix):
            return n
    if default is ExecError:
        raise ExecError(f"op names no buffer starting with {prefix!r} in {names}")
    return default


class OpRunner:
    def __init__(self, *, model, policy, buffers, store, arena, backend, adamw: AdamW):
        self.m, self.p = model, policy
        self.buf, self.store, self.arena, self.be = buffers, store, arena, backend
        self.adamw = adamw
        self.lr = adamw.lr
        self.act = TORCH_DTYPE[policy.compute_dtype]
        self.link_dtype = TORCH_DTYPE[policy.grad_dtype]
        self.L = model.n_layers
        self.block = DecoderBlock(model)
        self.block_layout = block_layout(model)
        self.head_layout = head_device_layout(model)
        self._views: dict = {}  # (slot, is_head) -> named views of the slot (bound once)
        # Device constants, charged to the arena: RoPE tables (and per-token positions and
        # documents under document masks) and the step's labels.
        self.attn = AttentionInputs(model, policy, arena, backend, self.act)
        self.labels = arena.alloc("labels", (policy.batch, policy.seq), torch.int64, policy.batch * policy.seq * 8)
        self.tokens = None
        self.n_step_tokens = policy.batch * (policy.seq - 1)
        self.loss_parts: list = []
        self.temp_peak: dict[int, int] = {}  # op id -> measured peak of its device temporaries
        self._g32 = None  # host scratch: a host grad in the master dtype (optimizer lane only)
        # Non-finite guard: what was found not finite this step (set by GRAD_NORM, or per unit in
        # 'backward' mode); this step's OPTIMIZER ops then update nothing.
        self.nonfinite: str | None = None
        self.updated_units = 0  # units this step's gradients were applied to (not prev_step ops)
        self.table = {
            K.EMBED_FWD: self.embed_fwd, K.LOAD_INPUT: self.copy_h2d, K.LOAD_WEIGHTS: self.load_weights,
            K.FORWARD: self.forward, K.RECOMPUTE: self.forward, K.SAVE_CKPT: self.copy_d2h,
            K.LOAD_CKPT: self.copy_h2d, K.HEAD: self.head, K.BACKWARD: self.backward,
            K.OFFLOAD_GRADS: self.offload_grads, K.OFFLOAD_INPUT_GRAD: self.copy_d2h,
            K.EMBED_BWD: self.embed_bwd, K.GRAD_NORM: self.grad_norm, K.OPTIMIZER: self.optimizer,
        }

    def begin_step(self, tokens, docs=None):
        """tokens (batch, seq) int64 on the host; labels go to the device once per step, and
        docs (batch, seq) int64 (document masks only; None = one document per sequence)."""
        self.tokens = tokens
        self.be.h2d(self.labels, next_token_labels(tokens))
        self.attn.begin_step(docs)
        self.loss_parts = [None] * self.p.micro_batches
        self.nonfinite, self.updated_units = None, 0

    def __call__(self, op: Op) -> None:
        self.table[op.kind](op)
        for name in op.frees:
            self.buf.free(name)

    # ---- helpers ----------------------------------------------------------------------------
    def _rows(self, m):  # the micro-batch's sequences
        mb = self.p.micro_batch
        return slice(m * mb, (m + 1) * mb)

    def _weights(self, op: Op) -> dict:
        """Named views of the slot the op computes with (bound once per slot and unit kind)."""
        is_head = op.layer == self.L
        key = (op.slot, is_head)
        if key not in self._views:
            flat = self.buf.get(f"w{op.slot}")
            self._views[key] = (self.head_layout if is_head else self.block_layout).views(flat)
        return self._views[key]

    @contextlib.contextmanager
    def _scope(self, op):
        """Context of a compute op (CPU: a temporaries tracker; its peak is kept per op)."""
        cm = self.be.compute_scope(self.arena, op.label)
        try:
            with cm:
                yield
        finally:
            self.temp_peak[op.id] = getattr(cm, "peak", 0)

    def _set_sq_norm(self, name: str, g) -> None:
        """gsq.<u> <- ||g||^2, reduced where g lives (device or host), stored on the host."""
        sq = torch.linalg.vector_norm(g, dtype=torch.float32).square().to(torch.float64)
        if sq.device == self.store.t[name].device:
            self.store.t[name].copy_(sq.reshape(1))
        else:
            self.be.d2h(self.store.t[name], sq.reshape(1))

    # ---- embedding (CPU lane) -----------------------------------------------------------------
    def embed_fwd(self, op):
        """emb.m<m> (mb, T, H) compute dtype <- rows of wc.emb or master.emb."""
        src = self.buf.get(op.reads[0]).view(self.m.vocab, self.m.hidden)
        out = self.buf.out(op.writes[0]).view(-1, self.m.hidden)
        ids = self.tokens[self._rows(op.micro)].reshape(-1)
        if src.dtype == out.dtype:
            torch.index_select(src, 0, ids, out=out)
        else:
            out.copy_(src.index_select(0, ids))

    def embed_bwd(self, op):
        """hgrad.emb (V*H,) += scatter of hdx.m<m> rows (zeroed first when the op starts its life)."""
        hdx = self.buf.get(_pick(op.reads, "hdx.")).view(-1, self.m.hidden)
        gname = _pick(op.writes, "hgrad.")
        if gname in op.reads:
            g = self.buf.get(gname)
        else:
            g = self.buf.out(gname)
            g.zero_()
        ids = self.tokens[self._rows(op.micro)].reshape(-1)
        g.view(self.m.vocab, self.m.hidden).index_add_(0, ids, hdx.to(g.dtype))
        sq = _pick(op.writes, "gsq.", None)
        if sq:
            self._set_sq_norm(sq, g)

    # ---- copies across the link ------------------------------------------------------------
    def copy_h2d(self, op):
        """LOAD_INPUT (emb.m -> x.m.0), LOAD_CKPT (ckpt.m.l -> x.m.l)."""
        self.be.h2d(self.buf.out(op.writes[0]), self.buf.get(op.reads[0]))

    def copy_d2h(self, op):
        """SAVE_CKPT (x.m.l -> ckpt.m.l), OFFLOAD_INPUT_GRAD (dx.m.0 -> hdx.m)."""
        self.be.d2h(self.buf.out(op.writes[0]), self.buf.get(op.reads[0]))

    def load_weights(self, op):
        """w<slot>[:n] <- concatenation of the op's sources (wc.* or master.*, cast to compute
        dtype on the device)."""
        slot = self.buf.get(op.writes[0])
        off = 0
        for name in op.reads:
            src = self.buf.get(name)
            self.be.h2d(slot[off:off + src.numel()], src)
            off += src.numel()
        want = self.m.head_device_params if op.layer == self.L else self.m.layer_params
        if off != want:
            raise ExecError(f"{op.label}: sources {op.reads} hold {off} parameters, the unit needs {want}")

    def offload_grads(self, op):
        """dgrad.<u>.m<m> (device) -> hgrad targets, cast to grad_dtype before the link;
        accumulate into targets the op reads, overwrite the others; gsq.<u> on the last micro."""
        g = self.buf.get(_pick(op.reads, "dgrad."))
        if g.dtype != self.link_dtype:
            g = g.to(self.link_dtype)  # device-side cast: what crosses the link
        own = f"hgrad.{unit_name(self.m, op.layer)}"
        sq = _pick(op.writes, "gsq.", None)
        off = 0
        for t in (n for n in op.writes if n.startswith("hgrad.")):
            n = host_numel(self.m, t.partition(".")[2])
            piece = g[off:off + n]
            off += n
            if t in op.reads:
                host = self.buf.get(t)
                self.be.d2h_add(host, piece)
                if sq and t == own:
                    self._set_sq_norm(sq, host)          # the final accumulated host grad
            else:
                self.be.d2h(self.buf.out(t), piece)
                if sq and t == own:
                    self._set_sq_norm(sq, piece)         # on the device (one micro-batch)
        if off != g.numel():
            raise ExecError(f"{op.label}: targets take {off} of {g.numel()} gradient elements")

    # ---- compute lane -------------------------------------------------------------------------
    def forward(self, op):
        """FORWARD / RECOMPUTE: x.m.(l+1) = block_l(x.m.l), no autograd."""
        x = self.buf.get(op.reads[0])
        w = self._weights(op)
        with self._scope(op), torch.no_grad():
            y = self.block(w, x, *self.attn.rows(self._rows(op.micro), op.layer))   # (mb, T, H)
        self.buf.put(op.writes[0], y)

    def backward(self, op):
        """dx.m.l, dgrad.l.m = autograd of block_l at x.m.l against dx.m.(l+1): forward with
        grad and autograd.grad on this one layer only."""
        x = self.buf.get(_pick(op.reads, "x."))
        dy = self.buf.get(_pick(op.reads, "dx."))
        w = self._weights(op)
        dgrad = self.buf.out(_pick(op.writes, "dgrad."))
        gviews = self.block_layout.views(dgrad)
        with self._scope(op):
            with torch.enable_grad():
                xg = x.detach().requires_grad_()
                wp = {k: v.detach().requires_grad_() for k, v in w.items()}
                y = self.block(wp, xg, *self.attn.rows(self._rows(op.micro), op.layer))
                grads = torch.autograd.grad(y, [xg, *wp.values()], dy)
            del y
            for k, gk in zip(wp, grads[1:]):
                gviews[k].copy_(gk)
            dx = grads[0]
            del grads, wp
        self.buf.put(_pick(op.writes, "dx."), dx)

    def head(self, op):
        """dx.m.L and dgrad.head.m from the chunked norm + LM head + loss (fwd and bwd)."""
        x = self.buf.get(_pick(op.reads, "x."))
        w = self._weights(op)
        dgrad = self.buf.out(_pick(op.writes, "dgrad."))
        gv = self.head_layout.views(dgrad)
        labels = self.labels[self._rows(op.micro)].reshape(-1)
        with self._scope(op):
            dx, loss = head_fwd_bwd(x, w["model.norm.weight"], w["lm_head.weight"], labels,
                                    self.n_step_tokens, self.m.norm_eps,
                                    min(self.p.loss_chunk_tokens, labels.numel()),
                                    gv["model.norm.weight"], gv["lm_head.weight"])
        self.loss_parts[op.micro] = loss
        self.buf.put(_pick(op.writes, "dx."), dx)

    # ---- host optimizer (CPU lane) ---------------------------------------------------------------
    def grad_norm(self, op):
        """gnorm = sqrt(sum of the units' squared norms)."""
        total = sum(self.store.scalar(n) for n in op.reads)
        self.store.t[op.writes[0]].fill_(math.sqrt(total) if total >= 0 else math.nan)
        # Every HEAD op is done (its gradient's norm is among the reads): the loss is known.
        bad = [f"{w} {v}" for w, v in (("loss", self.loss()), ("grad norm", math.sqrt(abs(total))))
               if not math.isfinite(v)]
        if bad and self.nonfinite is None:
            self.nonfinite = " and ".join(bad)

    def optimizer(self, op):
        """AdamW on master.<u> with hgrad.<u> (clipped by the global norm when clipping is
        on), then refresh the working copy wc.<u>."""
        u = unit_name(self.m, op.layer)
        if not op.prev_step:  # prev_step ops apply a step the trainer found finite
            if self.p.optimizer == "backward" and self.nonfinite is None:
                # before the global norm exists: this unit's own norm, and the loss (all HEADs ran)
                if not math.isfinite(sq := self.store.scalar(f"gsq.{u}")):
                    self.nonfinite = f"gradient of unit {u} (squared norm {sq})"
                elif not math.isfinite(self.loss()):
                    self.nonfinite = f"loss {self.loss()}"
            if self.nonfinite is not None:
                return  # no update: master, moments, step counter and working copy stay as they are
            self.updated_units += 1
        p = self.store.t[f"master.{u}"]
        g = self.buf.get(f"hgrad.{u}")
        exp_avg, exp_avg_sq = self.store.moments(u)
        wc = _pick(op.writes, "wc.", None)
        if g.dtype != p.dtype and self._g32 is None:  # torch path's reused chunk of scratch: O(1)
            self._g32 = torch.empty(self.adamw.chunk_params, dtype=p.dtype)
        coef = clip_coef(self.p.grad_clip, self.store.scalar("gnorm")) if self.p.clip else 1.0
        self.adamw.step(p, g, exp_avg, exp_avg_sq, self.store.steps[u], coef, lr=self.lr,
                        working_copy=self.store.t[wc] if wc else None, scratch=self._g32)

    def loss(self) -> float:
        return float(sum(part.item() for part in self.loss_parts))

