"""The training loop around a Trainer: lr schedule, periodic eval, logging, checkpoints, resume.

    loop = TrainLoop(trainer, dataset, LoopConfig(steps=1000, lr_schedule=CosineSchedule(...),
                     ckpt_dir="ckpt", save_every=100), seed=0)
    loop.resume("ckpt")          # optional: continue exactly where a checkpoint left off
    loop.run()                   # steps loop.step .. steps-1; returns the last StepResult

Per step s (0-based): the next batch from the seeded loader, Trainer.step with lr = schedule(s)
(global-norm clipping and micro-batch gradient accumulation are the policy's: grad_clip,
micro_batches), then a progress-bar update (loss, lr, tokens/s, MFU), a JSON line in the
metrics log (non-finite numbers as null; aux_loss too when the model trains with the router
load-balancing loss; with a `check`, train/plan_check.py, after warm-up the measured and
predicted step time, device peak and RSS, and 'vs plan' on the bar; a log that cannot be
written stops the run, exit 1) and, as configured, a
checkpoint and then the eval loss on the held-out batches (checkpoint first: an eval that
fails, an EvalError, stops the run without costing the step; it writes one if none was due).
With a ckpt_dir the loop holds the folder's lock (ckpt_lock.py) until close().

Exact resume: a checkpoint holds the trainer's state (ckpt.py) and the loop's (step, loader
epoch/position, data fingerprint, schedule), so a resumed run's step s computes exactly what
the uninterrupted run's step s did (fp32: bit for bit). Eval flushes a pending pipelined
update first, which changes nothing numerically: the same per-unit updates run, earlier.
Resume verifies checksums while it reads, and falls back to the previous checkpoint (with a
warning) when the latest is damaged (ckpt.py). A step's checkpoint is written before its eval,
so a run killed during that eval (or stopped by a signal before it) resumes owing it: run()
runs it first (logged like any eval, the same loss bit for bit in fp32), unless the checkpoint
records its result (loop state "eval": a checkpoint written after the eval). The loop state
also records the step's loss and grad norm ("last"), for the summary of a run resumed at its
last step.

Signals: while run() runs in the main thread, the first SIGINT, SIGTERM or SIGHUP lets the current
step finish (and its checkpoint or eval, if in one), writes a checkpoint (when ckpt_dir is set
and the step has none yet) and raises Interrupted at that step boundary; a step that makes no
progress after it (a stuck op) is given up after engine.STOP_GRACE_S; a second signal raises
Interrupted at once (mid-step, or mid-write: a checkpoint being written is abandoned under its
temporary name, so the last complete one stays intact), naming what it abandoned. The CLI
exits 128 + the signal number (130, 143, 129).

Non-finite steps (the trainer's on_nonfinite): a skipped step is logged ("skipped" in the
JSON line, a message); 'stop' raises NonFiniteError out of run().

Batches without a target (every label ignored: e.g. instruction data whose prompts are longer
than seq) have loss 0 and gradient 0, which is no measurement: each step's JSON line holds its
labelled_tokens, such steps are counted in `untargeted` (one warning line at the first), and an
eval whose batches hold no target reports none (eval_loss null) instead of 0. The CLI fails a
run whose every step was untargeted.

Data parallel (a Trainer with a DistContext of R ranks): every step draws one global batch of
R x policy.batch sequences from the seeded loader (the same order whatever R) and rank r
trains on its rows r*b .. (r+1)*b - 1; the eval batches are split the same way and their
sums added over ranks. Rank 0 alone shows progress and writes the metrics log. A checkpoint
first applies a pending pipelined update on every rank (which changes nothing numerically),
then the node's leader writes the node's host store (one node: ckpt_dir itself; several:
ckpt_dir/node-J, each node its shard of the master and moments) while the others wait; a
resume loads the newest step every node has intact. At each step boundary the ranks agree
whether a signal asked them to stop, so all stop at the same boundary.
"""
import json
import math
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.checkpoints import ckpt_lock
from horizon_exec.train import stop_signals
from horizon_exec.checkpoints.fileio import OutputError, make_dirs, write_failure
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.train.stop_signals import StopSignals
from horizon_sim.errors import HorizonError


@dataclass(kw_only=True, frozen=True, slots=True)
class LoopConfig:
    """The loop's settings. Not checked here: RunConfig (train/config.py), what the CLI and
    Python callers describe a run with, owns the rules (steps > 0, the eval and checkpoint
    counts >= 0) and makes this from a checked run (RunConfig.loop_config), so each value is
    checked once; a LoopConfig made by hand must keep to the same rules."""
    steps: int
    """Total optimizer steps of the run (a resumed run continues up to this)."""
    lr_schedule: CosineSchedule
    eval_every: int = 0
    """Eval every N steps; 0: only after the last step. No eval without held-out data or
    with eval_batches = 0."""
    eval_batches: int = 4
    ckpt_dir: str | None = None
    save_every: int = 0
    """Checkpoint every N steps; 0: only after the last step (when ckpt_dir is set)."""
    keep_ckpts: int = 2
    """Checkpoints kept in ckpt_dir (older ones are removed); 0 keeps all."""
    peak_flops: float | None = None
    """Device peak FLOP/s for MFU; None: report achieved model TFLOP/s instead."""
    progress: bool = True
    log_file: str | None = None
    """Append one JSON object per step (and per eval) to this file."""
    log_window: int = 10
    """Steps averaged for the tokens/s and MFU shown."""
    handle_signals: bool = True
    """Stop at a step boundary on SIGINT/SIGTERM/SIGHUP (module docstring); only from the main thread."""


def _finite_or_none(v):
    """A float that JSON can hold: NaN and infinities become None (null)."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def metrics_line(rec: dict) -> str:
    """One line of the --log-file metrics log: strict JSON (NaN is not JSON: non-finite numbers
    are null), newline-terminated."""
    return json.dumps({k: _finite_or_none(v) for k, v in rec.items()}, allow_nan=False) + "\n"


class EvalError(HorizonError):
    """The eval after a step failed; the run stopped (with a checkpoint of that step when it could)."""


class Interrupted(KeyboardInterrupt):
    """run() stopped on a signal: at a step boundary (first signal; `checkpoint` is the last
    one written, possibly just now) or at once (`immediate`: a second signal, or a step that
    made no progress after the first). `during`: what was abandoned (default step `step` + 1);
    `no_checkpoint`: why there is none; `why`: what made it immediate, if not a second signal."""

    def __init__(self, signum: int, step: int, checkpoint, immediate: bool, *, during: str = "",
                 no_checkpoint: str = "no ckpt_dir", why: str = ""):
        self.signum, self.step, self.checkpoint, self.immediate = signum, step, checkpoint, immediate
        where = (f"aborted during {during or f'step {step + 1}'}" if immediate else f"stopped after step {step}")
        ck = f"; last checkpoint {checkpoint}" if checkpoint else f"; no checkpoint ({no_checkpoint})"
        super().__init__(f"{stop_signals.name(signum)}: {where}{f' ({why})' if why else ''}{ck}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class TrainLoop:
    def __init__(self, trainer, dataset, cfg: LoopConfig, seed: int = 0, out=print, check=None):
        self.tr, self.ds, self.cfg, self.seed = trainer, dataset, cfg, seed
        self.out = out  # where one-line messages go (the progress bar's writer while it runs)
        self.check = check  # the run's prediction (train/plan_check.PlanCheck): each step set against it
        pol = trainer.policy
        if dataset.data.seq != pol.seq:
            raise HorizonError(f"data packed to {dataset.data.seq} tokens, the policy runs {pol.seq}")
        if dataset.max_id >= trainer.model.vocab:
            raise HorizonError(f"token id {dataset.max_id} from the tokenizer does not fit the model's "
                               f"vocab of {trainer.model.vocab}")
        self.dist = d = trainer.dist
        # one global batch per step (R x batch rows), this rank's share of it (module docstring)
        self.batches = dataset.batches(pol.batch * d.world, seed)
        self.eval_set = ([self._share(b) for b in dataset.eval_batches(pol.batch * d.world, cfg.eval_batches)]
                         if cfg.eval_batches else [])
        self.ckpt_root = ckpt_mod.node_folder(cfg.ckpt_dir, d) if cfg.ckpt_dir else None
        self.fingerprint = dataset.fingerprint()
        self.step = 0
        if pol.doc_masks != dataset.data.doc_masks:
            raise HorizonError(f"the policy has doc_masks={pol.doc_masks}, the data was packed with "
                               f"doc_masks={dataset.data.doc_masks}")
        # Under document masks a token attends to its document: model FLOPs use the data's
        # mean document length.
        ctx = dataset.mean_doc_tokens if pol.doc_masks else 0
        self.flops_per_step = trainer.model.model_flops_per_token(pol.seq, ctx) * pol.tokens * d.world
        self.step_tokens = pol.tokens * d.world
        self.losses: dict[int, float] = {}       # step -> training loss
        self.evals: dict[int, float] = {}        # step (steps done) -> eval loss
        self.last = None
        self._times: list[float] = []
        self.last_ckpt: tuple[int, object] | None = None  # (step, folder) of the last checkpoint written
        self.eval_owed = False    # resumed at a step whose eval had not run (resume(); run() does it first)
        self.eval_redone: int | None = None  # the step whose missed eval run() did after a resume
        self.resumed_last: dict | None = None  # the checkpoint's record of its step ({"loss", "grad_norm"...})
        self.skipped: list[int] = []   # steps (1-based) whose update was skipped as non-finite
        self.untargeted: list[int] = []  # steps (1-based) whose batch had no target token (module docstring)
        self._signal: int | None = None
        self._phase = ""        # what run() is in, for an abort message: 'step 5', 'the eval after step 4'
        self._unlock = None
        if self.ckpt_root and d.is_leader:  # one run per checkpoint folder, from before the first step to close()
            make_dirs(Path(self.ckpt_root))
            self._unlock = weakref.finalize(self, ckpt_lock.release, ckpt_lock.acquire(self.ckpt_root))

    def _share(self, b):
        """This rank's rows of a global batch."""
        if self.dist.world == 1:
            return b
        n = b.tokens.shape[0] // self.dist.world
        rows = slice(self.dist.rank * n, (self.dist.rank + 1) * n)
        return type(b)(b.tokens[rows], b.labels[rows], b.docs[rows] if b.docs is not None else None)

    def close(self) -> None:
        """Release the checkpoint folder's lock (also when the loop is garbage-collected)."""
        if self._unlock is not None:
            self._unlock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- state ----------------------------------------------------------------------------
    def state(self) -> dict:
        st = {"step": self.step, "data": self.batches.state_dict(), "data_fingerprint": self.fingerprint,
              "data_source": self.ds.source, "seed": self.seed, "schedule": self.cfg.lr_schedule.to_dict()}
        if self.last is not None:  # the step's own numbers, for the summary of a run resumed with no step left
            st["last"] = {"loss": _finite_or_none(self.last.loss), "grad_norm": _finite_or_none(self.last.grad_norm)}
        if self.step in self.evals:  # the eval after this step ran before the checkpoint: a resume does not redo it
            st["eval"] = {"step": self.step, "eval_loss": _finite_or_none(self.evals[self.step])}
        return st

    def _eval_due(self, step: int) -> bool:
        """An eval follows step `step` (eval_every, or the last step), as _steps runs it."""
        cfg = self.cfg
        return bool(self.eval_set) and step > 0 and ((cfg.eval_every and step % cfg.eval_every == 0)
                                                     or step == cfg.steps)

    def _resumed_evals(self, loop_state: dict) -> None:
        """After a resume at self.step: the eval after that step is owed unless the checkpoint
        holds its result. The checkpoint of a step is written before its eval (_steps), so a
        process killed during that eval (or stopped by a signal before it) resumes here and
        runs it: the same weights and batches, so the same loss, bit for bit in fp32. An eval
        that did finish after the checkpoint is run again, as are the steps after it."""
        self.eval_owed, self.eval_redone = False, None
        ev = loop_state.get("eval")
        if (isinstance(ev, dict) and ev.get("step") == self.step
                and (ev.get("eval_loss") is None or type(ev.get("eval_loss")) is float)):
            self.evals[self.step] = ev["eval_loss"]
        else:
            self.eval_owed = self._eval_due(self.step)
        last = loop_state.get("last")
        ok = isinstance(last, dict) and all(type(last.get(k)) in (float, type(None)) for k in ("loss", "grad_norm"))
        self.resumed_last = last if ok else None

    def save(self) -> Path:
        d = self.dist
        if d.world == 1:
            p = ckpt_mod.save_checkpoint(self.ckpt_root, self.tr, self.step, self.state(), keep=self.cfg.keep_ckpts)
        else:
            from horizon_exec.dist.context import agree
            self.tr.flush()  # every rank: the pending update is applied, no rank's gradients need saving
            p = Path(self.ckpt_root) / ckpt_mod.step_dir_name(self.step)
            agree(d, lambda: ckpt_mod.save_checkpoint(self.ckpt_root, self.tr, self.step, self.state(),
                                                      keep=self.cfg.keep_ckpts) if d.is_leader else None)
        self.last_ckpt = (self.step, p)
        if self.check is not None:  # the files written evict the caches: the next step is not compared
            self.check.after_break()
        return p

    def resume(self, path) -> Path:
        """Restore trainer and loop from a checkpoint folder (or a ckpt_dir's latest, falling
        back to older ones when it is damaged); checksums are verified while reading."""
        def check(p, meta):
            st = meta.get("loop", {})
            if st.get("data_fingerprint") != self.fingerprint:
                raise HorizonError(f"{p}: checkpoint was trained on different data (or tokenizer, seq or split) "
                                   f"than {self.ds.source}; resume with the same data")
            data = st.get("data")
            n = len(self.ds.train)
            if not (isinstance(data, dict) and all(type(data.get(k)) is int and data[k] >= 0 for k in ("epoch", "pos"))
                    and data["pos"] <= n):
                raise ckpt_mod.CheckpointError(f"{p / ckpt_mod.META}: loop.data {ckpt_mod.show(data)} is not a data "
                                               f"position (epoch, pos <= {n}) (corrupt checkpoint)")
            # The loader draws one batch per step (epochs advance lazily, at the next draw), so
            # the step fixes the position: a step no run of this data reached is damage too.
            step, b = meta["step"], self.batches.batch
            per_epoch = len(self.batches.indices) // b
            want = {"epoch": 0, "pos": 0} if step == 0 else {"epoch": (step - 1) // per_epoch,
                                                            "pos": ((step - 1) % per_epoch + 1) * b}
            if {k: data[k] for k in want} != want:
                raise ckpt_mod.CheckpointError(
                    f"{p / ckpt_mod.META}: step {step} does not match loop.data (epoch {data['epoch']}, pos "
                    f"{data['pos']}): a run at step {step} has read epoch {want['epoch']} up to {want['pos']} "
                    f"(corrupt checkpoint)")
            try:
                self.batches.load_state_dict(data)  # checks the seed before anything changes
            except HorizonError as e:
                raise HorizonError(f"{p}: {e}") from None

        if self.dist.world > 1:
            path = self._agreed_checkpoint(path)
        meta = ckpt_mod.load_checkpoint(path, self.tr, verify=self.dist.is_leader, check=check, warn=self.out)
        p = Path(meta["path"])
        self.step = int(meta["step"])
        self.last_ckpt = (self.step, p)
        self.last = None
        self._resumed_evals(meta.get("loop", {}))
        lr_sched = meta.get("loop", {}).get("schedule")
        if lr_sched != self.cfg.lr_schedule.to_dict():
            self.out(f"note: lr schedule differs from the checkpoint's ({ckpt_mod.show(lr_sched)} -> "
                     f"{self.cfg.lr_schedule.to_dict()}); the run continues on the new one")
        opt = self.tr.state_items().meta["optimizer"]   # what this trainer's checkpoint would record
        if meta.get("optimizer") != opt:
            self.out(f"note: optimizer settings differ from the checkpoint's ({ckpt_mod.show(meta.get('optimizer'))} "
                     f"-> {opt})")
        return p

    def _agreed_checkpoint(self, path) -> Path:
        """Data parallel: the checkpoint folder every node resumes from, the newest step each
        node has intact (a node's leader verifies its candidates; a step some node lacks, e.g.
        one that died while writing, is not taken). Every rank then loads its node's folder of
        that step (the leader verified it; the others read only what is theirs)."""
        import torch.distributed as dist

        from horizon_exec.dist.context import agree
        d = self.dist
        root = Path(path) if Path(path).name.startswith("node-") else Path(ckpt_mod.node_folder(path, d))

        def intact() -> list[int]:
            steps = []
            for p in ckpt_mod.candidates(root) if d.is_leader else []:
                try:
                    ckpt_mod.verify_checkpoint(p)
                    steps.append(int(ckpt_mod.read_meta(p)["step"]))
                except (HorizonError, OSError) as e:
                    self.out(f"warning: node {d.node}: skipping checkpoint {p}: {e}")
            return steps
        mine = agree(d, intact)
        every = [None] * d.world
        dist.all_gather_object(every, mine if d.is_leader else None, group=d.groups["main"])
        per_node = [set(s) for r, s in enumerate(every) if r % d.layout.devices_per_node == 0]
        common = set.intersection(*per_node) if per_node else set()
        if not common:
            raise HorizonError(f"no checkpoint step is intact on every node under {path} "
                               f"(steps per node: {[sorted(s) for s in per_node]})")
        folder = (root if (root / ckpt_mod.META).exists() and int(ckpt_mod.read_meta(root)["step"]) == max(common)
                  else root / ckpt_mod.step_dir_name(max(common)))
        return folder

    # ---- running --------------------------------------------------------------------------
    def evaluate(self) -> float | None:
        """Mean token loss over the held-out batches (None without any, or when none of their
        tokens is a target: a mean over nothing is not 0)."""
        if not self.eval_set:
            return None
        total, n = 0.0, 0
        for b in self.eval_set:
            s, k = self.tr.eval_loss(b.tokens, b.labels, b.docs)
            total, n = total + s, n + k
        return total / n if n else None

    def _eval_step(self, write) -> float:
        """evaluate() after a step; a failure stops the run as an EvalError, with a checkpoint
        of this step first when there is a ckpt_dir and the trainer is still consistent."""
        try:
            return self.evaluate()
        except Exception as e:
            why = f"step {self.step}: eval failed: {type(e).__name__}: {e}"
        tr = self.tr
        if self.cfg.ckpt_dir and not (tr.failed or tr.state_invalid) and (
                self.last_ckpt is None or self.last_ckpt[0] != self.step):
            write(f"step {self.step}: checkpoint {self.save()}")
        ck = self.last_ckpt
        raise EvalError(why + (f"; last checkpoint {ck[1]} (step {ck[0]})" if ck else "; no checkpoint written")
                        + "; resume with --resume, or with --eval-batches 0 if the eval keeps failing")

    def _rate(self) -> tuple[float, float]:
        """(tokens/s, model FLOP/s) over the last log_window steps."""
        w = self._times[-self.cfg.log_window:]
        secs = sum(w)
        if secs <= 0:
            return float("nan"), float("nan")
        return len(w) * self.step_tokens / secs, len(w) * self.flops_per_step / secs

    def _log(self, rec: dict, write) -> None:
        """One JSON line in the metrics log, flushed (closed) at once so a full disk shows at
        the line that did not fit. Non-finite numbers are written as null (NaN is not JSON).
        A log that cannot be written stops the run (OutputError, exit 1, naming the path):
        a run that promised a record must not succeed without it. The step is checkpointed
        first when a ckpt_dir is set, so stopping costs nothing."""
        if not self.cfg.log_file or self.dist.rank != 0:
            return
        line = metrics_line(rec)
        try:
            with open(self.cfg.log_file, "a") as f:
                f.write(line)
        except OSError as e:
            why = write_failure(f"the metrics log {self.cfg.log_file}", e, Path(self.cfg.log_file).parent)
        else:
            return
        tr = self.tr
        if self.cfg.ckpt_dir and not (tr.failed or tr.state_invalid) and (
                self.last_ckpt is None or self.last_ckpt[0] != self.step):
            write(f"step {self.step}: checkpoint {self.save()}")
        ck = self.last_ckpt
        raise OutputError(f"step {self.step}: {why}; the run stopped"
                          + (f"; last checkpoint {ck[1]} (step {ck[0]})" if ck else "; no checkpoint written"))

    # ---- signals ---------------------------------------------------------------------------
    def _interrupted(self, signum: int, immediate: bool, why: str = "") -> Interrupted:
        ck = self.last_ckpt[1] if self.last_ckpt else None
        return Interrupted(signum, self.step, ck, immediate, during=self._phase, why=why,
                           no_checkpoint="none written yet" if self.cfg.ckpt_dir else "no ckpt_dir")

    def _first_signal(self, signum: int) -> None:
        self._signal = signum
        self.tr.engine.request_stop()   # a step stuck in an op is abandoned after engine.STOP_GRACE_S
        stop_signals.say(f"\n{stop_signals.name(signum)} received: stopping at the next step boundary "
                         f"(with a checkpoint when ckpt_dir is set); send it again to abort now\n")

    def _second_signal(self, signum: int) -> None:
        raise self._interrupted(signum, immediate=True)

    def _stop_asked(self) -> bool:
        """A signal asked this run to stop (data parallel: any rank's; every rank agrees, so all
        stop at this boundary, a collective of the calling thread)."""
        if self.dist.world == 1:
            return self._signal is not None
        import torch
        import torch.distributed as dist
        t = torch.tensor([self._signal or 0], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.dist.groups["main"])
        if t.item() and self._signal is None:
            self._signal = int(t.item())
        return bool(t.item())

    def _stop_at_boundary(self, write):
        """The first signal arrived: checkpoint this step (unless it has one) and stop."""
        if self.cfg.ckpt_dir and self.step > 0 and (self.last_ckpt is None or self.last_ckpt[0] != self.step):
            self._phase = f"the checkpoint of step {self.step}"
            p = self.save()
            write(f"step {self.step}: checkpoint {p}")
        raise self._interrupted(self._signal, immediate=False)

    def _train_step(self, s: int, b, lr: float):
        """tr.step on batch b; a step abandoned after a stop request (stuck) is an immediate Interrupted."""
        from horizon_exec.runtime.engine import StepAbandoned
        self._phase = f"step {s + 1}"
        try:
            return self.tr.step(b.tokens, b.labels, docs=b.docs, lr=lr)
        except StepAbandoned as e:
            what = f"op {e.op.id} {e.op.label} made no progress" if e.op is not None else "no progress"
            raise self._interrupted(self._signal, immediate=True, why=what) from e

    def run(self, until: int | None = None):
        """Train steps self.step .. min(until, steps) - 1; returns the last StepResult."""
        cfg, tr = self.cfg, self.tr
        end = cfg.steps if until is None else min(until, cfg.steps)
        bar = None
        if cfg.progress and self.step < end and self.dist.rank == 0:
            from tqdm import tqdm
            bar = tqdm(total=cfg.steps, initial=self.step, unit="step", dynamic_ncols=True)
        write = bar.write if bar is not None else self.out
        self._signal = None
        tr.engine.clear_stop()
        try:
            with StopSignals(self._first_signal, self._second_signal, enabled=cfg.handle_signals):
                if self.eval_owed:  # resumed between a step's checkpoint and its eval (_resumed_evals)
                    self._eval_after_step(write)
                    self.eval_owed, self.eval_redone = False, self.step
                    if self._stop_asked():
                        self._stop_at_boundary(write)
                self._steps(end, write, bar)
        finally:
            if bar is not None:
                bar.close()
        return self.last

    def _steps(self, end: int, write, bar) -> None:
        cfg, tr = self.cfg, self.tr
        while self.step < end:
            if self._stop_asked():
                self._stop_at_boundary(write)
            s = self.step
            t0 = time.perf_counter()
            b = self._share(next(self.batches))
            lr = cfg.lr_schedule(s)
            res = self._train_step(s, b, lr)
            self._times.append(time.perf_counter() - t0)
            self.step = s + 1
            self._phase = f"the bookkeeping after step {self.step}"
            self.losses[s] = res.loss
            self.last = res
            tok_s, flop_s = self._rate()
            rec = {"step": self.step, "loss": res.loss, "lr": lr, "grad_norm": res.grad_norm,
                   "tokens_per_s": tok_s, "model_tflops": flop_s / 1e12, "labelled_tokens": res.labelled_tokens}
            if res.aux_loss is not None:  # the router load-balancing loss (in `loss`, times its coefficient)
                rec["aux_loss"] = res.aux_loss
            if res.dpo is not None:  # DPO's reward metrics, as TRL names them
                rec.update(res.dpo)
            if res.labelled_tokens == 0:
                self.untargeted.append(self.step)
                if len(self.untargeted) == 1:
                    write(f"warning: step {self.step}: the batch has no target token (every label ignored, e.g. "
                          f"prompts longer than seq {tr.policy.seq}): its loss 0 measures nothing and it "
                          f"trains nothing; such steps are counted")
            if cfg.peak_flops:
                rec["mfu"] = flop_s / cfg.peak_flops
            if res.skipped:
                self.skipped.append(self.step)
                rec.update(skipped=True, nonfinite=res.nonfinite)
                write(f"step {self.step}: non-finite {res.nonfinite}: update skipped, weights and optimizer state "
                      f"unchanged ({tr.skipped_steps} skipped so far)")
            if self.check is not None:  # after warm-up: measured vs predicted step time, device peak, RSS
                rec.update(self.check.observe(self.step, res))
            self._log(rec, write)
            if bar is not None:
                post = {"loss": f"{res.loss:.4f}", "lr": f"{lr:.2e}", "tok/s": f"{tok_s:,.0f}"}
                if res.dpo is not None:
                    post["reward acc"] = f"{res.dpo['reward_accuracy']:.2f}"
                post.update({"MFU": f"{100 * rec['mfu']:.3g}%"} if cfg.peak_flops else
                            {"TFLOP/s": f"{flop_s / 1e12:.3g}"})
                if self.check is not None and self.check.versus(rec):
                    post["vs plan"] = self.check.versus(rec)
                bar.set_postfix(post, refresh=False)
                bar.update(1)
            if self._stop_asked():
                self._stop_at_boundary(write)
            last = self.step == cfg.steps
            # the checkpoint before the eval: an eval that fails (or is interrupted) cannot cost it
            if cfg.ckpt_dir and ((cfg.save_every and self.step % cfg.save_every == 0) or last):
                self._phase = f"the checkpoint of step {self.step}"
                p = self.save()
                write(f"step {self.step}: checkpoint {p}")
            if self._eval_due(self.step):
                self._eval_after_step(write)
            if self._stop_asked():  # a signal during the checkpoint or the eval, the last step's too
                self._stop_at_boundary(write)

    def _eval_after_step(self, write) -> None:
        """The eval after step self.step: its loss in self.evals, the metrics log and a line."""
        self._phase = f"the eval after step {self.step}"
        if self.check is not None:  # another Schedule ran: the next step is not compared
            self.check.after_break()
        ev = self._eval_step(write)
        self.evals[self.step] = ev
        self._log({"step": self.step, "eval_loss": ev}, write)
        write(f"step {self.step}: eval loss {ev:.4f} ({len(self.eval_set)} batches)" if ev is not None else
              f"step {self.step}: eval: no target token in the {len(self.eval_set)} held-out batches, "
              f"no eval loss")

    @property
    def steps_run(self) -> int:
        """Steps this loop object ran (a resumed run counts from its resume)."""
        return len(self._times)

    @property
    def tokens_per_s(self) -> float:
        secs = sum(self._times)
        return len(self._times) * self.step_tokens / secs if secs > 0 else float("nan")

    @property
    def model_flops_per_s(self) -> float:
        secs = sum(self._times)
        return len(self._times) * self.flops_per_step / secs if secs > 0 else float("nan")
