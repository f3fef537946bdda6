"""`horizon calibrate`: measure the machine this runs on, for the executor's backend, and return
a HardwareSpec the planner can simulate with (saved as TOML by the CLI).

CPU backend (the "device" is the compute lane's own core(s); the copy and optimizer lanes are
threads sharing the remaining core(s)). Each figure is measured in a thread set up exactly like
the lane that will do the work (same cores, same intra-op thread count):
  gemm_TFLOPs         torch.mm throughput by shape (a log-spaced grid, plus a model's exact
                      shapes when given) and layout (x.W^T, dY.W, X^T.dY), bf16 and fp32, with
                      operands cold in the core's cache as a layer op finds its weights
  attention_TFLOPs    the causal SDPA forward and backward kernels, timed kernel by kernel as
                      the template calls them (strided heads, grouped kv), by (seq, head_dim);
                      masked_attention_TFLOPs the same under an explicit mask (sliding
                      windows, document masks), against the full T x T count
  hbm_GBps            bandwidth of the template's own elementwise kernels (norms, RoPE, SiLU,
                      casts, residuals): the slope of their kernel time over the bytes they
                      move between a small and a large token count, so the per-kernel dispatch
                      cost stays in the op overheads and is not counted twice
  loss_ns_per_logit   the LM head's loss kernels (fp32 upcast, logsumexp, gather, softmax
                      gradient in place, cast back) per logit: exp/log-bound, not bandwidth
  reduce_GBps         an offload's squared-norm pass over a gradient, as it runs in place (the
                      offloads of the in-place run below, beyond their copy; only offloads no
                      other host lane overlapped, since the simulator shares the cores itself)
  op_overhead_us      fixed cost per compute op kind: a tiny model trained with its ops
                      serialized (no lane overlap), each op's time less its modelled work;
                      head_chunk from the tiny head with eight loss chunks against one
  h2d/d2h_GBps        one copy thread's rate for layer-sized copies from (to) buffers that are
                      cold in cache, as load_weights (offload_grads) see them; latency_us: the
                      copy ops' fixed cost in the tiny serialized run
  busy_latency_us     what a copy (LinkSpec) or a CPU-lane op (HostSpec) costs extra when it
                      runs next to a busy compute lane: a small model trained normally, each
                      such op's time less its modelled time alone (ops that overlapped another
                      host lane's op are left out: the simulator shares the host cores itself)
  lane_cores          how many cores' worth of copies k threads get on the host-lane cores
                      together (k = 2 x those cores): 1.0 per core means perfect time sharing
  adam_Gparams_per_s  the executor's AdamW op (bf16 grads, fp32 master and moments, bf16
                      working copy refreshed; its kernel: native one-pass, or torch's in chunks
                      where that cannot be built) on cold units with warm grads
  thread_GBps         one host thread accumulating bf16 grads into cold fp32 host grads
  dram_GBps           all cores copying at once (the bus), bytes read + written per second
  runtime_overhead    RSS of a training process before model tensors: a tiny model trained in
                      a fresh process (probe.py), less its tensors and allocator retention
  disk_*              the disk tier's disk (disk.py): units of moments written and read back with
                      the executor's own I/O (O_DIRECT) in --disk-dir; disk_GiB: its free space
The noise-prone figures are measured in `rounds` rounds spread over the run (the GEMM grid is
visited once per round, in alternating order) and averaged on time: a shared machine's speed
drifts by tens of percent over seconds.
  cluster             the executor's gloo reduce-scatter between two processes over loopback
                      TCP, fitted to a ring step's bandwidth and latency (collectives.py): the
                      fabric and network a data-parallel CPU run uses (`horizon plan --hardware FILE --gpus N`)
  compute_contention  how much slower the template block runs on the compute core while a
                      host-lane thread copies beside it (shared cache and DRAM bandwidth); the
                      simulator slows compute by it while host-lane work streams
CUDA backend: pinned and pageable h2d/d2h bandwidth and latency, GEMM throughput by shape,
attention, elementwise bandwidth, per-op overheads (the same tiny serialized run), AdamW with
all host cores, RAM and runtime overhead. Written for a GPU box; not exercised on the machine
this was developed on (no GPU there).

`quick=True` shrinks every grid and does one round (for tests).

The package, a concept a module: timing.py (medians, lane threads, progress, the per-kernel
timer), kernels.py (GEMM, attention, elementwise, loss), host.py (copies, reduce, accumulate,
AdamW, shared cores, bus, RAM), contention.py (lanes together), overheads.py (the tiny
serialized model: per-op costs, runtime RSS), cpu.py and cuda.py (each backend's whole run).
"""
from horizon_exec.measure.calibrate.cpu import calibrate_cpu
from horizon_exec.measure.calibrate.cuda import calibrate_cuda
from horizon_exec.measure.calibrate.kernels import block_pass
from horizon_exec.measure.calibrate.timing import KernelTimer
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

__all__ = ["calibrate", "KernelTimer", "block_pass"]


def calibrate(device: str = "cpu", *, quick: bool = False, model: ModelSpec | None = None,
              policy: Policy | None = None, say=print, rounds: int | None = None, disk_dir=None,
              disk_io: str = "direct") -> HardwareSpec:
    """Measure this machine for the executor on `device` ('cpu' or 'cuda[:N]'). `model` and
    `policy` add their exact GEMM shapes to the table. `say`: progress lines (None: quiet).
    `rounds`: how many times the cheap, noise-prone measurements (attention, elementwise,
    per-op costs, copies, AdamW) are repeated, spread over the run (default 3, quick 1); each
    figure is the mean over rounds of its time. `disk_dir`: the folder whose disk the disk tier
    would use (default: the system temp dir), `disk_io` how the disk tier reads and writes it."""
    rounds = rounds or (1 if quick else 3)
    from horizon_exec.measure.arg_bounds import ROUNDS, check_disk_dir
    if not ROUNDS[0] <= rounds <= ROUNDS[1]:
        raise HorizonError(f"rounds={rounds} must be in {ROUNDS[0]}..{ROUNDS[1]}")
    check_disk_dir(disk_dir)  # before the minutes of measuring that come first
    if device == "cpu":
        return calibrate_cpu(quick, model, policy, say, rounds, (disk_dir, disk_io))
    if device.startswith("cuda"):
        return calibrate_cuda(device, quick, model, policy, say, rounds, (disk_dir, disk_io))
    raise HorizonError(f"device {device!r}: calibrate measures 'cpu' or 'cuda[:N]'")
