"""Kernel rates measured on a real GPU, shipped with the planner so a preset's compute is priced
from a measurement rather than a flat efficiency (issue 26).

The V100 takes its rate from a published log instead (v100_megatron_kernels): DeepSpeed's
ZeRO-Offload tutorial timed the forward and backward of a 10B GPT-2 in Megatron-LM v1.1.5 on one
V100 with every parameter resident on the GPU, which is pure compute.

The RTX 4090 takes a published microbenchmark (rtx4090_kernels): square torch.matmul at five
sizes, bf16 and fp32, one card's run of a public benchmark script. The same script's runs on two
H100 PCIe boards set where that part's GEMMs level off (h100_pcie_kernels).

One measurement of our own so far: an H200, by this project's `horizon calibrate --device cuda`
(measured/h200_2026-11-27.toml). The GH100 presets take it: the H200 as measured; the H100 SXM
and the GH200 (the same GH100 compute, 132 SMs, 989-990 TF dense bf16) with its compute tables
as they are and its elementwise rate scaled by their HBM peak; the H100 PCIe (756 TF) with its
attention and loss rates scaled by the peak ratio, and its GEMMs as the H200's up to the level
its 350 W limit holds them to. Those transfers are estimates and preset_sources.py says so. The
per-op fixed costs are the executor's Python dispatch on that box's 16-core Xeon: kept as
measured for every GH100 preset (an estimate for other hosts)."""
import statistics
import tomllib
from functools import lru_cache
from pathlib import Path

H200_FILE = Path(__file__).parent / "measured" / "h200_2026-11-27.toml"


@lru_cache(maxsize=None)
def _load(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def gh100_kernels(bf16_TFLOPs: float, hbm_GBps: float) -> dict:
    """DeviceSpec fields for a GH100 part with this dense bf16 peak and HBM peak: the H200's
    measured GEMM, attention (SDPA's, and the soft-capped attention's fused kernel) and loss
    rates scaled by the peak ratio (1 for the H200, H100 SXM and GH200), its elementwise rate by
    the HBM ratio, its op overheads as measured."""
    m = _load(H200_FILE)
    c = bf16_TFLOPs / m["bf16_TFLOPs"]
    gemm = tuple((r[0], r[1], *r[2:5], r[5] * c) for r in m["gemm_TFLOPs"])
    attn = lambda rows: tuple((r[0], r[1], r[2], r[3] * c, r[4] * c) for r in rows)  # noqa: E731
    return dict(gemm_TFLOPs=gemm, attention_TFLOPs=attn(m["attention_TFLOPs"]),
                masked_attention_TFLOPs=attn(m["masked_attention_TFLOPs"]),
                softcap_attention_TFLOPs=attn(m["softcap_attention_TFLOPs"]),
                loss_ns_per_logit=m["loss_ns_per_logit"] / c,
                elementwise_GBps=m["elementwise_GBps"] * hbm_GBps / m["hbm_GBps"],
                launch_overhead_us=m["launch_overhead_us"],
                op_overhead_us=tuple((k, v) for k, v in m["op_overhead_us"]))


# FlashAttention-2 on an A100 80GB SXM4, causal, fp16, forward + backward (Dao-AILab/flash-attention,
# assets/flash2_a100_fwd_bwd_benchmark.png, the data labels of panels (c) head dim 64 and (d) 128),
# TFLOP/s in FA2's count: 3.5 x the causal forward 4 x T^2 x head_dim / 2 per head and sequence.
FA2_A100_CAUSAL = {64: (88, 119, 140, 156, 165, 171), 128: (99, 133, 155, 173, 182, 189)}
FA2_SEQS = (512, 1024, 2048, 4096, 8192, 16384)


def fa2_a100_attention() -> tuple:
    """attention_TFLOPs rows (DTYPE, SEQ, HEAD_DIM, FWD, BWD) from FlashAttention-2's published
    A100 figure. It gives the forward + backward time only: the planner counts the backward as 2
    forwards where FA2 counts 2.5, so both columns are 6/7 of the published rate, which gives the
    published time for the pair (how it splits between them is not in the figure)."""
    return tuple(("bf16", float(s), float(hd), r * 6 / 7, r * 6 / 7)
                 for hd, rates in FA2_A100_CAUSAL.items() for s, r in zip(FA2_SEQS, rates))


# DeepSpeed's ZeRO-Offload tutorial (microsoft/DeepSpeed docs/_tutorials/zero-offload.md, log screenshot
# docs/assets/images/zero_offload_dp1_10B_log.png): GPT-2 10B (50 layers x 4096, 32 heads, vocab 50257,
# seq 1024) in Megatron-LM v1.1.5, fp16, batch 10, --checkpoint-activations, one V100-SXM3 32GB of a DGX-2,
# ZeRO-2 Offload (parameters resident on the GPU, so the forward and backward are compute only):
# forward 6.1-6.4 s, backward 11.8-12.6 s per iteration. Their middles:
V100_TUTORIAL_FORWARD_S = 6.25
V100_TUTORIAL_BACKWARD_S = 12.2
V100_MEGATRON_TFLOPs = 48.2
"""The one rate at which the planner's step of that run (the ZeRO-2 peer, its GEMMs at this rate,
its attention at half of it, elementwise work at the datasheet HBM rate) computes for
V100_TUTORIAL_FORWARD_S + V100_TUTORIAL_BACKWARD_S: 48.2 TFLOP/s, 39% of the 125 TF tensor peak
(46.8-49.7 over the log's ranges; tests/test_peer_zero2.py recomputes it). It was 51.1 while the
planner described that GPT-2 with RoPE and three q/k/v projections, and 50.0 while it priced
GPT-2's LayerNorm and GELU as an RMSNorm and a SiLU (more elementwise work than GPT-2 does):
the same measured time over less modelled work gives the lower rate. An effective rate: it
carries whatever Megatron-v1.1.5's fp16 kernels, their launches and the framework cost beyond the
planner's elementwise model. The forward and backward are fitted together: alone, the forward's
6.25 s implies a lower rate than the backward's 12.2 s (which holds a forward again), so
something besides compute sits in the forward timer and neither alone is a kernel rate."""


def v100_megatron_kernels() -> dict:
    """DeviceSpec fields of the V100 at V100_MEGATRON_TFLOPs: every GEMM layout at that rate
    (one measured point per layout: the same rate at every shape), and attention at half of it
    in the planner's causal count, because Megatron v1.1.5 computes every score of the T x T
    matrix and masks it (a baddbmm, the masked softmax, a bmm), twice the nominal causal work."""
    r = V100_MEGATRON_TFLOPs
    gemm = tuple(("bf16", layout, 10240.0, 4096.0, 4096.0, r) for layout in ("nt", "nn", "tn"))
    return dict(gemm_TFLOPs=gemm, attention_TFLOPs=(("bf16", 1024.0, 128.0, r / 2, r / 2),))


# RTX 4090 (24 GB), square torch.matmul(a, b), n x n x n, CUDA events over 30 runs after 10
# warm-ups, 2 n^3 flops each (zzc0721/torch-performance-test-data test.py at commit 9d82827),
# one card's detailed run: github issue zzc0721/torch-performance-test-data#78 (torch 2.7.0+cu128,
# a cloud instance), TF/s. Its best bf16 figure, 164.8, is the middle of the six 24 GB RTX 4090
# runs in that repository's database.md (162.4-173.3 TF/s, median 165.3), so the card is typical.
MATMUL_SIZES = (1024, 2048, 4096, 8192, 10240)
"""The square sizes n of that benchmark (n x n x n), for every card it measured."""
RTX4090_MATMUL_TFLOPs = {"bf16": (126.84, 164.81, 151.50, 160.17, 158.54),
                         "fp32": (45.89, 53.84, 53.02, 53.41, 51.43)}  # fp32 with TF32 off


def rtx4090_kernels() -> dict:
    """DeviceSpec fields of the RTX 4090: its GEMMs from RTX4090_MATMUL_TFLOPs. The benchmark
    multiplies row-major matrices ('nn' in the planner's layouts); the planner's other layouts
    take the same rates (RateTable's fallback), as no source measured them apart. The large
    sizes reach 0.96-0.97 of the 165.2 TF datasheet peak (the card boosts above the 2.52 GHz the
    datasheet counts), where the flat estimate priced every GEMM at 0.70 of it."""
    gemm = tuple((dtype, "nn", float(n), float(n), float(n), r)
                 for dtype, rates in RTX4090_MATMUL_TFLOPs.items() for n, r in zip(MATMUL_SIZES, rates))
    return dict(gemm_TFLOPs=gemm)


# H100 PCIe (114 SMs, 350 W): the same benchmark (square bf16 torch.matmul, MATMUL_SIZES) on two
# boards of that part: an H100 PCIe (github issue zzc0721/torch-performance-test-data#95, torch
# 2.9.0+cu128, a physical machine) and an H800 PCIe, the export variant with the same compute
# (issue #112, torch 2.8.0+cu128, a cloud instance), TF/s.
H100_PCIE_MATMUL_TFLOPs = {"h100-pcie": (217.70, 449.09, 495.93, 492.84, 471.79),
                           "h800-pcie": (170.73, 483.89, 503.83, 499.46, 487.22)}
H100_PCIE_GEMM_CAP_TFLOPs = round(statistics.mean(
    r for board in H100_PCIE_MATMUL_TFLOPs.values() for n, r in zip(MATMUL_SIZES, board) if n >= 4096), 1)
"""Where the 350 W board's GEMMs level off: the mean of both boards' figures at 4,096-10,240
(471.8-503.8 TF/s), 491.8 TF/s, 0.65 of the 756 TF datasheet peak."""


def h100_pcie_kernels(bf16_TFLOPs: float, hbm_GBps: float) -> dict:
    """DeviceSpec fields of the H100 PCIe: gh100_kernels at its peaks, except its GEMMs. Those
    are the H200's measured rates, capped at H100_PCIE_GEMM_CAP_TFLOPs: below the power limit
    the part runs a GEMM as the SXM parts do (at 1,024^3 the two boards measured 171 and 218
    TF/s, the H200 186), and larger ones level off at the cap. Against the two boards the cap
    rule is within 6% at every size (2,048^3: 492 against their 466); scaling the H200's table by
    the peak ratio (756 / 989), as the preset did before, was 27% low at 1,024^3 and 22-32% high
    from 4,096^3 up. Attention keeps the peak-ratio scaling (no source measured it)."""
    k, m = gh100_kernels(bf16_TFLOPs, hbm_GBps), _load(H200_FILE)
    k["gemm_TFLOPs"] = tuple((*r[:5], min(r[5], H100_PCIE_GEMM_CAP_TFLOPs)) if r[0] == "bf16" else scaled
                             for r, scaled in zip(m["gemm_TFLOPs"], k["gemm_TFLOPs"]))  # fp32: as gh100_kernels
    return k
