"""Trainer: the executor's Python API. Builds the schedule for (model, policy), allocates the
host store and the device arena, and runs one schedule per optimizer step.

    tr = Trainer(model, policy, lr=3e-4, device="cpu", seed=0)
    res = tr.step(tokens)          # tokens: LongTensor (batch, seq)
    res.loss, res.grad_norm, res.timeline, res.device_peak_bytes, res.rss_peak_bytes
    tr.flush()                     # pipelined optimizer: apply the last step's gradients
    tr.state_dict()                # master weights by transformers names (views, fp32)

Pipelined mode: ops marked prev_step apply the previous step's gradients at the start of the
next step, so after `step()` the master weights lag one update until the next step or
`flush()`; the loss of step n is still computed with the weights after n-1 updates.
"""
import resource
import sys
import time
import weakref
from dataclasses import dataclass

import pandas as pd
import torch

from horizon_exec.arena import DeviceArena
from horizon_exec.backend import make_backend
from horizon_exec.buffers import BufferTable
from horizon_exec.engine import Engine
from horizon_exec.errors import ExecError
from horizon_exec.layout import host_layout, unit_name
from horizon_exec.ops import OpRunner
from horizon_exec.optim import AdamW
from horizon_exec.store import HostStore
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import EMBED, build_schedule
from horizon_sim.sim.timeline import timeline_frame
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

INIT_STD = 0.02  # transformers' initializer_range default for Llama/Qwen2


@dataclass(frozen=True, slots=True)
class StepResult:
    loss: float
    """Mean next-token cross-entropy over every labelled token of the step."""
    grad_norm: float
    """Global gradient norm before clipping."""
    timeline: pd.DataFrame
    """One row per op that ran (horizon_sim.sim.timeline columns), seconds from step start,
    plus temp_peak_bytes: the measured peak of a compute op's device temporaries (CPU backend;
    the measured counterpart of Op.workspace_bytes), 0 for other ops."""
    device_peak_bytes: int
    """Device memory peak over the step: arena buffers + measured op temporaries (CPU), or the
    caching allocator's peak (CUDA)."""
    rss_peak_bytes: int
    """Process peak resident set size so far."""
    step_s: float
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s if self.step_s > 0 else float("nan")


def _shutdown(engine, backend) -> None:
    engine.close()
    backend.close()


def rss_peak_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


class Trainer:
    """Streams `model` through the device under `policy` (see module docstring).

    lr, weight_decay, betas, eps: AdamW (decoupled decay on every parameter, like
    torch.optim.AdamW over model.parameters()); `lr` can be changed between steps.
    device: 'cpu' or 'cuda[:N]'. seed: weight init. device_budget_bytes: arena budget (None:
    unlimited). CPU backend only: compute_threads (intra-op threads of the compute lane;
    default cores - 1), pin_cores (compute lane on its own cores, the other lanes on the
    rest), track_memory (measure op temporaries). timeout_s: longest wait for a dependency
    or a single op before the step fails instead of hanging.
    """

    def __init__(self, model: ModelSpec, policy: Policy, *, lr: float = 1e-3, weight_decay: float = 0.0,
                 betas=(0.9, 0.999), eps: float = 1e-8, device: str = "cpu", seed: int = 0,
                 device_budget_bytes: int | None = None, compute_threads: int | None = None,
                 pin_cores: bool = True, track_memory: bool = True, timeout_s: float = 600.0):
        if policy.seq < 2:
            raise HorizonError(f"policy seq={policy.seq}: training needs sequences of at least 2 tokens")
        if policy.states_dtype != policy.master_dtype:
            raise HorizonError(f"policy states_dtype={policy.states_dtype} with master_dtype="
                               f"{policy.master_dtype}: torch's fused AdamW needs the Adam moments in "
                               "the master dtype; use the same dtype for both")
        self.model, self.policy = model, policy
        self.sched = build_schedule(model, policy)
        kw = dict(compute_threads=compute_threads, pin_cores=pin_cores, track_memory=track_memory)
        self.backend = make_backend(device, **kw) if device == "cpu" else make_backend(device)
        self.store = HostStore(self.sched, model, self.backend)
        self.arena = DeviceArena(self.backend, device_budget_bytes)
        self.buffers = BufferTable(self.sched, model, policy, self.store, self.arena, self.backend)
        self.runner = OpRunner(model=model, policy=policy, buffers=self.buffers,
                               store=self.store, arena=self.arena, backend=self.backend,
                               adamw=AdamW(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.units = [EMBED, *range(model.n_layers), model.n_layers]
        self._params = {}  # transformers name -> view of the master store
        for u in self.units:
            flat = self.store.t[f"master.{unit_name(model, u)}"]
            self._params.update(host_layout(model, u).views(flat))
        self.init_weights(seed)
        self.engine = Engine(self.backend, self.runner, timeout_s=timeout_s)
        # Lane threads stop (and CUDA host memory is unregistered) with the trainer, even
        # without close(); the finalizer holds no reference to the trainer itself.
        self._finalizer = weakref.finalize(self, _shutdown, self.engine, self.backend)
        self.pending = False  # pipelined: the last step's gradients are not applied yet
        self.steps_done = 0
        self.failed: str | None = None

    # ---- weights ----------------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """transformers-style init from `seed`: matrices N(0, 0.02), norms 1, biases 0."""
        gen = torch.Generator().manual_seed(seed)
        for name, t in self._params.items():
            if name.endswith("norm.weight"):
                t.fill_(1.0)
            elif name.endswith(".bias"):
                t.zero_()
            else:
                t.copy_(torch.randn(t.shape, generator=gen) * INIT_STD)
        self._refresh_working_copy()

    def _refresh_working_copy(self) -> None:
        for u in self.units:
            wc = f"wc.{unit_name(self.model, u)}"
            if wc in self.store:
                self.store.t[wc].copy_(self.store.t[f"master.{unit_name(self.model, u)}"])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Master weights by transformers names: views into the host store (no lm_head.weight
        when tied). Copy them before stepping again if you keep them."""
        return dict(self._params)

    @torch.no_grad()
    def load_state_dict(self, sd: dict) -> None:
        missing = [n for n in self._params if n not in sd]
        if missing:
            raise HorizonError(f"state dict lacks {len(missing)} parameter(s), e.g. {missing[0]!r}")
        for name, t in self._params.items():
            t.copy_(sd[name])
        self._refresh_working_copy()
        self.pending = False  # gradients of the old weights must not update the new ones

    @property
    def lr(self) -> float:
        return self.runner.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.runner.lr = float(value)

    # ---- running ----------------------------------------------------------------------------
    def _check_usable(self):
        if self.failed:
            raise ExecError(f"the trainer failed earlier and its state is inconsistent: {self.failed}")

    def _run(self, ops, skip=frozenset()):
        try:
            return self.engine.run(ops, len(self.sched.ops), skip)
        except ExecError as e:
            self.failed = str(e)
            self.buffers.clear_dynamic()
            raise

    def step(self, tokens: torch.Tensor, skip_kinds=frozenset()) -> StepResult:
        """One optimizer step on tokens (batch, seq) (int64, ids < vocab). `skip_kinds`
        (measurement only, e.g. {OpKind.OPTIMIZER} to see what the optimizer costs): op kinds
        not run this step; the step is then not a training step."""
        self._check_usable()
        p = self.policy
        if tuple(tokens.shape) != (p.batch, p.seq):
            raise HorizonError(f"tokens have shape {tuple(tokens.shape)}; the policy wants ({p.batch}, {p.seq})")
        tokens = tokens.to(torch.int64).cpu().contiguous()
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.model.vocab):
            raise HorizonError(f"token ids must lie in [0, {self.model.vocab})")
        self.runner.begin_step(tokens)
        self.runner.temp_peak.clear()
        self.backend.reset_peak(self.arena)
        skip = {o.id for o in self.sched.ops if (o.prev_step and not self.pending) or o.kind in skip_kinds}
        t0 = time.perf_counter()
        rows = self._run(self.sched.ops, skip)
        step_s = time.perf_counter() - t0
        self.pending = p.optimizer == "pipelined"
        self.steps_done += 1
        ops, starts, ends = zip(*rows)
        timeline = timeline_frame(ops, starts, ends)
        timeline["temp_peak_bytes"] = [self.runner.temp_peak.get(o.id, 0) for o in ops]
        return StepResult(loss=self.runner.loss(), grad_norm=self.store.scalar("gnorm"),
                          timeline=timeline,
                          device_peak_bytes=self.backend.device_peak(self.arena),
                          rss_peak_bytes=rss_peak_bytes(), step_s=step_s, tokens=p.tokens)

    def flush(self) -> None:
        """Apply pending pipelined optimizer updates (the prev_step ops), so the master
        weights are final. A no-op in the other modes or when nothing is pending."""
        self._check_usable()
        if not self.pending:
            return
        self._run([o for o in self.sched.ops if o.prev_step])
        self.pending = False

    @property
    def host_store_bytes(self) -> int:
        return self.store.nbytes

    def close(self) -> None:
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
