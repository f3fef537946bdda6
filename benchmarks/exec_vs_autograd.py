"""Benchmark: the streaming executor against plain autograd on the same model (CPU backend).

Model: Llama-style, 8 layers, hidden 512, 8 heads, SwiGLU 1376, vocab 32000 (Llama-2's), one
step = 4 x 512 tokens, compute in `horizon train`'s default dtype for this CPU (--compute-dtype
auto: bf16 where the CPU has bf16 matrix instructions, fp32 elsewhere, where bf16 GEMMs run tens
of times slower; printed on the model line). Executor: the planner's policy for this model on
this machine, as `horizon train` without policy flags chooses it (priced with --hardware FILE,
else this machine's calibration or a quick estimate; clip 1.0), each knob flag given
(--keep-activations L|all, --micro-batches, --act-ckpt-every, ...) pinning its field and
--no-search for Policy's defaults (fp32 master + Adam on the host, bf16 working copy, pipelined
optimizer, K=1, 2 slots, checkpoints on the host); the policy line says what ran; its cores as --compute-threads says (default auto: the planner's split for this step,
priced with --hardware FILE when given, printed as 'cores: ...').
Baseline: the same model as a plain nn.Module (the same block code, whole-model autograd) with
fp32 parameters (under torch.autocast(bfloat16) when the compute dtype is bf16), torch.optim.AdamW(fused=True) and
clip_grad_norm_, on as many intra-op threads as the executor's compute lane (all the cores when
the split gives compute all of them), in a child process pinned to the same cores (one OpenMP
team per process: libgomp slows every team of a process whose team threads outnumber its cores).

Prints (medians of repeated steps, all measured in this one run):
  ratio exec/autograd: X.XX          autograd step time / executor step time (target >= 0.70)
  compute floor: X.XXXs a step       the step's GEMMs and attention, forward and backward once,
                                     at the kernel rates this machine's description measured
                                     (compute_floor.py): no trainer's step is shorter at
                                     those rates, so autograd's step over it bounds the ratio
  minor page faults a step: ...      the process's page faults (getrusage) in each side's step:
                                     memory the kernel maps anew, and the kernel's CPU seconds
                                     (summed over threads). Plain autograd on glibc's
                                     allocator maps its larger temporaries afresh each step (the
                                     fp32 logits alone are 262 MB), the executor reuses its
                                     buffers; that cost, and so the ratio, varies with the VM's
                                     memory state (docs/results.md)
  optimizer hiding: X.XX             executor step time with / without its optimizer ops
                                     (pipelined; target <= 1.10)
  executor step with torch's AdamW path / with the native kernel: X.XX
                                     the whole step, the AdamW op on the fallback path against
                                     native/adamw.c (paired per round)
  optimizer rate / torch fused AdamW direct: X.XX
                                     parameters/s of the schedule's OPTIMIZER ops run by the
                                     engine (flush(): every unit on the CPU lane, timed from the
                                     first op's start to the last op's end in the measured
                                     timeline, so the gaps between ops count) / parameters/s of
                                     torch._fused_adamw_ called directly on the same flat buffers
                                     (one multi-tensor call, same thread setup; target >= 0.95).
                                     The baseline is given its best case: fp32 gradients ready
                                     (no widening; in the same kind of memory as the store,
                                     huge pages unless HORIZON_HUGE_PAGES=0), no working copy to
                                     refresh, and clipping folded into the gradients beforehand
                                     (with grad_scale, torch's kernel also writes the gradient
                                     back). The engine's op does all of that in one pass
                                     (native/adamw.c). Also
                                     printed: flush()'s wall time (adds the run's fixed cost),
                                     the op against that same work done directly with torch
                                     (widen + fused AdamW + refresh), the op on torch's path
                                     (kernel='torch', the fallback), and the op under a policy
                                     where it is the Adam update alone (fp32 host grads, no
                                     working copy; still the native kernel).
Run: .venv/bin/python benchmarks/exec_vs_autograd.py [--steps 5] [--layers 8] ...
     --optimizer-only skips the step timings and prints only the optimizer lines, e.g. at
     7B-like layer sizes where a full CPU step would take minutes:
     ... --optimizer-only --layers 4 --hidden 2048 --heads 16 --ffn 5504 --batch 2 --seq 64
"""
import argparse
import dataclasses
import multiprocessing as mp
import os
import resource
import statistics
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from horizon_exec.optim import native
from horizon_exec.device.hugepages import host_bytes
from horizon_exec.model.block import DecoderBlock
from horizon_exec.model.layers import rms_norm
from horizon_exec.model.rope import rope_tables
from horizon_exec.model.layout import block_layout
from horizon_exec.optim.adamw import clip_coef
from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import Holds, Lane, OpKind
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from compute_floor import compute_floor
from horizon_flags import add_shape_flags, add_horizon_flags, hardware_of, horizon_side


class PlainLM(nn.Module):
    """The baseline: the executor's block template as an ordinary nn.Module."""

    def __init__(self, spec: ModelSpec, seq: int):
        super().__init__()
        self.spec = spec
        self.block = DecoderBlock(spec)
        self.emb = nn.Parameter(torch.randn(spec.vocab, spec.hidden) * 0.02)
        lay = block_layout(spec)
        self.keys = [e.name for e in lay.entries]
        self.layers = nn.ModuleList()
        for _ in range(spec.n_layers):
            m = nn.Module()
            for e in lay.entries:
                init = torch.ones(e.shape) if e.name.endswith("norm.weight") else torch.randn(e.shape) * 0.02
                m.register_parameter(e.name.replace(".", "_"), nn.Parameter(init))
            self.layers.append(m)
        self.norm = nn.Parameter(torch.ones(spec.hidden))
        self.lm_head = nn.Parameter(torch.randn(spec.vocab, spec.hidden) * 0.02)
        cos, sin = rope_tables(spec, seq, torch.float32, "cpu")
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, tokens):
        x = F.embedding(tokens, self.emb)                                   # (B, T, H) fp32
        for m in self.layers:
            w = {k: getattr(m, k.replace(".", "_")) for k in self.keys}
            x = self.block(w, x, self.cos, self.sin)
        logits = F.linear(rms_norm(x, self.norm, self.spec.norm_eps), self.lm_head).float()
        return F.cross_entropy(logits[:, :-1].reshape(-1, self.spec.vocab), tokens[:, 1:].reshape(-1))


class AutogradStep:
    """One baseline step on the executor's compute cores with as many intra-op threads, in a
    process of its own: its OpenMP team never shares a process with the executor's, where
    libgomp would cut both teams' spin-waits for outnumbering the cores (device/cpu.py)."""

    def __init__(self, spec, pol, cores, threads):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_baseline, args=(child, spec.to_dict(), pol.to_dict(), sorted(cores), threads),
                                 daemon=True)
        self._proc.start()

    def __call__(self) -> tuple[float, tuple[int, float]]:
        """(the step's seconds, (its minor page faults, the kernel's CPU seconds)), as faulted()."""
        self._conn.send("step")
        return self._conn.recv()

    def close(self) -> None:
        self._conn.send(None)
        self._proc.join(timeout=60)


def _baseline(conn, spec: dict, pol: dict, cores: list[int], threads: int) -> None:
    """The baseline's process: a plain model and torch's fused AdamW, a step per request."""
    spec, pol = ModelSpec.from_dict(spec), Policy.from_dict(pol)
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)
    model = PlainLM(spec, pol.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    bf16 = pol.compute_dtype == "bf16"

    def step() -> float:
        tokens = torch.randint(0, spec.vocab, (pol.batch, pol.seq))
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), pol.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    while conn.recv() is not None:
        conn.send(faulted(step))


def _config(a) -> TrainerConfig:
    """The executor's settings of both runs: lr 1e-4, --compute-threads (auto: priced with --hardware)."""
    hw = hardware_of(a)
    return TrainerConfig(optimizer=OptimizerConfig(lr=1e-4), runtime=RuntimeConfig(compute_threads=a.compute_threads),
                         admission=AdmissionConfig(hardware=hw))


def exec_step(tr, skip=frozenset()) -> float:
    p = tr.policy
    return tr.step(torch.randint(0, tr.model.vocab, (p.batch, p.seq)), skip_kinds=skip).step_s


PAGE_B = os.sysconf("SC_PAGE_SIZE")
"""Bytes a minor fault maps (a base page: a fault on a huge page maps more, so the GB printed is a floor)."""


def faulted(fn):
    """(fn(), (the process's minor page faults, its kernel CPU seconds) while it ran): pages the
    kernel mapped anew, and what the kernel spent, mostly on those faults."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    out = fn()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return out, (r1.ru_minflt - r0.ru_minflt, r1.ru_stime - r0.ru_stime)


def _on_cpu_lane(tr, fn):
    """Run fn in a fresh thread set up exactly like the executor's CPU (optimizer) lane."""
    out = {}

    def body():
        tr.backend.start_lane(Lane.CPU)
        out["v"] = fn()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out["v"]


def optimizer_rates(tr, reps):
    """Parameters/s, interleaved reps, of: the schedule's OPTIMIZER ops run by the
    engine (span in the measured timeline, and flush's wall time); the same with the AdamW op
    on torch's path; torch._fused_adamw_ alone on the same flat buffers (all units in one
    multi-tensor call, grads already fp32 and clipped); and the same work as the op done
    directly with torch (widen bf16 grads, fused AdamW, refresh the working copy, multi-tensor
    each). The direct calls run in a thread set up like the CPU lane."""
    n_params = sum(o.params for o in tr.sched.ops if o.kind == OpKind.OPTIMIZER)
    units = tr.units
    params = [tr.store.of(Holds.MASTER, u) for u in units]
    host_grads = [tr.buffers.find(Holds.HOST_GRAD, unit=u) for u in units]
    coef = clip_coef(tr.policy.grad_clip, tr.store.scalar(Holds.GRAD_NORM))  # the same clipped update
    # fp32 and clipped, the kernel's best case; in the same kind of memory as the store's
    grads = [host_bytes(4 * g.numel()).view(torch.float32).copy_(g.float() * coef) for g in host_grads]
    wcs = [tr.store.of(Holds.WORKING_COPY, u) for u in units if tr.store.has(Holds.WORKING_COPY, u)]
    mom = [tr.store.moments(u) for u in units]
    steps = [torch.ones((), dtype=torch.float32) for _ in units]
    kw = dict(lr=1e-4, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    scale = torch.tensor(1.0 / coef) if coef < 1.0 else None

    def kernel():
        torch._fused_adamw_(params, grads, [m for m, _ in mom], [v for _, v in mom], [], steps, **kw)

    def same_work():
        if host_grads[0].dtype != torch.float32:
            torch._foreach_copy_(grads, host_grads)
        torch._fused_adamw_(params, grads, [m for m, _ in mom], [v for _, v in mom], [], steps,
                            grad_scale=scale, **kw)
        if wcs:
            torch._foreach_copy_(wcs, params)

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def engine(adamw):
        tr.runner.adamw = adamw
        tr.pending = True  # re-apply the last gradients: the work of a pipelined step's optimizer
        t0 = time.perf_counter()
        rows = tr.flush()
        wall = time.perf_counter() - t0
        return max(e for _, _, e in rows) - min(s for _, s, _ in rows), wall

    native_opt = tr.runner.adamw
    torch_opt = dataclasses.replace(native_opt, kernel="torch")
    t = {k: [] for k in ("engine", "engine_wall", "engine_torch", "kernel", "same")}
    for _ in range(reps):
        span, wall = engine(native_opt)
        t["engine"].append(span)
        t["engine_wall"].append(wall)
        if not tr.policy.split_master:  # a split master has no torch path
            t["engine_torch"].append(engine(torch_opt)[0])
        t["kernel"].append(_on_cpu_lane(tr, lambda: timed(kernel)))
        t["same"].append(_on_cpu_lane(tr, lambda: timed(same_work)))
    tr.runner.adamw = native_opt
    return {k: [n_params / x for x in v] for k, v in t.items()}  # parameters/s, one per rep


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_flags(ap)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=2)
    add_horizon_flags(ap)
    ap.add_argument("--optimizer-only", action="store_true",
                    help="only the optimizer-rate lines (one step first, to have gradients)")
    a = ap.parse_args()
    spec = ModelSpec(name="bench-llama", n_layers=a.layers, hidden=a.hidden, n_heads=a.heads,
                     n_kv_heads=a.heads, ffn_hidden=a.ffn, vocab=a.vocab)
    side = horizon_side(a, batch=a.batch, seq=a.seq)
    pol, why = side.policy_for(spec)
    print(why)
    tr = Trainer(spec, pol, _config(a))
    threads = tr.backend.compute_threads
    print(f"model {spec.n_layers}x{spec.hidden} (ffn {spec.ffn_hidden}, vocab {spec.vocab}), "
          f"{spec.total_params / 1e6:.1f}M params, {pol.batch}x{pol.seq} tokens/step, {pol.compute_dtype} compute "
          f"({side.dtype_why}), "
          f"compute threads {threads}, host lane cores {tr.backend.host_cores}")
    print(f"cores: {tr.backend.split_why}")
    if a.optimizer_only:
        with tr:
            exec_step(tr)
            rates = optimizer_rates(tr, 4 * a.steps + 1)
        print_optimizer_rates(rates, lean_optimizer_rates(spec, pol, a))
        return
    auto = AutogradStep(spec, pol, tr.backend.compute_cores, threads)
    times = {"exec": [], "noopt": [], "auto": [], "exec_torch_adamw": []}
    faults = {"exec": [], "auto": []}
    native_opt = tr.runner.adamw
    torch_opt = dataclasses.replace(native_opt, kernel="torch")
    # A split master has no torch path (its low halves need the native kernel): no pair to time.
    kinds = ("exec",) if pol.split_master else ("exec", "exec_torch_adamw")
    with tr:
        # Interleaved rounds, so load from anything else on the machine hits all alike.
        for r in range(a.warmup + a.steps):
            t = {}
            for k in kinds[::1 if r % 2 else -1]:  # each goes first in turn
                tr.runner.adamw = torch_opt if k == "exec_torch_adamw" else native_opt
                t[k], f = faulted(lambda: exec_step(tr))
                if k == "exec" and r >= a.warmup:
                    faults["exec"].append(f)
            tr.runner.adamw = native_opt
            t["noopt"] = exec_step(tr, frozenset({OpKind.OPTIMIZER}))
            t["auto"], f = auto()
            if r >= a.warmup:
                faults["auto"].append(f)
                for k, v in t.items():
                    times[k].append(v)
        # the rates re-apply the last step's gradients, which only the pipelined mode holds past its step
        rates = None if pol.split_master or pol.optimizer != "pipelined" else optimizer_rates(tr, 4 * a.steps + 1)
    auto.close()
    t_exec, t_noopt, t_auto = (statistics.median(times[k]) for k in ("exec", "noopt", "auto"))
    lean_rates = lean_optimizer_rates(spec, pol, a)

    print(f"executor step {t_exec:.3f}s ({pol.tokens / t_exec:,.0f} tok/s), without optimizer "
          f"{t_noopt:.3f}s; autograd step {t_auto:.3f}s ({pol.tokens / t_auto:,.0f} tok/s)")
    print(f"ratio exec/autograd: {t_auto / t_exec:.2f}")
    print(floor_line(compute_floor(spec, pol, tr.config.admission.hardware, threads), t_exec, t_auto))
    (fe, se), (fa, sa) = ((statistics.median(f for f, _ in faults[k]), statistics.median(s for _, s in faults[k]))
                          for k in ("exec", "auto"))
    print(f"minor page faults a step: executor {fe:,.0f} (>= {fe * PAGE_B / 1e9:.2f} GB mapped anew, kernel CPU "
          f"{se:.2f} s), autograd {fa:,.0f} (>= {fa * PAGE_B / 1e9:.2f} GB, kernel CPU {sa:.2f} s)")
    print(f"optimizer hiding: {t_exec / t_noopt:.2f}")
    if times["exec_torch_adamw"]:
        print(f"executor step with torch's AdamW path / with the native kernel: "
              f"{statistics.median(x / y for x, y in zip(times['exec_torch_adamw'], times['exec'])):.2f}")
    else:
        print("executor step with torch's AdamW path: n/a (the split master runs on the native kernel only; "
              "--master-dtype fp32 to time it)")
    if rates is None:
        # The rate lines compare the op with torch's fused AdamW on the same fp32 master; a split
        # master has no such twin, so they are measured on the same policy with the fp32 master;
        # and they re-apply a step's gradients, which another optimizer mode frees within its step.
        why = []
        if pol.split_master:
            why.append("--master-dtype fp32: a split master has no torch twin to compare with")
        if pol.optimizer != "pipelined":
            why.append(f"--optimizer pipelined: {pol.optimizer} frees the gradients within its step")
        print(f"optimizer rates below: the same policy with {'; '.join(why)}")
        with Trainer(spec, rates_policy(pol), _config(a)) as tr2:
            exec_step(tr2)
            rates = optimizer_rates(tr2, 4 * a.steps + 1)
    print_optimizer_rates(rates, lean_rates)


def floor_line(floor, t_exec: float, t_auto: float) -> str:
    """The step's compute floor (compute_floor.py) and each side's step over it: autograd's
    step / the floor is the highest exec/autograd ratio any policy could reach in this run at
    the measured kernel rates."""
    if floor.why:
        return f"compute floor: n/a ({floor.why})"
    return (f"compute floor: {floor.seconds:.3f}s a step (its GEMMs and attention once each way at this machine's "
            f"measured rates); executor {t_exec / floor.seconds:.2f}x it, autograd {t_auto / floor.seconds:.2f}x: "
            f"a ratio exec/autograd above {t_auto / floor.seconds:.2f} needs GEMMs faster than measured")


def rates_policy(pol):
    """`pol` as the optimizer-rate lines measure it: an fp32 master, the pipelined mode (it holds
    a step's gradients until the next step, which the rates re-apply)."""
    return dataclasses.replace(pol, split_master=False, optimizer="pipelined")


def lean_optimizer_rates(spec, pol, a):
    lean = dataclasses.replace(rates_policy(pol), working_copy=False, micro_batches=2)  # op = the Adam update alone
    with Trainer(spec, lean, _config(a)) as tr2:
        exec_step(tr2)
        return optimizer_rates(tr2, 4 * a.steps + 1)


def print_optimizer_rates(r, q):
    """Each ratio is the median over reps of the two rates measured side by side in that rep
    (drift on a shared machine cancels); the Mparam/s figures are plain medians."""
    def ratio(d, a, b="kernel"):
        return statistics.median(x / y for x, y in zip(d[a], d[b]))

    def mps(d, k):
        return f"{statistics.median(d[k]) / 1e6:,.0f}"

    print(f"optimizer kernel: {native.status()}")
    print(f"optimizer rate / torch fused AdamW direct: {ratio(r, 'engine'):.2f} "
          f"(engine {mps(r, 'engine')} vs kernel {mps(r, 'kernel')} Mparam/s; the op also "
          "widens bf16 host grads, clips, and refreshes the bf16 working copy)")
    print(f"  flush() wall time, the run's fixed cost included: {ratio(r, 'engine_wall'):.2f}")
    print(f"  vs the same work done directly with torch (widen + fused AdamW + refresh): "
          f"{ratio(r, 'engine', 'same'):.2f}")
    if r["engine_torch"]:
        print(f"  the op on torch's path (kernel='torch', the fallback): {ratio(r, 'engine_torch'):.2f}")
    print(f"  Adam update alone (fp32 host grads, no working copy): {ratio(q, 'engine'):.2f} "
          f"(engine {mps(q, 'engine')} vs kernel {mps(q, 'kernel')} Mparam/s)")


if __name__ == "__main__":
    main()
