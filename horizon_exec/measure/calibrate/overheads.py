"""Fixed per-op costs: a tiny model trained with its ops serialized, each op's own time less its
modelled work; the head's cost per loss chunk; an MoE block's extra fixed costs (its router's, and
per expert its loop runs: the Python dispatch and memory tracking of each expert's dozen kernels
forward and some thirty backward, which a dense block does not have); a block's extra fixed cost
per LoRA adapter; the runtime's RSS before model tensors."""
import statistics
from dataclasses import replace

import torch

from horizon_sim.schedule import Lane, OpKind, build_schedule
from horizon_sim.sim.costs import CostModel
from horizon_sim.sim.process_rss import allocator_retention_bytes, largest_transient_block
from horizon_sim.specs.hardware import HardwareSpec, tracked_kind
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB


# The tiny model whose serialized ops give the fixed per-op costs: every kernel of the
# template runs, on shapes so small that the work is microseconds.
TINY = ModelSpec(name="calibrate-tiny", n_layers=3, hidden=64, n_heads=4, n_kv_heads=2,
                 ffn_hidden=128, vocab=64)
TINY_POLICY = Policy(batch=1, seq=16, act_ckpt_every=2, slots=2, optimizer="pipelined")


def tiny_moe(experts: int) -> ModelSpec:
    """TINY with its MLP made `experts` experts of its width, top-2 (Mixtral's block: the
    attention half is TINY's, no q/k norms or biases, so the difference is the MLP's), on
    MOE_POLICY's 64 tokens: 128 routed rows, so every expert gets rows even from a skewed
    router (the loop skips an empty one)."""
    return replace(TINY, name=f"calibrate-tiny-moe{experts}", family="mixtral", n_experts=experts,
                   experts_per_token=2, expert_ffn_hidden=TINY.ffn_hidden, norm_topk_prob=True)


LORA_POLICY = replace(TINY_POLICY, lora_rank=4, optimizer="after")
"""TINY with LoRA adapters on every projection: its serialized ops against TINY's give each compute
kind's fixed cost per adapted projection ('<kind>_adapter')."""

MOE_POLICY = replace(TINY_POLICY, seq=64)
MOE_EXPERTS = (2, 8)
"""The two tiny MoE models whose serialized ops, against each other and against TINY's, give
each compute kind's per-expert fixed cost and the router's ('<kind>_expert', '<kind>_router')."""


class TinyProbe:
    """The tiny model trained in this process with its ops serialized (one op at a time across
    lanes, so each time is the op's own cost). The trainer stays up for the whole calibration
    and `sample()` runs a few steps at many points of it, so the Python-bound fixed costs, the
    noisiest figures on a shared machine, are averaged over the whole run."""

    def __init__(self, device: str, policy: Policy = TINY_POLICY, model: ModelSpec = TINY,
                 track_memory: str = "auto"):
        from horizon_exec.measure.probe import Serialized, sync_for
        from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
        from horizon_exec.runtime.trainer import Trainer
        self.policy, self.model = policy, model
        self.gen = torch.Generator().manual_seed(0)
        rt = RuntimeConfig(device=device, compute_threads=None,  # cores - 1: the split the file's rates are for
                           track_memory=track_memory)
        self.tr = Trainer(model, policy, TrainerConfig(runtime=rt))
        self.ser = Serialized(self.tr.engine.runner, sync_for(device))
        self.tr.engine.runner = self.ser
        self.own: dict[int, list[float]] = {}
        self._step()  # warm-up, not kept

    def _step(self) -> dict:
        self.ser.durations.clear()
        self.tr.step(torch.randint(0, self.model.vocab, (self.policy.batch, self.policy.seq), generator=self.gen))
        return dict(self.ser.durations)

    def sample(self, steps: int = 1) -> None:
        for _ in range(steps):
            for op_id, t in self._step().items():
                self.own.setdefault(op_id, []).append(t)

    def close(self) -> None:
        self.tr.close()


def tiny_op_times(device: str, steps: int, policy: Policy = TINY_POLICY, model: ModelSpec = TINY
                  ) -> dict[int, list[float]]:
    """{op id: own seconds per step} of `steps` serialized steps of the tiny model (or `model`)."""
    probe = TinyProbe(device, policy, model)
    try:
        probe.sample(steps)
    finally:
        probe.close()
    return probe.own


COPY_KINDS = (OpKind.LOAD_WEIGHTS, OpKind.LOAD_CKPT, OpKind.SAVE_CKPT, OpKind.LOAD_INPUT,
              OpKind.OFFLOAD_GRADS, OpKind.OFFLOAD_INPUT_GRAD)
COMPUTE_KINDS = (OpKind.FORWARD, OpKind.RECOMPUTE, OpKind.BACKWARD, OpKind.HEAD)


def op_overheads(hw: HardwareSpec, own: dict[int, list[float]], policy: Policy = TINY_POLICY,
                 model: ModelSpec = TINY):
    """Each op's own time (mean over steps) less the work `hw` predicts for it, by kind:
    (compute kind -> µs, copy latency µs, CPU-lane latency µs from the global-norm op, which
    does no work to speak of)."""
    sched = build_schedule(model, policy)
    costs = CostModel(hw, policy.compute_dtype, sched.meta)
    by_kind: dict[OpKind, list[float]] = {}
    for op in sched.ops:
        if op.id not in own:
            continue
        t = statistics.mean(own[op.id])
        if op.lane == Lane.COMPUTE:
            terms = costs.compute_terms(op)
            t -= terms["gemm"] + terms["attention"] + terms["elementwise"]
        else:
            t -= sum(f.nbytes / f.cap_Bps for f in costs.flows(op))
        by_kind.setdefault(op.kind, []).append(max(t, 0.0))
    compute = {k.value: statistics.mean(v) * 1e6 for k, v in by_kind.items() if k in COMPUTE_KINDS}
    copies = [x for k in COPY_KINDS for x in by_kind.get(k, [])]
    cpu = statistics.median(by_kind[OpKind.GRAD_NORM]) * 1e6 if OpKind.GRAD_NORM in by_kind else 0.0  # (adapters: none)
    return compute, statistics.median(copies) * 1e6 if copies else 0.0, cpu


def tracked_overheads(dense_us: dict, tracked_us: dict) -> dict:
    """'<kind>_tracked' rows: TINY's compute kinds with every op's temporaries measured on every
    run (`tracked_us`, op_overheads of a TinyProbe with track_memory='every'), where that is
    dearer than the replayed run's (`dense_us`); a kind that came out cheaper on a noisy machine
    keeps the replayed figure (absent)."""
    kinds = [k.value for k in COMPUTE_KINDS]
    return {tracked_kind(k): tracked_us[k] for k in kinds if k in tracked_us and tracked_us[k] > dense_us.get(k, 0.0)}


def moe_overheads(hw: HardwareSpec, dense_us: dict, own: dict[int, dict[int, list[float]]]) -> dict:
    """An MoE block's extra fixed costs per compute kind, µs, from the tiny MoE models' serialized
    ops (`own`: experts -> {op id: seconds}) less their modelled work, against the dense TINY's
    (`dense_us`, op_overheads, tracked as the MoE models are: every op, every run): the cost grows with the experts the loop runs, so the two
    models' difference over their experts gives '<kind>_expert' and what is left of the
    smaller one beyond the dense block and its experts '<kind>_router' (the router, top-k and
    the rows' sort: once per op). Both at least 0 (a noisy machine can make a difference
    negative)."""
    (e1, e2) = MOE_EXPERTS
    per = {e: op_overheads(hw, own[e], MOE_POLICY, tiny_moe(e))[0] for e in MOE_EXPERTS}
    out = {}
    for kind in (k.value for k in COMPUTE_KINDS if k != OpKind.HEAD):
        if kind in dense_us and all(kind in per[e] for e in MOE_EXPERTS):
            expert = max(0.0, (per[e2][kind] - per[e1][kind]) / (e2 - e1))
            out[f"{kind}_expert"] = expert
            out[f"{kind}_router"] = max(0.0, per[e1][kind] - dense_us[kind] - e1 * expert)
    return {k: v for k, v in out.items() if v > 0}  # a hardware file's rows are > 0; absent = 0


def adapter_overheads(hw: HardwareSpec, dense_us: dict, own: dict[int, list[float]]) -> dict:
    """'<kind>_adapter': each compute kind's fixed cost per adapted projection, µs, from TINY under
    LORA_POLICY (`own`, its serialized ops) less its modelled work (the adapters' GEMMs and bytes
    included), against TINY's (`dense_us`, as measured the same way), over its adapted
    projections. The frozen base's backward issues fewer kernels than TINY's (no weight
    gradients): that saving is in the figure too, so the two together give the LoRA step. At
    least 0 (noise)."""
    from horizon_sim.schedule import work
    n = len(work.adapted(TINY, LORA_POLICY))
    lora_us = op_overheads(hw, own, LORA_POLICY)[0]
    out = {f"{k}_adapter": max(0.0, (lora_us[k] - dense_us[k]) / n)
           for k in (OpKind.FORWARD.value, OpKind.RECOMPUTE.value, OpKind.BACKWARD.value) if k in lora_us and k in dense_us}
    return {k: v for k, v in out.items() if v > 0}


def head_id(policy: Policy) -> int:
    return next(o.id for o in build_schedule(TINY, policy).ops if o.kind == OpKind.HEAD)


HEAD8_POLICY = replace(TINY_POLICY, loss_chunk_tokens=TINY_POLICY.seq // 8)
"""The tiny model with eight loss chunks: its head against TINY_POLICY's gives 'head_chunk'."""


def head_chunk_us(own_1: dict[int, list[float]], own_8: dict[int, list[float]]) -> float:
    """The head's fixed cost per loss chunk, µs: TINY's head with eight chunks (`own_8`, from
    HEAD8_POLICY) against one (`own_1`, TINY_POLICY), over the seven chunks it adds."""
    h1 = statistics.mean(own_1[head_id(TINY_POLICY)])
    h8 = statistics.mean(own_8[head_id(HEAD8_POLICY)])
    return max(0.0, (h8 - h1) / 7 * 1e6)


def measured_rows(us: dict) -> dict:
    """The fixed costs a hardware file keeps: its rows are > 0 and an absent one is 0, so a cost
    that noise measured at 0 (clamped: the eight-chunk head no slower than the one-chunk one) is
    left out rather than written and refused when the file is read."""
    return {k: v for k, v in us.items() if v > 0}


def runtime_overhead_GiB(probe_result: dict) -> float:
    """RSS of the tiny probe less its model tensors (store, device peak, dynamic host buffers,
    all in RAM on the CPU backend) and the allocator's retention for its largest block."""
    dev = max(s["device_peak_bytes"] for s in probe_result["steps"])
    rest = (probe_result["rss_peak_bytes"] - probe_result["store_bytes"] - dev
            - probe_result["host_dynamic_peak_bytes"]
            - allocator_retention_bytes(largest_transient_block(TINY, TINY_POLICY)))
    return max(rest, 0) / GiB
