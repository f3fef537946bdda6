"""How long ops take on a machine. Each term is named; nothing here is a fudge factor.

- compute_s   = launch overhead + max(FLOPs / (peak · matmul_efficiency), HBM bytes / HBM bandwidth)
- copy_s      = link latency + bytes / achieved pinned bandwidth of that direction (the
                simulator runs the bytes part as a flow on the shared DRAM bus)
- optimizer   = a DRAM flow of the bytes AdamW touches per parameter, capped by the host's
                fused-AdamW rate, sharing DRAM bandwidth with concurrent DMA
- other host work (embedding gather/scatter, norms) = a DRAM flow capped by DRAM bandwidth
"""
from dataclasses import dataclass

from horizon_sim.schedule.op import Lane, Op, OpKind
from horizon_sim.specs.hardware import HardwareSpec


@dataclass(frozen=True, slots=True)
class Flow:
    """Work that streams bytes through host DRAM: a fixed latency, then `nbytes` at up to
    `cap_Bps` (less when the DRAM bus is shared)."""
    latency_s: float
    nbytes: float
    cap_Bps: float


class CostModel:
    def __init__(self, hw: HardwareSpec, compute_dtype: str = "bf16"):
        d, link, host = hw.device, hw.link, hw.host
        peak = d.bf16_TFLOPs if compute_dtype == "bf16" else d.fp32_TFLOPs
        self.flops_per_s = peak * 1e12 * d.matmul_efficiency
        self.hbm_Bps = d.hbm_GBps * 1e9
        self.launch_s = d.launch_overhead_us * 1e-6
        self.link_latency_s = link.latency_us * 1e-6
        self.h2d_Bps = link.h2d_GBps * 1e9
        self.d2h_Bps = link.d2h_GBps * 1e9
        self.dram_Bps = host.dram_GBps * 1e9
        self.adam_params_per_s = host.adam_Gparams_per_s * 1e9

    def compute_s(self, op: Op) -> float:
        return self.launch_s + max(op.flops / self.flops_per_s, op.hbm_bytes / self.hbm_Bps)

    def flows(self, op: Op) -> list[Flow]:
        """The DRAM flows of a non-compute op, run one after another."""
        if op.lane in (Lane.H2D, Lane.D2H):
            cap = self.h2d_Bps if op.lane == Lane.H2D else self.d2h_Bps
            out = [Flow(self.link_latency_s, op.link_bytes, cap)]
            if op.host_bytes:  # e.g. accumulating a micro-batch's grads into the host buffer
                out.append(Flow(0.0, op.host_bytes, self.dram_Bps))
            return out
        if op.kind == OpKind.OPTIMIZER and op.params:
            bytes_per_param = op.host_bytes / op.params
            return [Flow(0.0, op.host_bytes, self.adam_params_per_s * bytes_per_param)]
        return [Flow(0.0, op.host_bytes, self.dram_Bps)]

    def alone_s(self, op: Op) -> float:
        """Duration with nothing else running: the roofline term of this op."""
        if op.lane == Lane.COMPUTE:
            return self.compute_s(op)
        return sum(f.latency_s + f.nbytes / min(f.cap_Bps, self.dram_Bps) for f in self.flows(op))
