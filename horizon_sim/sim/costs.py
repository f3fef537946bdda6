"""How long ops take on a machine. Each term is named and is a property of the machine (a
rate, an overhead) applied to work counted from the model; nothing here is a fudge factor.

Compute ops (one lane, kernels run back to back, so the terms add):
  compute_s = overhead        fixed cost of the op: Python dispatch and memory tracking of
                              each of its kernels, launches, gaps (DeviceSpec.op_overhead_us
                              by kind, '<kind>_tracked' where a CPU backend measures every op's
                              temporaries on every run, else launch_overhead_us); the head pays 'head_chunk'
                              again for each loss chunk after the first; an MoE block
                              '<kind>_router' once and '<kind>_expert' per expert its loop
                              runs (every expert, when the op routes as many rows); a block
                              with adapters '<kind>_adapter' per adapted projection
            + GEMMs           sum over the op's GEMMs of 2mnk / throughput(dtype, layout, m, n, k)
                              from the measured table (DeviceSpec.gemm_TFLOPs), else
                              FLOPs / (peak x matmul_efficiency)
            + attention       nominal causal attention FLOPs / the measured SDPA throughput
                              (DeviceSpec.attention_TFLOPs), forward and backward kernels apart;
                              a layer under an explicit mask (window, document masks): the
                              full T x T count / masked_attention_TFLOPs; soft-capped scores on
                              a GPU: one fused kernel (flex_attention), the pairs its window
                              leaves / softcap_attention_TFLOPs, and the chunked kernel's
                              passes over the scores (in hbm_bytes, the CPU backend's) taken
                              out of the elementwise term
            + elementwise     hbm_bytes (what the norms, RoPE, SiLU, casts, residual adds and
                              the loss read and write) / elementwise_GBps (else hbm_GBps); the head's loss kernels
                              (exp/log-bound) at the measured loss_ns_per_logit (the policy's
                              loss kernel 'fused': fused_loss_ns_per_logit) instead, when the
                              device has one
  The GEMM shapes and the attention come from the schedule's model and policy
  (schedule/work.py); without them (a bare CostModel) the op's FLOPs run at the flat rate.
Everything else is a sequence of flows through host DRAM (dram.py). A flow's bytes are DRAM
traffic (read plus written), the bus's unit (HostSpec.dram_GBps):
  copy         link latency (once per copy: an op may stand for several, Op.copies), then
               link_bytes at the achieved bandwidth of that direction (Op.pageable: the
               link's pageable rate, a copy staged by the driver); when
               the link is cpu_driven (the CPU backend's emulated link) the copy is host-thread
               work that shares the host lane cores with the other lanes, and it reads and
               writes host memory: 2 x link_bytes of traffic at 2 x its link rate; a copy
               into a temporary mapped for it (Op.fault_bytes) first writes those fresh pages
               at the host's first_touch_GBps on a host core
  dequantize   a load of a quantized base (Policy.base_quant) then dequantizes it on the device:
               its quantized parameters (Op.params) at the measured dequant_ns_per_param of the
               format, else hbm_bytes (specs/quant.dequant_traffic_bytes) at the elementwise
               rate, after its kernels' launches (a host thread's work on the CPU backend)
  grad norm    an offload that also writes a squared norm reduces the gradient where it lies:
               a pass over link_bytes at the reduction bandwidth (reduce_GBps, else elementwise_GBps, else hbm_GBps;
               a host pass when cpu_driven)
  host work    host_bytes at one host thread's streaming rate (accumulating micro-batch grads,
               embedding gather/scatter), after the host's per-op latency and the op's own
               fixed host time (Op.fixed_us: a peer's hooks, a loop over parameter tensors)
  optimizer    host_bytes at the fused-AdamW rate (adam_Gparams_per_s x bytes per parameter)
  disk         the disk tier's reads and writes: disk latency, then disk_bytes at the disk's
               read or write bandwidth (HostSpec.disk_*_GBps), DRAM traffic once (the disk DMAs)
Flows share the DRAM bus max-min fairly and, when HostSpec.lane_cores > 0, the host lane cores
by processor sharing: lanes on one core slow each other down. A copy or CPU-lane op that
starts while the compute lane is busy pays busy_latency_us once more (LinkSpec / HostSpec):
on the CPU backend its thread waits for the interpreter lock that the compute lane's kernel
dispatch keeps taking.
"""
import functools
import math
from dataclasses import dataclass, replace

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import work
from horizon_sim.schedule.op import COLLECTIVES, Lane, Op, OpKind
from horizon_sim.specs.cpu_ranks import is_cpu_backend
from horizon_sim.specs.hardware import HardwareSpec, tracked_kind, tracks_every_op

_IDW_POWER = 4.0  # inverse-distance weights in log2 space: the nearest measured shapes dominate
_IDW_NEIGHBOURS = 8  # the corners of a grid cell around a shape inside the grid


DEQUANT_KERNELS = 8
"""Kernels a load launches to dequantize a block's base (horizon_exec/model/quant.py: each
quantized tensor's few, per chunk); the fixed part of the dequantization's time."""

COPY_TRAFFIC = 2.0
"""DRAM traffic per byte a CPU thread copies: it reads the source and writes the destination."""


@dataclass(frozen=True, slots=True)
class Flow:
    """Work that streams bytes: a fixed latency, then `nbytes` at up to `cap_Bps`. On the DRAM
    bus (dram=True) it is slowed when the bus is shared, and a `core` flow also shares the host
    lane cores; dram=False is device-side work, a plain delay."""
    latency_s: float
    nbytes: float
    cap_Bps: float
    core: bool = False
    dram: bool = True


def log2_distance2(coords, at) -> float:
    """Squared distance between two shapes in log2 coordinates (sizes below 1 read as 1)."""
    return sum((math.log2(max(c, 1.0)) - math.log2(max(x, 1.0))) ** 2 for c, x in zip(coords, at))


def _interpolate(points: list[tuple[tuple[float, ...], float]], at: tuple[float, ...]) -> float:
    """Value at `at` from measured (coordinates, value) points: the exact point when measured,
    else inverse-distance weighting in log2 coordinates over the _IDW_NEIGHBOURS nearest points
    (deterministic, no extrapolation beyond the measured values). Weighting every point of a
    675-row table let the far ones outvote the near: a 64 x 2048 x 768 GEMM on the H200's table
    came out at 417 TFLOP/s, 3x the rate of the same shape with 512 rows; leaving each measured
    shape out and predicting it from the rest, the nearest 8 give median |error| 3.5% on that
    table (p90 30%, +5.7% on average) against 5.2% (p90 71%, +18%) with every point."""
    near = []
    for coords, value in points:
        d2 = log2_distance2(coords, at)
        if d2 < 1e-18:
            return value
        near.append((d2, value))
    near.sort(key=lambda dv: dv[0])
    num = den = 0.0
    for d2, value in near[:_IDW_NEIGHBOURS]:
        w = d2 ** (-_IDW_POWER / 2)
        num += w * value
        den += w
    return num / den


class RateTable:
    """A measured table keyed by (dtype, layout-or-''), looked up by shape."""

    def __init__(self, rows, dtype: str, key_len: int):
        self.by_key: dict = {}
        for row in rows:
            if row[0] != dtype:
                continue
            key = row[1] if key_len == 2 else ""
            coords = row[key_len:key_len + 3] if key_len == 2 else row[1:3]
            values = row[key_len + 3:] if key_len == 2 else row[3:]
            self.by_key.setdefault(key, []).append((tuple(coords), tuple(values)))
        self._memo: dict = {}  # a step asks for the same few shapes once per layer

    def __bool__(self) -> bool:
        return bool(self.by_key)

    def rate(self, key: str, at: tuple, column: int = 0) -> float:
        got = self._memo.get((key, at, column))
        if got is None:
            pts = self.by_key.get(key) or next(iter(self.by_key.values()))
            got = self._memo[(key, at, column)] = _interpolate([(c, v[column]) for c, v in pts], at)
        return got


@functools.lru_cache(maxsize=64)
def rate_table(rows: tuple, dtype: str, key_len: int) -> RateTable:
    """One RateTable per (device table, dtype), kept across CostModels: a sweep or a tune plans
    the same device many times, and each table's memo of interpolated shapes is then filled once
    (interpolating a 675-row GEMM table anew every plan cost ~15% of a 120B step's simulation)."""
    return RateTable(rows, dtype, key_len)


class _Scaled:
    """A rate table's rates times a factor (another dtype's GEMMs where only one was measured)."""

    def __init__(self, table: RateTable, factor: float):
        self.table, self.factor = table, factor

    def rate(self, key: str, at: tuple, column: int = 0) -> float:
        return self.table.rate(key, at, column) * self.factor


class CostModel:
    def __init__(self, hw: HardwareSpec, compute_dtype: str = "bf16", meta=None):
        d, link, host = hw.device, hw.link, hw.host
        self.device = d
        self.dtype = compute_dtype
        peak = d.bf16_TFLOPs if compute_dtype == "bf16" else d.fp32_TFLOPs
        self.flops_per_s = peak * 1e12 * d.matmul_efficiency
        self.hbm_Bps = (d.elementwise_GBps or d.hbm_GBps) * 1e9  # what elementwise kernels reach
        self.reduce_Bps = (d.reduce_GBps or d.elementwise_GBps or d.hbm_GBps) * 1e9
        self.loss_s_per_logit = {"torch": d.loss_ns_per_logit * 1e-9,
                                 "fused": d.fused_loss_ns_per_logit * 1e-9}  # by Policy.loss_kernel
        self.launch_s = d.launch_overhead_us * 1e-6
        self.dequant_ns = dict(d.dequant_ns_per_param)  # format -> ns a quantized parameter
        self.overhead_us = dict(d.op_overhead_us)
        self.gemm = rate_table(d.gemm_TFLOPs, compute_dtype, 2)
        self._gemm_tables: dict = {}  # other dtypes' (the adapters' fp32 GEMMs), made on first use
        self.attn = rate_table(d.attention_TFLOPs, compute_dtype, 1)
        self.mattn = rate_table(d.masked_attention_TFLOPs, compute_dtype, 1)
        self.sattn = rate_table(d.softcap_attention_TFLOPs, compute_dtype, 1)
        self.fused_softcap = not is_cpu_backend(hw)  # a GPU: flex_attention, not the chunked kernel
        self.link_latency_s = link.latency_us * 1e-6
        self.h2d_Bps = link.h2d_GBps * 1e9
        self.d2h_Bps = link.d2h_GBps * 1e9
        self.pageable_Bps = link.pageable_GBps * 1e9
        self.cpu_copies = link.cpu_driven
        self.dram_Bps = host.dram_GBps * 1e9
        self.thread_Bps = (host.thread_GBps or host.dram_GBps) * 1e9
        self.first_touch_Bps = host.first_touch_GBps * 1e9
        self.lane_cores = host.lane_cores
        self.compute_contention = host.compute_contention
        self.host_latency_s = host.op_latency_us * 1e-6
        self.copy_busy_s = link.busy_latency_us * 1e-6
        self.host_busy_s = host.busy_latency_us * 1e-6
        self.adam_params_per_s = host.adam_Gparams_per_s * 1e9
        self.disk_read_Bps, self.disk_write_Bps = host.disk_read_GBps * 1e9, host.disk_write_GBps * 1e9
        self.disk_latency_s = host.disk_latency_us * 1e-6
        self.model = meta.model if meta is not None else None
        self.policy = meta.policy if meta is not None else None
        self.tracked = meta is not None and tracks_every_op(meta.model, meta.policy)
        self._terms: dict = {}
        # Data parallel: the Schedule is one rank's step, and every rank runs the same at the
        # same time, so this rank gets 1/N of what the node's N devices share: the DRAM bus,
        # the host lanes' cores, the optimizer's rate (measured on all cores) and the NIC; a
        # host link serves devices_per_host_link devices.
        cl = hw.cluster
        n = meta.layout.devices_per_node if meta is not None else 1
        self.nodes = meta.layout.nodes if meta is not None else 1
        if n > 1:
            self.h2d_Bps /= cl.devices_per_host_link
            self.d2h_Bps /= cl.devices_per_host_link
            self.pageable_Bps /= cl.devices_per_host_link
            self.dram_Bps /= n
            self.lane_cores = host.lane_cores / n
            self.adam_params_per_s /= n
        self.fabric_Bps = cl.fabric_GBps * 1e9
        self.fabric_latency_s = cl.fabric_latency_us * 1e-6
        self.net_Bps = cl.net_GBps * 1e9 / n
        self.net_latency_s = cl.net_latency_us * 1e-6

    # ---- compute ------------------------------------------------------------------------
    def _overhead_s(self, kind: str) -> float:
        if kind == OpKind.HEAD_LOSS.value and kind not in self.overhead_us:
            kind = OpKind.HEAD.value  # the same kernels' launches, less the backward's
        if kind == OpKind.REF_FORWARD.value and kind not in self.overhead_us:
            kind = OpKind.FORWARD.value  # the same kernels, less the adapters'
        if kind == OpKind.BACKWARD_SAVED.value and kind not in self.overhead_us:
            kind = OpKind.BACKWARD.value  # the executor's backward: an upper bound (it has the forward's too)
        if self.tracked and tracked_kind(kind) in self.overhead_us:
            kind = tracked_kind(kind)  # a CPU backend measuring every op's temporaries (tracks_every_op)
        return self.overhead_us.get(kind, self.launch_s * 1e6) * 1e-6

    def _moe_overhead_s(self, kind: OpKind, tokens: int, m) -> float:
        """An MoE block's extra fixed cost in a compute op: its router's, and each expert's that
        its loop runs (the executor skips an expert without rows: all E are counted, or the op's
        tokens x k rows where fewer). A backward runs the forward's kernels again: its figures
        include them; one from saved tensors pays the backward's (an upper bound, as for the
        op itself). m: the block's spec."""
        base = {OpKind.BACKWARD_SAVED: OpKind.BACKWARD}.get(kind, kind).value
        experts = min(m.n_experts, tokens * m.experts_per_token)
        us = self.overhead_us.get(f"{base}_router", 0.0) + experts * self.overhead_us.get(f"{base}_expert", 0.0)
        return us * 1e-6

    def _gemm_s(self, gemms) -> float:
        return sum(g.flops / (self._gemm_table(g.dtype).rate(g.layout, (g.m, g.n, g.k)) * 1e12) for g in gemms)

    def _gemm_table(self, dtype: str) -> RateTable:
        """The measured GEMM rates of `dtype` ('': the compute dtype's; a dtype the device file
        has none of: the compute dtype's, scaled by the two peaks' ratio)."""
        if not dtype or dtype == self.dtype:
            return self.gemm
        if dtype not in self._gemm_tables:
            t = rate_table(self.device.gemm_TFLOPs, dtype, 2)
            self._gemm_tables[dtype] = t if t else _Scaled(self.gemm, self._peak(dtype) / self._peak(self.dtype))
        return self._gemm_tables[dtype]

    def _peak(self, dtype: str) -> float:
        return self.device.bf16_TFLOPs if dtype == "bf16" else self.device.fp32_TFLOPs

    def compute_terms(self, op: Op) -> dict:
        """The named terms of a compute op's duration, seconds."""
        key = (op.kind, op.flops, op.hbm_bytes)
        if key in self._terms:
            return self._terms[key]
        t = {"overhead": self._overhead_s(op.kind.value), "gemm": 0.0, "attention": 0.0,
             "elementwise": op.hbm_bytes / self.hbm_Bps}
        m, p = self.model, self.policy
        shaped = m is not None and op.kind in (OpKind.FORWARD, OpKind.RECOMPUTE, OpKind.BACKWARD, OpKind.HEAD,
                                               OpKind.HEAD_LOSS, OpKind.BACKWARD_SAVED, OpKind.REF_FORWARD)
        if shaped:
            tokens = p.micro_batch * p.seq
            if op.kind in (OpKind.HEAD, OpKind.HEAD_LOSS):
                gemms = work.head_gemms(m, tokens, p.loss_chunk_tokens, backward=op.kind == OpKind.HEAD,
                                        weight_grad=not p.adapters)
                dpo = op.kind == OpKind.HEAD and p.objective == "dpo"  # a first pass for the rows' log-probabilities
                if dpo:
                    gemms += work.head_gemms(m, tokens, p.loss_chunk_tokens, backward=False)
                attn = None
                loss_s = self.loss_s_per_logit[p.loss_kernel]
                if loss_s:  # the loss kernels at their measured per-logit time
                    a = 2 if self.dtype == "bf16" else 4
                    t["elementwise"] -= work.head_logits_bytes(m, tokens, a, p.loss_kernel, op.kind == OpKind.HEAD) / self.hbm_Bps
                    if dpo:
                        t["elementwise"] -= work.head_logits_bytes(m, tokens, a, p.loss_kernel, False) / self.hbm_Bps
                    t["elementwise"] += tokens * m.vocab * loss_s * (2 if dpo else 1)
                chunks = work.head_chunks(tokens, p.loss_chunk_tokens)
                if "head_chunk" in self.overhead_us:
                    t["overhead"] += (chunks - 1) * self._overhead_s("head_chunk")
            else:
                bwd = op.kind in (OpKind.BACKWARD, OpKind.BACKWARD_SAVED)
                saved = op.kind == OpKind.BACKWARD_SAVED  # the forward's kernels ran in FORWARD
                ref = op.kind == OpKind.REF_FORWARD  # DPO's reference: the base without its adapters
                bm = m.block_spec(op.unit)  # this block's shape (dense blocks before MoE ones differ)
                p = work.layer_policy(m, p, op.unit)  # (adapters on some layers' experts only)
                gemms = (work.block_gemms_saved_backward(bm, tokens, p) if saved
                         else work.block_gemms(bm, tokens, bwd, None if ref else p))
                masked = work.masked_attention(m, op.unit, p.seq, p.doc_masks)
                attn = work.attention(bm, p.micro_batch, p.seq, bwd, masked)
                if m.attn_softcap and self.fused_softcap:
                    attn = self._fused_softcap(op, t, saved)
                if saved:
                    attn = replace(attn, fwd_flops=0.0)
                if bm.n_experts:
                    t["overhead"] += self._moe_overhead_s(op.kind, tokens, bm)
                if p.adapters and not ref:  # each adapter's small kernels (calibrated; absent: 0)
                    base = {OpKind.BACKWARD_SAVED: OpKind.BACKWARD}.get(op.kind, op.kind).value
                    experts = min(bm.n_experts, tokens * bm.experts_per_token)  # an adapted stack's that run
                    n = sum(experts if q.experts else 1 for q in work.adapted(bm, p))
                    t["overhead"] += n * self.overhead_us.get(f"{base}_adapter", 0.0) * 1e-6
            if self.gemm:
                t["gemm"] = self._gemm_s(gemms)
            else:  # each at its dtype's peak x efficiency
                t["gemm"] = sum(g.flops * self._peak(self.dtype) / self._peak(g.dtype or self.dtype) for g in gemms) \
                    / self.flops_per_s
            if attn is not None:  # backward: the forward kernel (with grad), then the gradient kernel
                table = self.mattn if masked and self.mattn else self.attn
                if m.attn_softcap and self.fused_softcap and self.sattn:
                    table = self.sattn
                if table:
                    at = (attn.seq, attn.head_dim)
                    t["attention"] = attn.fwd_flops / (table.rate("", at, 0) * 1e12)
                    if attn.bwd_flops:
                        t["attention"] += attn.bwd_flops / (table.rate("", at, 1) * 1e12)
                else:
                    t["attention"] = (attn.fwd_flops + attn.bwd_flops) / self.flops_per_s
        else:
            t["gemm"] = op.flops / self.flops_per_s
        self._terms[key] = t
        return t

    def _fused_softcap(self, op: Op, t: dict, saved: bool) -> "work.Attention":
        """A block op's soft-capped attention on a GPU, one fused kernel: its FLOPs over the
        pairs the layer's window leaves; the chunked kernel's score passes, which the
        Schedule's hbm_bytes count as the builder does (schedule/builder.py: the forward's,
        a backward's forward again and its own, a saved backward's own), are not run."""
        m, p = self.model, self.policy
        a = 2 if self.dtype == "bf16" else 4
        w = m.window(op.unit)
        backward = op.kind in (OpKind.BACKWARD, OpKind.BACKWARD_SAVED)
        passes = ([] if saved else [False]) + ([True] if backward else [])
        t["elementwise"] -= sum(work.softcap_elementwise_bytes(m, p.micro_batch, p.seq, a, bw, w, p.doc_masks)
                                for bw in passes) / self.hbm_Bps
        return work.fused_softcap_attention(m, p.micro_batch, p.seq, backward, w)

    def compute_s(self, op: Op) -> float:
        return sum(self.compute_terms(op).values())

    # ---- flows --------------------------------------------------------------------------
    def _collective(self, op: Op) -> list[Flow]:
        """A ring over `peers` ranks: peers - 1 steps (a scalar's all-reduce: a tree, 2 log2
        steps), then net_bytes at the fabric's rate (device to device, no host memory; CPU
        backend: host threads) or at
        this rank's share of the NIC (through host DRAM, as RDMA reads and writes it); a
        reduction's sums on the host are host_bytes of CPU work."""
        if op.lane == Lane.FABRIC:
            # A CPU backend's "devices" are host memory and its fabric is gloo on host threads:
            # the ring's bytes then cross the DRAM bus on a host core (beside the compute lane
            # that shares it), like its CPU-driven copies.
            cpu = self.cpu_copies
            return [Flow((op.peers - 1) * self.fabric_latency_s, op.net_bytes, self.fabric_Bps, core=cpu, dram=cpu)]
        tree = op.kind in (OpKind.NORM_ALL_REDUCE, OpKind.UPDATE_BARRIER)
        steps = 2 * math.ceil(math.log2(op.peers)) if tree else op.peers - 1
        # within a node (one node, or the node's own barrier): shared memory
        local = self.nodes == 1 or op.kind == OpKind.UPDATE_BARRIER
        latency = self.host_latency_s if local else self.net_latency_s
        out = [Flow(steps * latency, op.net_bytes, self.thread_Bps if local else self.net_Bps)]
        if op.host_bytes:
            out.append(Flow(0.0, op.host_bytes, self.thread_Bps, core=True))
        return out

    def flows(self, op: Op) -> list[Flow]:
        """The flows of a non-compute op, run one after another."""
        if op.kind in COLLECTIVES:
            return self._collective(op)
        cpu = self.cpu_copies
        if op.lane in (Lane.H2D, Lane.D2H):
            cap = self.pageable_Bps if op.pageable else self.h2d_Bps if op.lane == Lane.H2D else self.d2h_Bps
            k = COPY_TRAFFIC if cpu else 1.0  # same time alone, k x the bus bytes
            out = [Flow(op.copies * self.link_latency_s, k * op.link_bytes, k * cap, core=cpu)]
            if op.fault_bytes:  # the fresh temporary the copy lands in, before the copy can run
                out.append(Flow(0.0, op.fault_bytes, self.first_touch_Bps, core=True))
            if op.hbm_bytes:  # a quantized base dequantized on the device once its bytes landed
                out.append(Flow(self.launch_s * DEQUANT_KERNELS, op.hbm_bytes, self._dequant_Bps(op), core=cpu,
                                dram=cpu))
            if op.reduce_bytes:  # ||g||^2 of the gradient while it is still on the device
                out.append(Flow(0.0, op.reduce_bytes, self.reduce_Bps, core=cpu, dram=cpu))
            if op.host_bytes:  # accumulating a micro-batch's grads into the fp32 host buffer
                out.append(Flow(0.0, op.host_bytes, self.thread_Bps, core=True))
            return out
        if op.lane == Lane.DISK:  # the disk's DMA to or from RAM: DRAM bytes once, no core
            cap = self.disk_read_Bps if op.kind == OpKind.DISK_READ else self.disk_write_Bps
            if cap <= 0:
                raise HorizonError("the policy keeps state on disk (disk_tier) but the hardware has no disk: "
                                   "give --disk SIZE (and --disk-GBps)")
            return [Flow(self.disk_latency_s, op.disk_bytes, cap)]
        if op.kind in (OpKind.OPTIMIZER, OpKind.ADAPTER_HOST_UPDATE) and op.params:  # (AdamW at the host's rate)
            bytes_per_param = op.host_bytes / op.params
            return [Flow(self.host_latency_s, op.host_bytes, self.adam_params_per_s * bytes_per_param,
                         core=True)]
        return [Flow(self.host_latency_s + op.fixed_us * 1e-6, op.host_bytes, self.thread_Bps, core=True)]

    def _dequant_Bps(self, op: Op) -> float:
        """The rate a load's dequantization moves its bytes (hbm_bytes) at: from the measured time
        per quantized parameter (op.params of them) of the policy's format, else the elementwise rate."""
        ns = self.dequant_ns.get(self.policy.base_quant) if self.policy is not None else None
        return op.hbm_bytes / (op.params * ns * 1e-9) if ns and op.params else self.hbm_Bps

    def busy_latency_s(self, op: Op) -> float:
        """Extra fixed cost of a non-compute op that starts while the compute lane is busy."""
        if op.lane in (Lane.COMPUTE, Lane.FABRIC, Lane.NET, Lane.DISK):
            return 0.0
        return self.copy_busy_s if op.lane in (Lane.H2D, Lane.D2H) else self.host_busy_s

    def alone_s(self, op: Op) -> float:
        """Duration with nothing else running: the roofline term of this op."""
        if op.lane == Lane.COMPUTE:
            return self.compute_s(op)
        return sum(f.latency_s + f.nbytes / (min(f.cap_Bps, self.dram_Bps) if f.dram else f.cap_Bps)
                   for f in self.flows(op))
