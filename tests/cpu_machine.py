"""A CPU-backend-like HardwareSpec in round numbers (no measured tables, so the flat rates
apply), shared by the validation and simulator tests: torch-free. The bus (traffic: read +
written) carries one 15 GB/s CPU-thread copy (30 GB/s of traffic) at full speed."""
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec

CPU_HW = HardwareSpec(
    device=DeviceSpec(name="cpu-core", hbm_GiB=16, bf16_TFLOPs=0.2, fp32_TFLOPs=0.1, hbm_GBps=15,
                      default_link="cpu-threads", matmul_efficiency=0.8, reserved_GiB=0,
                      launch_overhead_us=2000),
    link=LinkSpec(name="cpu-threads", h2d_GBps=15, d2h_GBps=15, latency_us=30, pageable_GBps=15,
                  busy_latency_us=200, cpu_driven=True),
    host=HostSpec(name="cpu", ram_GiB=16, dram_GBps=30, cores=2, adam_Gparams_per_s=1.0,
                  os_reserved_GiB=1, runtime_overhead_GiB=0.35, lane_cores=1, thread_GBps=10,
                  op_latency_us=40, busy_latency_us=100))
