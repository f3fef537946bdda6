"""The training loop around a Trainer: lr schedule, periodic eval, logging, checkpoints, resume.

    loop = TrainLoop(trainer, dataset, LoopConfig(steps=1000, schedule=CosineSchedule(...),
                     ckpt_dir="ckpt", ckpt_every=100), seed=0)
    loop.resume("ckpt")          # optional: continue exactly where a checkpoint left off
    loop.run()                   # steps loop.step .. steps-1; returns the last StepResult

Per step s (0-based): the next batch from the seeded loader, Trainer.step with lr = schedule(s)
(global-norm clipping and micro-batch gradient accumulation are the policy's: grad_clip,
micro_batches), then, as configured: eval loss on the held-out batches, a checkpoint, a
progress-bar update (loss, lr, tokens/s, MFU) and a JSON line in the metrics log.

Exact resume: a checkpoint holds the trainer's state (ckpt.py) and the loop's (step, loader
epoch/position, data fingerprint, schedule), so a resumed run's step s computes exactly what
the uninterrupted run's step s did (fp32: bit for bit). Eval flushes a pending pipelined
update first, which changes nothing numerically: the same per-unit updates run, earlier.
Resume verifies checksums while it reads, and falls back to the previous checkpoint (with a
warning) when the latest is damaged (ckpt.py).

Signals: while run() runs in the main thread, the first SIGINT or SIGTERM lets the current
step finish, writes a checkpoint (when ckpt_dir is set and the step has none yet) and raises
Interrupted at that step boundary; a second one raises Interrupted at once (mid-step, or
mid-write: a checkpoint being written is abandoned under its temporary name, so the last
complete one stays intact). The CLI exits 128 + the signal number (130, 143).

Non-finite steps (the trainer's on_nonfinite): a skipped step is logged ("skipped" in the
JSON line, a message); 'stop' raises NonFiniteError out of run().
"""
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from horizon_exec import ckpt as ckpt_mod
from horizon_exec.lr import CosineSchedule
from horizon_sim.errors import HorizonError


@dataclass(kw_only=True, slots=True)
class LoopConfig:
    steps: int
    """Total optimizer steps of the run (a resumed run continues up to this)."""
    schedule: CosineSchedule
    eval_every: int = 0
    """Eval every N steps; 0: only after the last step. No eval without held-out data or
    with eval_batches = 0."""
    eval_batches: int = 4
    ckpt_dir: str | None = None
    ckpt_every: int = 0
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
    """Stop at a step boundary on SIGINT/SIGTERM (module docstring); only from the main thread."""

    def __post_init__(self):
        for f in ("steps",):
            if getattr(self, f) <= 0:
                raise HorizonError(f"{f}={getattr(self, f)} must be positive")
        for f in ("eval_every", "eval_batches", "ckpt_every", "keep_ckpts"):
            if getattr(self, f) < 0:
                raise HorizonError(f"{f.replace('_', '-')}={getattr(self, f)} must be >= 0")


class Interrupted(KeyboardInterrupt):
    """run() stopped on a signal: at a step boundary (first signal; `checkpoint` is the last
    one written, possibly just now) or at once (second signal: `immediate`)."""

    def __init__(self, signum: int, step: int, checkpoint, immediate: bool):
        self.signum, self.step, self.checkpoint, self.immediate = signum, step, checkpoint, immediate
        name = signal.Signals(signum).name
        where = (f"aborted during step {step + 1}" if immediate else f"stopped after step {step}")
        ck = f"; last checkpoint {checkpoint}" if checkpoint else "; no checkpoint (no ckpt_dir)"
        super().__init__(f"{name}: {where}{ck}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class TrainLoop:
    def __init__(self, trainer, dataset, cfg: LoopConfig, seed: int = 0, out=print):
        self.tr, self.ds, self.cfg, self.seed = trainer, dataset, cfg, seed
        self.out = out  # where one-line messages go (the progress bar's writer while it runs)
        pol = trainer.policy
        if dataset.data.seq != pol.seq:
            raise HorizonError(f"data packed to {dataset.data.seq} tokens, the policy runs {pol.seq}")
        if dataset.max_id >= trainer.model.vocab:
            raise HorizonError(f"token id {dataset.max_id} from the tokenizer does not fit the model's "
                               f"vocab of {trainer.model.vocab}")
        self.batches = dataset.batches(pol.batch, seed)
        self.eval_set = dataset.eval_batches(pol.batch, cfg.eval_batches) if cfg.eval_batches else []
        self.fingerprint = dataset.fingerprint()
        self.step = 0
        if pol.doc_masks != dataset.data.doc_masks:
            raise HorizonError(f"the policy has doc_masks={pol.doc_masks}, the data was packed with "
                               f"doc_masks={dataset.data.doc_masks}")
        # Under document masks a token attends to its document: model FLOPs use the data's
        # mean document length.
        ctx = dataset.mean_doc_tokens if pol.doc_masks else 0
        self.flops_per_step = trainer.model.model_flops_per_token(pol.seq, ctx) * pol.tokens
        self.losses: dict[int, float] = {}       # step -> training loss
        self.evals: dict[int, float] = {}        # step (steps done) -> eval loss
        self.last = None
        self._times: list[float] = []
        self.last_ckpt: tuple[int, object] | None = None  # (step, folder) of the last checkpoint written
        self.skipped: list[int] = []   # steps (1-based) whose update was skipped as non-finite
        self._signal: int | None = None

    # ---- state ----------------------------------------------------------------------------
    def state(self) -> dict:
        return {"step": self.step, "data": self.batches.state_dict(), "data_fingerprint": self.fingerprint,
                "data_source": self.ds.source, "seed": self.seed, "schedule": self.cfg.schedule.to_dict()}

    def save(self) -> Path:
        p = ckpt_mod.save_checkpoint(self.cfg.ckpt_dir, self.tr, self.step, self.state(),
                                     keep=self.cfg.keep_ckpts)
        self.last_ckpt = (self.step, p)
        return p

    def resume(self, path) -> Path:
        """Restore trainer and loop from a checkpoint folder (or a ckpt_dir's latest, falling
        back to older ones when it is damaged); checksums are verified while reading."""
        def check(p, meta):
            st = meta.get("loop", {})
            if st.get("data_fingerprint") != self.fingerprint:
                raise HorizonError(f"{p}: checkpoint was trained on different data (or tokenizer, seq or split) "
                                   f"than {self.ds.source}; resume with the same data")
            self.batches.load_state_dict(st["data"])  # checks the seed before anything changes

        meta = ckpt_mod.load_checkpoint(path, self.tr, check=check, warn=self.out)
        p = Path(meta["path"])
        self.step = int(meta["step"])
        self.last_ckpt = (self.step, p)
        sched = meta.get("loop", {}).get("schedule")
        if sched != self.cfg.schedule.to_dict():
            self.out(f"note: lr schedule differs from the checkpoint's ({sched} -> "
                     f"{self.cfg.schedule.to_dict()}); the run continues on the new one")
        a = self.tr.runner.adamw
        opt = {"betas": list(a.betas), "eps": a.eps, "weight_decay": a.weight_decay}
        if meta.get("optimizer") != opt:
            self.out(f"note: optimizer settings differ from the checkpoint's ({meta.get('optimizer')} -> {opt})")
        return p

    # ---- running --------------------------------------------------------------------------
    def evaluate(self) -> float | None:
        """Mean token loss over the held-out batches (None without any)."""
        if not self.eval_set:
            return None
        total, n = 0.0, 0
        for b in self.eval_set:
            s, k = self.tr.eval_loss(b.tokens, b.labels, b.docs)
            total, n = total + s, n + k
        return total / max(1, n)

    def _rate(self) -> tuple[float, float]:
        """(tokens/s, model FLOP/s) over the last log_window steps."""
        w = self._times[-self.cfg.log_window:]
        secs = sum(w)
        if secs <= 0:
            return float("nan"), float("nan")
        return len(w) * self.tr.policy.tokens / secs, len(w) * self.flops_per_step / secs

    def _log(self, rec: dict) -> None:
        if self.cfg.log_file:
            with open(self.cfg.log_file, "a") as f:
                f.write(json.dumps(rec) + "\n")

    # ---- signals ---------------------------------------------------------------------------
    def _install_signals(self):
        """Handlers for SIGINT/SIGTERM (main thread only); returns the previous ones."""
        if not self.cfg.handle_signals or threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum, frame):
            if self._signal is None:
                self._signal = signum
                # os.write, not print: the handler may run in the middle of a print
                msg = (f"\n{signal.Signals(signum).name} received: stopping at the next step boundary "
                       f"(with a checkpoint when ckpt_dir is set); send it again to abort now\n")
                try:
                    os.write(2, msg.encode())
                except OSError:
                    pass
                return
            ck = self.last_ckpt[1] if self.last_ckpt else None
            raise Interrupted(signum, self.step, ck, immediate=True)

        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, handler)
        return old

    def _stop_at_boundary(self, write):
        """The first signal arrived: checkpoint this step (unless it has one) and stop."""
        if self.cfg.ckpt_dir and self.step > 0 and (self.last_ckpt is None or self.last_ckpt[0] != self.step):
            p = self.save()
            write(f"step {self.step}: checkpoint {p}")
        ck = self.last_ckpt[1] if self.last_ckpt else None
        raise Interrupted(self._signal, self.step, ck, immediate=False)

    def run(self, until: int | None = None):
        """Train steps self.step .. min(until, steps) - 1; returns the last StepResult."""
        cfg, tr = self.cfg, self.tr
        end = cfg.steps if until is None else min(until, cfg.steps)
        bar = None
        if cfg.progress and self.step < end:
            from tqdm import tqdm
            bar = tqdm(total=cfg.steps, initial=self.step, unit="step", dynamic_ncols=True)
        write = bar.write if bar is not None else self.out
        self._signal = None
        old = self._install_signals()
        try:
            while self.step < end:
                if self._signal is not None:
                    self._stop_at_boundary(write)
                s = self.step
                t0 = time.perf_counter()
                b = next(self.batches)
                lr = cfg.schedule(s)
                res = tr.step(b.tokens, b.labels, docs=b.docs, lr=lr)
                self._times.append(time.perf_counter() - t0)
                self.step = s + 1
                self.losses[s] = res.loss
                self.last = res
                tok_s, flop_s = self._rate()
                rec = {"step": self.step, "loss": res.loss, "lr": lr, "grad_norm": res.grad_norm,
                       "tokens_per_s": tok_s, "model_tflops": flop_s / 1e12}
                if cfg.peak_flops:
                    rec["mfu"] = flop_s / cfg.peak_flops
                if res.skipped:
                    self.skipped.append(self.step)
                    rec.update(skipped=True, nonfinite=res.nonfinite)
                    write(f"step {self.step}: non-finite {res.nonfinite}: update skipped, weights and optimizer state "
                          f"unchanged ({tr.skipped_steps} skipped so far)")
                self._log(rec)
                if bar is not None:
                    post = {"loss": f"{res.loss:.4f}", "lr": f"{lr:.2e}", "tok/s": f"{tok_s:,.0f}"}
                    post.update({"MFU": f"{100 * rec['mfu']:.3g}%"} if cfg.peak_flops else
                                {"TFLOP/s": f"{flop_s / 1e12:.3g}"})
                    bar.set_postfix(post, refresh=False)
                    bar.update(1)
                if self._signal is not None:
                    self._stop_at_boundary(write)
                last = self.step == cfg.steps
                if self.eval_set and ((cfg.eval_every and self.step % cfg.eval_every == 0) or last):
                    ev = self.evaluate()
                    self.evals[self.step] = ev
                    self._log({"step": self.step, "eval_loss": ev})
                    write(f"step {self.step}: eval loss {ev:.4f} ({len(self.eval_set)} batches)")
                if cfg.ckpt_dir and ((cfg.ckpt_every and self.step % cfg.ckpt_every == 0) or last):
                    p = self.save()
                    write(f"step {self.step}: checkpoint {p}")
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
            if bar is not None:
                bar.close()
        return self.last

    @property
    def tokens_per_s(self) -> float:
        secs = sum(self._times)
        return len(self._times) * self.tr.policy.tokens / secs if secs > 0 else float("nan")

    @property
    def model_flops_per_s(self) -> float:
        secs = sum(self._times)
        return len(self._times) * self.flops_per_step / secs if secs > 0 else float("nan")
