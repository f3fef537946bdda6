"""Where every number of the hardware presets (hardware_presets.py) comes from, as data, so it
can be printed (`horizon plan --sources`) and checked (tests/test_preset_sources.py: every
number the planner prices a preset with has an entry here).

Each entry starts with its kind:
  datasheet:  the vendor's specification (a peak, a capacity)
  measured:   a measurement, with who measured it and where it is written down
  published:  someone else's measured figure, cited (document, figure or table, commit)
  estimate:   no measurement found; how the number was derived
A field a preset leaves at its dataclass default takes DEFAULTS' entry; `horizon calibrate`
replaces all of them with numbers from the machine at hand."""
from dataclasses import fields

KINDS = ("datasheet", "measured", "published", "estimate")

PRICED = {
    "device": ("hbm_GiB", "bf16_TFLOPs", "fp32_TFLOPs", "hbm_GBps", "matmul_efficiency", "reserved_GiB",
               "library_workspace_MiB", "launch_overhead_us", "gemm_TFLOPs", "attention_TFLOPs",
               "masked_attention_TFLOPs", "softcap_attention_TFLOPs", "elementwise_GBps", "loss_ns_per_logit",
               "op_overhead_us", "dequant_ns_per_param"),
    "link": ("h2d_GBps", "d2h_GBps", "latency_us", "pageable_GBps"),
    "host": ("dram_GBps", "dram_channels", "dram_MTps", "cores", "adam_Gparams_per_s", "deepspeed_adam_Gparams_per_s",
             "first_touch_GBps", "os_reserved_GiB", "runtime_overhead_GiB"),
}
"""The numbers the planner prices a preset with (and the host's memory channels, which bound
what its dram_GBps may be). Others are 0 or empty on every preset and
then stand for one of these (an empty GEMM table: every GEMM at peak x matmul_efficiency; host
ram_GiB: replaced by --ram)."""

DEFAULTS: dict[str, str] = {
    "device.matmul_efficiency": "estimate: 0.70 of the dense bf16 peak for transformer GEMMs, and attention "
                                "where no attention table is given (well-tuned cuBLAS GEMMs of LLM shapes land between 0.6 and 0.8 of the "
                                "datasheet peak). Measured on an H200 by this project's calibrate: 0.93 at the best "
                                "shape, 17 TFLOP/s at 512^3 (docs/gpu_runs.md)",
    "device.reserved_GiB": "estimate: CUDA context (0.3-0.6 GiB), library workspaces and allocator slack; "
                           "measured 1.33 GiB on an H200 (docs/gpu_runs.md)",
    "device.launch_overhead_us": "estimate: 8 us per schedule op on the device. Measured on an H200, ops "
                                 "serialised: 1.15-1.17 ms per layer forward, 3.9-4.4 ms per backward, the "
                                 "Python dispatch of every kernel (docs/gpu_runs.md), not yet in the presets",
    "device.gemm_TFLOPs": "estimate: no measured table for this GPU: every GEMM at the bf16 peak x matmul_efficiency",
    "device.attention_TFLOPs": "estimate: no measured table: attention FLOPs at the bf16 peak x matmul_efficiency",
    "device.masked_attention_TFLOPs": "estimate: no measured table: a masked layer's full count at the attention rate",
    "device.softcap_attention_TFLOPs": "estimate: no measured table: a soft-capped attention's fused kernel at the "
                                       "attention rate (an H200 ran flex_attention at 0.17-0.28 of SDPA's: optimistic)",
    "device.elementwise_GBps": "estimate: none measured on this GPU: elementwise work at the datasheet hbm_GBps "
                               "(an H200 measured 54% of its peak for the executor's kernels: optimistic)",
    "device.loss_ns_per_logit": "estimate: none measured: the head's loss priced as elementwise bytes",
    "device.op_overhead_us": "estimate: no table: every op costs launch_overhead_us",
    "device.dequant_ns_per_param": "estimate: none measured on a GPU: a quantized base's dequantization priced "
                                   "as the bytes the executor's kernels move at the elementwise rate "
                                   "(horizon_sim/specs/quant.py dequant_traffic_bytes)",
    "host.deepspeed_adam_Gparams_per_s": "measured: 0, the host's adam_Gparams_per_s: DeepSpeedCPUAdam ran at "
                                         "Horizon's AdamW rate on this project's EPYC (1.70 / 1.91 G params/s on 1 / "
                                         "2 threads, benchmarks/adam_rates.py); no published figure for this host",
    "host.first_touch_GBps": "estimate: 3 GB/s, one thread writing into fresh 4 KiB pages: this project's "
                             "AMX VM measured 2.2-3.4 GiB/s (2.4-3.7 GB/s) in five runs for 64-256 MiB fp16 "
                             "tensors allocated per copy (benchmarks/first_touch.py; 4.6-5.9 GiB/s into a "
                             "reused buffer); with 2 MiB pages on PyTorch's large blocks "
                             "(THP_MEM_ALLOC_ENABLE=1) 6.9-23 GiB/s. No figure from a bare-metal server",
    "host.os_reserved_GiB": "estimate: the OS, a minimum page cache and other processes",
    "host.dram_channels": "estimate: 0, not known: a calibrated host measures dram_GBps and records no channels",
    "host.dram_MTps": "estimate: 0, not known: as dram_channels",
    "host.runtime_overhead_GiB": "estimate: Python, torch and the CUDA libraries before any model tensor",
}

_HOPPER_WS = ("measured: 64 MiB of cuBLAS/cuBLASLt workspace on an H200 (torch 2.11+cu130, this project's run, "
              "2026-11-27: 66.3 MiB allocated at rest after a step against 2.3 MiB of the executor's buffers; "
              "calibrate: 65.0 MiB; docs/gpu_runs.md)")
_PRE_HOPPER_WS = ("estimate: 2 x PyTorch's default CUBLAS_WORKSPACE_CONFIG below Hopper (:4096:2:16:8 = "
                  "8.125 MiB), on Hopper's two-workspace pattern")


_H200 = ("measured: this project's H200 (calibrate --device cuda, torch 2.11+cu130, 2026-11-27; "
         "horizon_sim/specs/measured/h200_2026-11-27.toml)")
_SAME_DIE = ("estimate: the H200's measured rates as they are (horizon_sim/specs/measured/h200_2026-11-27.toml): "
             "the same GH100 compute, 132 SMs, 989-990 TF dense bf16")
_PCIE_DIE = ("estimate: the H200's measured rates (horizon_sim/specs/measured/h200_2026-11-27.toml) scaled by the "
             "dense peak, 756 / 989 (114 SMs, lower clocks)")
_XEON_OPS = ("the executor's per-op Python dispatch on the H200 box's 16-core Xeon (forward 1.15 ms, backward "
             "3.9 ms, ...), an estimate on any other host")


def _gh100(rates: str, elementwise: str, ops: str) -> dict:
    return {"gemm_TFLOPs": rates, "attention_TFLOPs": rates, "masked_attention_TFLOPs": rates,
            "softcap_attention_TFLOPs": rates, "loss_ns_per_logit": rates, "elementwise_GBps": elementwise,
            "launch_overhead_us": ops, "op_overhead_us": ops}


_FA2_A100 = ("published: FlashAttention-2 on an A100 80GB SXM4, causal, fp16, forward + backward "
             "(Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png, data labels), x 6/7 to this "
             "planner's count (FA2 counts the backward as 2.5 forwards, the planner 2); forward and backward at "
             "one rate: estimate (the figure gives their sum)")

_V100_MEGATRON = ("published: 48.2 TF/s for every GEMM (39% of the tensor peak), the rate at which the planner's step "
                  "of DeepSpeed's ZeRO-Offload tutorial run (GPT-2 10B in Megatron-LM v1.1.5, fp16, batch 10 x 1024, "
                  "checkpointed, parameters resident: ZeRO-2 Offload) computes for its logged forward + backward, "
                  "6.1-6.4 + 11.8-12.6 s (microsoft/DeepSpeed docs/assets/images/zero_offload_dp1_10B_log.png); "
                  "46.8-49.7 over those ranges (measured_kernels.py V100_MEGATRON_TFLOPs)")


def _smi(mib: int, name: str) -> str:
    return f"measured: nvidia-smi memory.total {mib} MiB for \"{name}\""


SOURCES: dict[str, dict[str, str]] = {
    # ---- devices (peaks dense: the datasheets' bf16 "with sparsity" figure halved) -------------
    "device:a100-40gb": {
        "attention_TFLOPs": _FA2_A100 + "; the 80GB part's figure, the same GA100 compute",
        "hbm_GiB": _smi(40960, "NVIDIA A100-SXM4-40GB"),
        "bf16_TFLOPs": "datasheet: NVIDIA A100: bf16 312 TF dense (624 sparse)",
        "fp32_TFLOPs": "datasheet: NVIDIA A100: FP32 19.5 TF",
        "hbm_GBps": "datasheet: NVIDIA A100 40GB: HBM2 1,555 GB/s",
        "library_workspace_MiB": _PRE_HOPPER_WS},
    "device:a100-80gb": {
        "attention_TFLOPs": _FA2_A100,
        "hbm_GiB": _smi(81920, "NVIDIA A100-SXM4-80GB"),
        "bf16_TFLOPs": "datasheet: NVIDIA A100: bf16 312 TF dense",
        "fp32_TFLOPs": "datasheet: NVIDIA A100: FP32 19.5 TF",
        "hbm_GBps": "datasheet: NVIDIA A100 80GB: HBM2e 2,039 GB/s",
        "library_workspace_MiB": _PRE_HOPPER_WS},
    "device:h100-sxm": {
        **_gh100(_SAME_DIE, "estimate: the H200's measured 2,612 GB/s scaled by the HBM peak, 3.35 / 4.8",
                "measured: " + _XEON_OPS),
        "hbm_GiB": _smi(81559, "NVIDIA H100 80GB HBM3"),
        "bf16_TFLOPs": "datasheet: NVIDIA H100 SXM: bf16 1,979 TF with sparsity, 989 dense",
        "fp32_TFLOPs": "datasheet: NVIDIA H100 SXM: FP32 67 TF",
        "hbm_GBps": "datasheet: NVIDIA H100 SXM: HBM3 3.35 TB/s",
        "library_workspace_MiB": _HOPPER_WS},
    "device:h100-pcie": {
        **_gh100(_PCIE_DIE, "estimate: the H200's measured 2,612 GB/s scaled by the HBM peak, 2.0 / 4.8",
                "measured: " + _XEON_OPS),
        "hbm_GiB": _smi(81559, "NVIDIA H100 PCIe"),
        "gemm_TFLOPs": "published: the H200's measured GEMM rates (horizon_sim/specs/measured/"
                       "h200_2026-11-27.toml) capped at 491.8 TF/s for bf16, where square torch.matmul levels off "
                       "on two 350 W boards: an H100 PCIe (471.8-495.9 TF/s at 4,096-10,240) and an H800 PCIe "
                       "(487.2-503.8; github zzc0721/torch-performance-test-data issues 95 and 112); below the "
                       "cap as the SXM parts (1,024^3: 171 and 218 on the boards, 186 on the H200); fp32 rows "
                       "scaled by the peak ratio: estimate (measured_kernels.py h100_pcie_kernels)",
        "bf16_TFLOPs": "datasheet: NVIDIA H100 PCIe: bf16 1,513 TF with sparsity, 756 dense",
        "fp32_TFLOPs": "datasheet: NVIDIA H100 PCIe: FP32 51 TF",
        "hbm_GBps": "datasheet: NVIDIA H100 PCIe: HBM2e 2.0 TB/s",
        "library_workspace_MiB": _HOPPER_WS},
    "device:h200": {
        **_gh100(_H200 + ": GEMM by shape and layout, causal and masked SDPA attention, the loss kernels; "
                          "the soft-capped attention's flex_attention kernel from a later lease "
                          "(benchmarks/softcap_attention.py, 2026-11-29)",
                _H200 + ": 2,612 GB/s for the executor's elementwise kernels", "measured: " + _XEON_OPS),
        "hbm_GiB": _smi(143771, "NVIDIA H200") + " (this project's H200, docs/gpu_runs.md)",
        "bf16_TFLOPs": "datasheet: NVIDIA H200: the H100 SXM's GH100 compute, bf16 989 TF dense",
        "fp32_TFLOPs": "datasheet: NVIDIA H200: FP32 67 TF",
        "hbm_GBps": "datasheet: NVIDIA H200: HBM3e 4.8 TB/s (calibrate measured 2,580-2,612 GB/s for the "
                    "executor's elementwise kernels, docs/gpu_runs.md)",
        "library_workspace_MiB": _HOPPER_WS},
    "device:gh200": {
        **_gh100(_SAME_DIE, "estimate: the H200's measured 2,612 GB/s scaled by the HBM peak, 4.0 / 4.8",
                "measured: " + _XEON_OPS + " (a GH200's host is a Grace)"),
        "hbm_GiB": _smi(97871, "NVIDIA GH200 480GB"),
        "bf16_TFLOPs": "datasheet: NVIDIA GH200: bf16 990 TF dense",
        "fp32_TFLOPs": "datasheet: NVIDIA GH200: FP32 67 TF",
        "hbm_GBps": "datasheet: NVIDIA GH200 (96 GB HBM3): 4 TB/s",
        "library_workspace_MiB": _HOPPER_WS},
    "device:l40s": {
        "hbm_GiB": _smi(46068, "NVIDIA L40S"),
        "bf16_TFLOPs": "datasheet: NVIDIA L40S: bf16 362.05 TF dense (733 sparse)",
        "fp32_TFLOPs": "datasheet: NVIDIA L40S: FP32 91.6 TF",
        "hbm_GBps": "datasheet: NVIDIA L40S: GDDR6 864 GB/s",
        "library_workspace_MiB": _PRE_HOPPER_WS},
    "device:rtx-4090": {
        "hbm_GiB": _smi(24564, "NVIDIA GeForce RTX 4090"),
        "bf16_TFLOPs": "datasheet: NVIDIA Ada (AD102) whitepaper: bf16 with FP32 accumulate 165.2 TF dense",
        "fp32_TFLOPs": "datasheet: NVIDIA Ada whitepaper: FP32 82.6 TF",
        "gemm_TFLOPs": "published: square torch.matmul at 1,024-10,240, bf16 126.8-164.8 TF/s and fp32 45.9-53.8 "
                       "(github zzc0721/torch-performance-test-data issue 78, its test.py at 9d82827; the best bf16 "
                       "figure is the median of the repository's six 24 GB RTX 4090 runs, 162.4-173.3); other "
                       "layouts than a @ b at the same rates: estimate (measured_kernels.py RTX4090_MATMUL_TFLOPs)",
        "hbm_GBps": "datasheet: NVIDIA Ada whitepaper: GDDR6X 1,008 GB/s",
        "library_workspace_MiB": _PRE_HOPPER_WS},
    "device:rtx-3090": {
        "hbm_GiB": _smi(24576, "NVIDIA GeForce RTX 3090"),
        "bf16_TFLOPs": "datasheet: NVIDIA Ampere GA102 whitepaper, appendix A: bf16 with FP32 accumulate 71 TF dense",
        "fp32_TFLOPs": "datasheet: NVIDIA GA102 whitepaper: FP32 35.6 TF",
        "hbm_GBps": "datasheet: NVIDIA GA102 whitepaper: GDDR6X 936 GB/s",
        "library_workspace_MiB": _PRE_HOPPER_WS},
    "device:v100-32gb": {
        "gemm_TFLOPs": _V100_MEGATRON,
        "attention_TFLOPs": _V100_MEGATRON + "; attention at half that rate in the planner's causal count: "
                            "Megatron v1.1.5 computes and masks the whole T x T score matrix",
        "hbm_GiB": "published: nvidia-smi 32480 MiB in DeepSpeed's ZeRO-Offload tutorial screenshot of its DGX-2 "
                   "run (microsoft/DeepSpeed docs/assets/images/zero_offload_dp1_10B_smi.png)",
        "bf16_TFLOPs": "datasheet: NVIDIA V100: 125 TF tensor (fp16: Volta has no bf16; the runs it stands for "
                       "trained in fp16)",
        "fp32_TFLOPs": "datasheet: NVIDIA V100 SXM2: FP32 15.7 TF",
        "hbm_GBps": "datasheet: NVIDIA V100: HBM2 900 GB/s",
        "library_workspace_MiB": _PRE_HOPPER_WS},
    # ---- links: achieved pinned-copy rates, not the wire rate --------------------------------
    "link:pcie-gen3": {
        "h2d_GBps": "estimate: ~12 of 15.75 GB/s; an nvbandwidth run on a PCIe 4.0 x8 link (the same raw rate) "
                    "reported 12.98 h2d",
        "d2h_GBps": "estimate: as h2d; the same nvbandwidth run reported 13.17 d2h",
        "latency_us": "estimate: 10 us per copy (launch, DMA set-up, completion)",
        "pageable_GBps": "estimate: about half of pinned"},
    "link:pcie-gen4": {
        "h2d_GBps": "published: nvbandwidth host_to_device_memcpy_ce on an A10 (PCIe 4.0 x16): 25.17 GB/s",
        "d2h_GBps": "estimate: equal to or slightly above h2d",
        "latency_us": "estimate: 10 us per copy",
        "pageable_GBps": "estimate: the CPU's bounce-buffer copy bounds it"},
    "link:pcie-gen5": {
        "h2d_GBps": "published: nvbandwidth on HGX H800/H100-class nodes, 55.3-56.5 GB/s h2d per GPU; measured "
                    "55.1 GB/s on this project's H200 (docs/gpu_runs.md)",
        "d2h_GBps": "published: the same nvbandwidth runs, 55.1-57.4 GB/s; measured 55.2 on the H200",
        "latency_us": "estimate: 10 us per copy (the H200 run measured 184-202 us for the executor's copy op, "
                      "Python included, docs/gpu_runs.md)",
        "pageable_GBps": "estimate: 15 GB/s, CPU bounce-buffer bound; measured 17.1-18.8 on the H200's Xeon host"},
    "link:nvlink-c2c": {
        "h2d_GBps": "published: nvbandwidth v0.6 on a GH200 480GB (driver 550.54) in SuperBench's nvbandwidth "
                    "test: 337.55 GB/s (other reports nearer 400: uncertain)",
        "d2h_GBps": "published: the same run, 295.23 GB/s",
        "latency_us": "estimate: 5 us per copy",
        "pageable_GBps": "estimate: 100 GB/s (pageable memory is reachable over ATS on Grace)"},
    # ---- hosts ---------------------------------------------------------------------------------
    "host:default": {
        "dram_GBps": "estimate: ~75% of 409.6 GB/s, 16 channels of DDR4-3200 (the usual STREAM-triad fraction)",
        "cores": "estimate: a dual-socket 2 x 32-core x86 server",
        "dram_channels": "estimate: 2 sockets x 8 channels (a dual-socket Xeon or EPYC server's)",
        "dram_MTps": "estimate: DDR4-3200, a server's usual rate",
        "adam_Gparams_per_s": "estimate: 4 G params/s for 64 cores. Measured: Horizon's AdamW at 4.42-4.76 G params/s "
                              "on 16 cores of the H200 box's Xeon (docs/gpu_runs.md); 1.7-1.9 on 1-2 threads of "
                              "this project's EPYC, equal to DeepSpeedCPUAdam (benchmarks/adam_rates.py). Published: "
                              "DeepSpeedCPUAdam 1.6 on a 2017 Skylake DGX-2 host (host dgx-2)"},
    "host:grace": {
        "dram_GBps": "estimate: ~75% of the 546 GB/s LPDDR5X peak (NVIDIA Grace Hopper whitepaper)",
        "cores": "datasheet: 72 Neoverse V2 cores (NVIDIA Grace Hopper whitepaper)",
        "dram_channels": "estimate: 8 channels' worth of 64 bits: the whitepaper's 546 GB/s is a 512-bit LPDDR5X "
                         "interface at 8533 MT/s",
        "dram_MTps": "estimate: LPDDR5X-8533, as dram_channels",
        "adam_Gparams_per_s": "published: DeepSpeed's CPU Adam on a GH200's Grace, 8B parameters in 0.769 "
                              "(deepspeedai/DeepSpeed blogs/deepspeed-superoffload, figure 5; unit not printed, "
                              "read as seconds): 10.4 G params/s",
        "deepspeed_adam_Gparams_per_s": "published: as adam_Gparams_per_s, the figure is DeepSpeed's own CPU Adam "
                                        "on Grace (SuperOffload's GraceAdam): 10.4 G params/s"},
    "host:desktop": {
        "dram_GBps": "estimate: ~70% of 89.6 GB/s, 2 channels of DDR5-5600",
        "cores": "estimate: a 16-core desktop",
        "dram_channels": "estimate: 2 channels, a desktop board's",
        "dram_MTps": "estimate: DDR5-5600, a current desktop's",
        "adam_Gparams_per_s": "estimate: the server estimate scaled down by cores",
        "os_reserved_GiB": "estimate: a desktop OS and its applications"},
    "host:dgx-2": {
        "dram_GBps": "estimate: ~75% of 12 channels of DDR4-2666 (256 GB/s theoretical)",
        "cores": "datasheet: NVIDIA DGX-2: 2 x Intel Xeon Platinum 8168, 24 cores each",
        "dram_channels": "datasheet: Intel Xeon Platinum 8168: 6 DDR4 channels a socket, 2 sockets",
        "dram_MTps": "datasheet: Intel Xeon Platinum 8168: DDR4-2666",
        "adam_Gparams_per_s": "published: DeepSpeedCPUAdam's optimizer_step of a 10B model in 6.2-6.5 s on a DGX-2 "
                              "(microsoft/DeepSpeed docs/assets/images/zero_offload_dp1_10B_log.png): ~1.6",
        "deepspeed_adam_Gparams_per_s": "published: the same DeepSpeedCPUAdam optimizer_step, 10B in 6.2-6.5 s on a "
                                        "DGX-2 (zero_offload_dp1_10B_log.png): ~1.6 G params/s"},
}


def source_of(kind: str, preset, field: str) -> str | None:
    """The entry for `field` of the `kind` ('device', 'link', 'host') preset object: its own, or
    DEFAULTS' where it keeps the dataclass default; None where there is none."""
    own = SOURCES.get(f"{kind}:{preset.name}", {}).get(field)
    if own is not None:
        return own
    default = {f.name: f.default for f in fields(preset)}.get(field)
    return DEFAULTS.get(f"{kind}.{field}") if getattr(preset, field) == default else None
