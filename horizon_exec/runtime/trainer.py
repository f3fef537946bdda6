"""Trainer: the executor's Python API. Runs one schedule per optimizer step over the runtime
assemble.py builds for (model, policy) (the schedule, the host store, the device arena, the
engine); the results it returns are results.py's, its weights by name weights.py's.

    tr = Trainer(model, policy, TrainerConfig(optimizer=OptimizerConfig(lr=3e-4), seed=0))
    res = tr.step(tokens)          # tokens: LongTensor (batch, seq)
    res = tr.step(tokens, labels, lr=1e-4)   # explicit targets (-100 = ignored), this step's lr
    res.loss, res.grad_norm, res.timeline, res.device_peak_bytes, res.rss_peak_bytes
    tr.flush()                     # pipelined optimizer: apply the last step's gradients
    tr.state_dict()                # master weights by transformers names (views, fp32; a split
                                   # master: joined copies)
    tr.eval_loss(tokens, labels)   # (sum of token losses, labelled tokens); no update
    tr.evaluate(tokens, labels)    # the same as an EvalResult, with its measured timeline
    tr.state_items()               # what a checkpoint of it holds (state_items.py): tensors by
                                   # name and metadata; tr.load_state_items(...) takes them back

Eval runs through the engine too: build_eval_schedule's forward-only Schedule (embedding,
blocks, HEAD_LOSS per micro-batch) over the buffers the training step already holds, so it
needs no memory beyond the step's and its timeline is measured like a step's.

Admission: before anything is allocated, the planner simulates the schedule on this machine
and the constructor raises AdmissionError (admission.py: needed vs available, by role, what to
change) when the host RAM or device memory it needs is not available. AdmissionConfig(enabled=False)
skips it.

Non-finite steps: a NaN/inf loss or global gradient norm is detected before any update is
applied. on_nonfinite='skip' leaves master weights, Adam moments and step counters exactly
as they were (pipelined: the step's pending update is dropped, not applied next step), counts
the step in `skipped_steps` and returns a StepResult with skipped=True; 'stop' does the same
and raises NonFiniteError naming the step. optimizer='backward' updates each layer as its
gradient lands, before the loss and the global norm are known, so an exact skip is impossible
there: it only allows 'stop' (the default in that mode): a unit whose own gradient is not
finite, and every unit after it, is left untouched, units updated earlier in the step keep
their update, and the error says how many.

Pipelined mode: ops marked prev_step apply the previous step's gradients at the start of the
next step, so after `step()` the master weights lag one update until the next step or
`flush()`; the loss of step n is still computed with the weights after n-1 updates. The
learning rate travels with the gradients: the update made from step n's gradients uses the
lr that was current (or passed) when step n ran, whenever that update is applied.

Loss: labels[b, t] is the target of position t (default: tokens[b, t+1], -100 at the last
position, transformers' causal-LM convention). The step's loss is the sum of token losses
over every labelled token of the step divided by their count, so with micro-batches
(gradient accumulation) it is the token mean over the whole batch, exactly what one
unsplit batch gives; not the mean of per-micro-batch means. An MoE model whose config asks for
the router load-balancing loss (router_aux_loss_coef > 0: output_router_logits) adds coef times
the step's aux to it, as transformers does; the aux is computed per micro-batch (one forward
call's rows, as transformers computes it per call) and averaged over the step's micro-batches
and ranks (model/router_aux.py). StepResult.aux_loss reports it; eval losses are
cross-entropy alone (a sum over tokens, which the aux is not).
"""
import time
import weakref

import pandas as pd
import torch

from horizon_exec.dist.context import single
from horizon_exec.dtypes import TORCH_DTYPE
from horizon_exec.errors import ExecError
from horizon_exec.model.head import IGNORE, capped_logits, next_token_labels
from horizon_exec.model.families import final_norm, scale_embedded_
from horizon_exec.model.layout import block_layout, host_final_norm_names, host_layout
from horizon_exec.optim.adamw import check_hyper
from horizon_exec.runtime.assemble import assemble, optimizer_for, schedule_for
from horizon_exec.runtime.config import TrainerConfig
from horizon_exec.runtime.master import viewless_master
from horizon_exec.model.adapters import AdaptedWeights
from horizon_exec.runtime.nonfinite import NonFiniteGuard
from horizon_exec.runtime.ops import StepInputs
from horizon_exec.runtime.positions import check_docs, doc_positions
from horizon_exec.runtime.state_items import StateItems
from horizon_exec.runtime.state_items import declare as declare_state
from horizon_exec.runtime.weights import Weights
# the result types are part of this module's API (horizon_exec/__init__.py, checkpoints, the CLI)
from horizon_exec.runtime.results import (EvalResult, NonFiniteError, StepResult, TrainerState,  # noqa: F401
                                          rss_peak_bytes)
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import Holds, build_eval_schedule
from horizon_sim.schedule.op import EMBED
from horizon_sim.sim.timeline import timeline_frame
from horizon_sim.specs.families import family
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


def _part(name: str) -> property:
    """A collaborator of the trainer's Runtime (assemble.py), read as the trainer's attribute."""
    return property(lambda self: getattr(self.runtime, name), doc=f"Runtime.{name} (assemble.py).")


class Trainer:
    """Streams `model` through the device under `policy` (see module docstring), configured by
    `config` (runtime/config.py: the optimizer, the device and how it is used, the admission,
    the init seed; each checked when it is made). The optimizer's lr can be changed between
    steps; each step's lr is checked as the optimizer's is (optim.check_hyper).
    schedule: a Schedule to run instead of building one (e.g. the one the planner simulated,
    or one read from JSON); it must have been built for this model and policy. dist: the
    data-parallel run this process is a rank of (dist/context.py; None: one process).
    """

    def __init__(self, model: ModelSpec, policy: Policy, config: TrainerConfig = TrainerConfig(), *,
                 schedule=None, dist=None):
        if not isinstance(config, TrainerConfig):
            raise HorizonError(f"config must be a TrainerConfig (runtime/config.py), not {type(config).__name__}")
        if policy.seq < 2:
            raise HorizonError(f"policy seq={policy.seq}: training needs sequences of at least 2 tokens")
        adamw = optimizer_for(policy, config.optimizer)
        self.config = config
        self.model, self.policy, self.on_nonfinite = model, policy, config.runtime.nonfinite_for(policy)
        self.dist = dist = dist or single()
        self.sched = schedule_for(model, policy, dist, schedule)
        self.runtime = assemble(model, policy, config, self.sched, dist, adamw)
        self.weights = Weights(model, policy, dist, self.runtime)
        # Lane threads stop (and CUDA host memory is unregistered) with the trainer, even
        # without close(); the finalizer holds the runtime, not the trainer.
        self._finalizer = weakref.finalize(self, self.runtime.close)
        self._lr = float(config.optimizer.lr)
        self._eval_sched = None  # built on the first eval
        self.pending = False  # pipelined: the last step's gradients are not applied yet
        self.pending_lr = self._lr  # the lr those pending gradients are applied with
        self.steps_done = 0
        self.skipped_steps = 0  # steps whose update was not applied (non-finite loss or grads)
        self.failed: str | None = None
        self.state_invalid: str | None = None  # a checkpoint load failed after writing the store
        if config.random_init:
            self.init_weights(config.seed)
        elif self.adapters is not None:  # the base comes from elsewhere (load_hf); the adapters start as peft's
            self.adapters.init(config.seed + 1)

    admission = _part("admission")
    backend = _part("backend")
    store = _part("store")
    disk = _part("disk")
    arena = _part("arena")
    buffers = _part("buffers")
    runner = _part("runner")
    master = _part("master")
    engine = _part("engine")
    units = _part("units")
    _params = _part("params")

    # ---- weights by name (weights.py) -------------------------------------------------------
    @property
    def viewless_master(self) -> bool:
        """The master is not views of whole units (a split master; a quantized base: master.py):
        it is read and written a unit at a time (gather_master, Master.write_whole)."""
        return viewless_master(self.policy)

    def init_weights(self, seed: int) -> None:
        """transformers-style init from `seed` (Weights.init), then the working copy; with
        adapters, theirs as peft's (runtime/adapters.py), drawn from seed + 1."""
        self.weights.init(seed)
        if self.adapters is not None:
            self.adapters.init(seed + 1)

    @property
    def adapters(self):
        """The run's LoRA adapters on the device (runtime/adapters.py), or None (full fine-tuning)."""
        return self.runner.adapters

    def refresh_working_copy(self) -> None:
        """Working copies <- the masters, after anything wrote the masters directly."""
        self.weights.refresh_working_copy()

    def gather_master(self, u: int) -> torch.Tensor:
        """Unit u's whole fp32 master (a copy) on every rank; a collective (Weights.gather_master)."""
        return self.weights.gather_master(u)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Master weights by transformers names: views into the host store (Weights.state_dict)."""
        return self.weights.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        """The master and the working copy <- sd (by transformers names)."""
        self.weights.load_state_dict(sd)
        self.pending = False  # gradients of the old weights must not update the new ones

    @property
    def lr(self) -> float:
        """The lr the next step's gradients are applied with (unless step() gets one)."""
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = self._checked_lr(value)

    def _checked_lr(self, value) -> float:
        """A step's lr passes the optimizer's checks (optim.check_hyper) before it reaches a kernel."""
        a = self.runner.adamw
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise HorizonError(f"lr={value!r} must be a number") from None
        check_hyper(lr=value, betas=a.betas, eps=a.eps, weight_decay=a.weight_decay, name=lambda f: f"{f}=")
        return value

    # ---- checkpoints (the Stateful protocol: state_items.py) ---------------------------------
    def state_items(self, *, pending: bool | None = None) -> StateItems:
        """What a checkpoint of this trainer holds: the host store's tensors, by name, and the
        metadata (state_items.py), declared here alone; checkpoints/ckpt.py writes and reads
        them. pending None: this trainer as it is, for a save (ExecError when it failed
        mid-step or a checkpoint load failed part way: not a state a run can resume from);
        True/False: what a checkpoint written with or without pending pipelined gradients
        holds, for a load into this trainer (ExecError when it failed mid-step; a load that
        failed part way leaves it loadable: the next load rewrites the store)."""
        if pending is None:
            return declare_state(self, self.checkpoint_state(), self.pending)
        self.check_loadable()
        return declare_state(self, self._state(), pending)

    def load_state_items(self, state: dict, read) -> None:
        """Load a checkpoint written from state_items(): read(items, invalidate) reads its
        tensors in place into items, state_items(pending=state["pending"]) (invalidate(why)
        first, before the first byte lands in the store: a failure after it leaves this
        trainer refusing to step until a load succeeds); then `state`, the metadata's
        "trainer" (a TrainerState's fields; skipped_steps absent in older checkpoints), is
        restored."""
        items = self.state_items(pending=bool(state["pending"]))

        def invalidate(why: str) -> None:
            self.state_invalid = why

        read(items, invalidate)
        self.restore(TrainerState(steps_done=int(state["steps_done"]), pending=bool(state["pending"]),
                                  pending_lr=float(state["pending_lr"]), lr=float(state["lr"]),
                                  skipped_steps=int(state.get("skipped_steps", 0))))

    def checkpoint_state(self) -> TrainerState:
        """What a checkpoint must record of this trainer besides the host store. ExecError when
        the trainer failed mid-step or a checkpoint load failed part way: its state is not one
        a run can resume from."""
        self._check_usable()
        return self._state()

    def _state(self) -> TrainerState:
        return TrainerState(steps_done=self.steps_done, pending=self.pending, pending_lr=self.pending_lr,
                            lr=self.lr, skipped_steps=self.skipped_steps)

    def check_loadable(self) -> None:
        """ExecError when no checkpoint can be loaded into this trainer: it failed mid-step (a
        load that failed part way leaves it loadable: the next load rewrites the store)."""
        if self.failed:
            self._check_usable()

    def restore(self, state: TrainerState) -> None:
        """Put back a checkpoint's `state` once the host store holds the checkpoint's tensors:
        the trainer is valid again and its working copy is rebuilt from the master."""
        self.state_invalid = None
        self.refresh_working_copy()
        self.pending = state.pending
        self.pending_lr = state.pending_lr
        self.lr = state.lr
        self.steps_done = state.steps_done
        self.skipped_steps = state.skipped_steps

    # ---- running ----------------------------------------------------------------------------
    def _check_usable(self):
        if self.failed:
            raise ExecError(f"the trainer failed earlier and its state is inconsistent: {self.failed}")
        if self.state_invalid:
            raise ExecError(f"the trainer's state is invalid: {self.state_invalid}; load a checkpoint")

    def _run(self, ops, skip=frozenset(), n_ids: int | None = None):
        try:
            return self.engine.run(ops, len(self.sched.ops) if n_ids is None else n_ids, skip)
        except BaseException as e:  # an op failed, or the caller was interrupted mid-step
            self.failed = str(e) if isinstance(e, ExecError) else f"interrupted mid-step ({type(e).__name__})"
            if not self.engine.broken:  # lanes are idle: the step's buffers can go
                self.buffers.clear_dynamic()
            raise

    def _check_docs(self, docs, tokens):
        if docs is None:
            return None
        if not self.policy.doc_masks:
            raise HorizonError("docs were given but the policy has doc_masks off (attention would "
                               "cross documents)")
        return check_docs(docs, tokens.shape)

    def _check_batch(self, tokens, labels, rows: int | None):
        p, V = self.policy, self.model.vocab
        want = (rows if rows is not None else p.batch, p.seq)
        if tokens.dim() != 2 or (rows is not None and tuple(tokens.shape) != want) or tokens.shape[1] != p.seq:
            raise HorizonError(f"tokens have shape {tuple(tokens.shape)}; the policy wants "
                               f"({want[0] if rows is not None else 'n'}, {p.seq})")
        tokens = tokens.to(torch.int64).cpu().contiguous()
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= V):
            raise HorizonError(f"token ids must lie in [0, {V})")
        if labels is None:
            return tokens, next_token_labels(tokens)
        if tuple(labels.shape) != tuple(tokens.shape):
            raise HorizonError(f"labels have shape {tuple(labels.shape)}; tokens have {tuple(tokens.shape)}")
        labels = labels.to(torch.int64).cpu().contiguous()
        bad = (labels != IGNORE) & ((labels < 0) | (labels >= V))
        if bool(bad.any()):
            raise HorizonError(f"labels must be {IGNORE} (ignored) or lie in [0, {V})")
        return tokens, labels

    def step(self, tokens: torch.Tensor, labels: torch.Tensor | None = None, *, docs=None,
             lr: float | None = None, skip_kinds=frozenset()) -> StepResult:
        """One optimizer step on tokens (batch, seq) (int64, ids < vocab) with targets
        `labels` (batch, seq) (-100 = ignored; default: the next token, see the module
        docstring). docs (batch, seq) int: each token's document, for a policy with doc_masks
        (None: one document per sequence). lr: the learning rate this step's gradients are
        applied with (default: self.lr). `skip_kinds` (measurement only, e.g.
        {OpKind.OPTIMIZER} to see what the optimizer costs): op kinds not run this step; the
        step is then not a training step."""
        self._check_usable()
        p = self.policy
        tokens, labels = self._check_batch(tokens, labels, p.batch)
        docs = self._check_docs(docs, tokens)
        lr_now = self._lr if lr is None else self._checked_lr(lr)
        # the loss's denominator, every rank's: the labelled tokens (DPO: the pairs)
        n_labelled = self._sum_over_ranks(tokens.shape[0] // 2 if p.objective == "dpo" else int((labels != IGNORE).sum()))
        # The optimizer ops of this run apply the previous step's gradients (pipelined) or
        # this step's (after / backward): each with the lr of the step that made them.
        inputs = StepInputs(tokens=tokens, lr=self.pending_lr if p.optimizer == "pipelined" else lr_now,
                            n_step_tokens=max(1, n_labelled),  # all ignored: loss and grads are 0
                            guard=NonFiniteGuard(p.optimizer), router_aux=self.model.router_aux_loss_coef > 0,
                            dropout_step=self.steps_done if p.lora_dropout and not skip_kinds else None)
        # labels go to the device here; the engine's step_begin synchronizes before any lane reads
        out = self.runner.begin_step(inputs, labels, docs)
        self.backend.reset_peak(self.arena)
        skip = {o.id for o in self.sched.ops if (o.prev_step and not self.pending) or o.kind in skip_kinds}
        t0 = time.perf_counter()
        rows = self._run(self.sched.ops, skip)
        step_s = time.perf_counter() - t0
        self.steps_done += 1
        loss = out.loss() if out.global_loss is None else out.global_loss
        aux = out.aux() if out.global_aux is None else out.global_aux
        gnorm = self.store.scalar(Holds.GRAD_NORM) if self.adapters is None else out.adapter_grad_norm
        # The GRAD_NORM op flags a non-finite loss or norm, and the optimizer ops of this step
        # then leave everything untouched; the pipelined update of this step is dropped here.
        bad = inputs.guard.found
        self.pending = p.optimizer == "pipelined" and not bad
        self.pending_lr = lr_now
        if bad:
            self.skipped_steps += 1
            if self.on_nonfinite == "stop":
                raise NonFiniteError(inputs.guard.message(self.steps_done, len(self.units)), step=self.steps_done)
        ops, starts, ends = zip(*rows)
        timeline = timeline_frame(ops, starts, ends)
        timeline["temp_peak_bytes"] = [out.temp_peak.get(o.id, 0) for o in ops]
        return StepResult(loss=loss, grad_norm=gnorm, timeline=timeline,
                          device_peak_bytes=self.backend.device_peak(self.arena),
                          rss_peak_bytes=rss_peak_bytes(), step_s=step_s, tokens=p.tokens,
                          labelled_tokens=n_labelled, skipped=bool(bad), nonfinite=bad or "", aux_loss=aux,
                          dpo=self._dpo_metrics(out, n_labelled) if p.objective == "dpo" else None)

    def _dpo_metrics(self, out, pairs: int) -> dict:
        """TRL's reward metrics of a DPO step, means over its `pairs` (every rank's)."""
        parts = [s for s in out.dpo_stats if s is not None]
        c, r, won = (float(v) for v in (torch.stack(parts).sum(dim=0).cpu() if parts else torch.zeros(3)))
        c, r, won = self._sum_over_ranks(c, r, won)
        return {"rewards_chosen": c / pairs, "rewards_rejected": r / pairs, "reward_margin": (c - r) / pairs,
                "reward_accuracy": won / pairs}

    def _sum_over_ranks(self, *xs):
        """Numbers summed over every rank (the calling thread's collective); one rank: as given."""
        if self.dist.world == 1:
            return xs[0] if len(xs) == 1 else xs
        import torch.distributed as tdist
        t = torch.tensor(xs, dtype=torch.float64)
        tdist.all_reduce(t, group=self.dist.groups["main"])
        out = [type(x)(v) for x, v in zip(xs, t.tolist())]
        return out[0] if len(out) == 1 else tuple(out)

    def flush(self) -> list:
        """Apply pending pipelined optimizer updates (the prev_step ops), so the master
        weights are final. A no-op in the other modes or when nothing is pending. Returns the
        measured (op, start_s, end_s) of the ops it ran."""
        self._check_usable()
        if not self.pending:
            return []
        self.runner.begin_step(StepInputs(tokens=None, lr=self.pending_lr, n_step_tokens=1,
                                          guard=NonFiniteGuard(self.policy.optimizer)))
        rows = self._run([o for o in self.sched.ops if o.prev_step])
        self.pending = False
        return rows

    @torch.no_grad()
    def _final_hidden(self, tokens, docs=None):
        """For logits() only (a check on small inputs; eval runs through the engine): streaming
        forward without autograd, outside the schedule, on the calling thread: pending
        pipelined updates are applied first (flush; the run's trajectory is unchanged by
        that), then one unit's weights at a time go to the device (cast from the fp32 master)
        and run over the sequences in micro_batch chunks. Returns the activations entering
        the head, [(mb, T, H)], and the head's (norm's tensors, matrix)."""
        self._check_usable()
        self.flush()
        m, p = self.model, self.policy
        dev, act = self.backend.device, TORCH_DTYPE[p.compute_dtype]
        params = self._params if not self.viewless_master else {}
        if self.viewless_master:  # the embedding and the head, joined (a block is joined when it runs)
            for u in (EMBED, m.n_layers):
                params.update(host_layout(m, u).views(self.gather_master(u)))
        names = family(m.family)
        emb = params[names.embedding_name]                                        # (V, H) fp32
        xs = [scale_embedded_(m, emb.index_select(0, c.reshape(-1)).view(c.shape[0], p.seq, m.hidden).to(dev, act))
              for c in tokens.split(p.micro_batch)]                               # [(mb, T, H)]
        if docs is None and p.doc_masks:
            docs = torch.zeros_like(tokens)
        if names.learned_positions:  # + each token's position's row (GPT-2's wpe), in the rows' dtype
            wpe = params[names.position_embedding_name]                           # (P, H) fp32
            pos = doc_positions(docs) if docs is not None else torch.arange(p.seq).expand(tokens.shape[0], p.seq)
            for x, q in zip(xs, pos.split(p.micro_batch)):
                x.add_(wpe.index_select(0, q.reshape(-1)).view(x.shape).to(dev, act))
        chunks = docs.split(p.micro_batch) if docs is not None else [None] * len(xs)
        tabs = [self.runner.attn.tables(d) for d in chunks]                       # per chunk
        for layer in range(m.n_layers):
            blk = block_layout(m.block_spec(layer))
            w = {k: v.to(dev, act) for k, v in blk.views(self.weights.unit_master(layer)).items()}
            if self.adapters is not None:
                w = AdaptedWeights(w, self.adapters.weights(layer), self.adapters.scale)
            for i, at in enumerate(tabs):  # in place: one chunk's output is new at a time
                xs[i] = self.runner.block(layer)(w, xs[i], *at(layer))
            del w
        w_norm = tuple(params[n].to(dev, act) for n in host_final_norm_names(m))
        w_lm = (emb if m.tied_embeddings else params[names.head_name]).to(dev, act)
        return xs, w_norm, w_lm

    @property
    def eval_schedule(self):
        """The forward-only Schedule eval runs (build_eval_schedule), built on first use; every
        buffer it names is one of the training step's, declared the same way."""
        if self._eval_sched is None:
            ev = build_eval_schedule(self.model, self.policy, self.dist.layout)
            odd = [n for n, b in ev.buffers.items() if self.sched.buffers.get(n) != b]
            if odd:  # a training Schedule given to the constructor that names buffers otherwise
                raise ExecError(f"the eval schedule's buffer {odd[0]!r} is not the training schedule's")
            self._eval_sched = ev
        return self._eval_sched

    def evaluate(self, tokens: torch.Tensor, labels: torch.Tensor | None = None, docs=None) -> EvalResult:
        """The loss of tokens (n, seq) under the current weights, with no update: pending
        pipelined updates are applied first (flush; the run's trajectory is unchanged by
        that), then the eval Schedule runs on the engine once per policy.batch rows (the last
        run padded with rows whose labels are all ignored). The loss is chunked like
        training's head, so full logits never exist."""
        self._check_usable()
        tokens, labels = self._check_batch(tokens, labels, None)
        docs = self._check_docs(docs, tokens)
        self.flush()
        sched, B = self.eval_schedule, self.policy.batch
        total, timeline, peak, runs = 0.0, None, 0, 0
        for r0 in range(0, tokens.shape[0], B):
            t, lab = tokens[r0:r0 + B], labels[r0:r0 + B]
            d = docs[r0:r0 + B] if docs is not None else None
            if t.shape[0] < B:  # padding rows: token 0, nothing labelled, one document
                pad = B - t.shape[0]
                t = torch.cat([t, t.new_zeros(pad, t.shape[1])])
                lab = torch.cat([lab, lab.new_full((pad, lab.shape[1]), IGNORE)])
                d = torch.cat([d, d.new_zeros(pad, d.shape[1])]) if d is not None else None
            inputs = StepInputs(tokens=t, lr=self._lr, n_step_tokens=1, guard=NonFiniteGuard(self.policy.optimizer))
            out = self.runner.begin_step(inputs, lab, d)
            self.backend.reset_peak(self.arena)
            rows = self._run(sched.ops, n_ids=len(sched.ops))
            total += out.loss()
            peak = max(peak, self.backend.device_peak(self.arena))
            if timeline is None:
                ops, starts, ends = zip(*rows)
                timeline = timeline_frame(ops, starts, ends)
                timeline["temp_peak_bytes"] = [out.temp_peak.get(o.id, 0) for o in ops]
            runs += 1
        total, n_labelled = self._sum_over_ranks(float(total), int((labels != IGNORE).sum()))  # every rank's share
        return EvalResult(loss_sum=total, labelled_tokens=n_labelled, batches=runs,
                          timeline=timeline if timeline is not None else pd.DataFrame(), device_peak_bytes=peak)

    def eval_loss(self, tokens: torch.Tensor, labels: torch.Tensor | None = None,
                  docs=None) -> tuple[float, int]:
        """(sum of token losses, labelled tokens) of tokens (n, seq): evaluate()'s."""
        r = self.evaluate(tokens, labels, docs)
        return r.loss_sum, r.labelled_tokens

    def logits(self, tokens: torch.Tensor, docs=None) -> torch.Tensor:
        """Full logits (n, seq, V), fp32, on the host, of the current weights: for checks on
        small inputs (training never materialises them)."""
        tokens, _ = self._check_batch(tokens, None, None)
        xs, w_norm, w_lm = self._final_hidden(tokens, self._check_docs(docs, tokens))
        with torch.no_grad():
            norm, cap = final_norm(self.model), self.model.logit_softcap
            return torch.cat([capped_logits(norm(x, *w_norm, self.model.norm_eps) @ w_lm.t(), cap).float().cpu()
                              for x in xs])

    @property
    def host_store_bytes(self) -> int:
        return self.store.nbytes

    def close(self) -> None:
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
