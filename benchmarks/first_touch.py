"""Benchmark: a host thread writing into fresh pages vs into a buffer it keeps (HostSpec.first_touch_GBps).

DeepSpeed v0.6-v0.7's ZeRO-3 gradient boundary, `fp32_grad_tensor.copy_(grad_buffer)` from a
device fp16 tensor into a host fp32 one, lands in a host fp16 temporary that PyTorch allocates
for the copy (copy_kernel_cuda: `at::empty_like(dst, src dtype)`, then a cast on the host), and
frees after it. PyTorch's CPU allocator caches nothing and glibc maps every block over 32 MiB
anew, so each such copy writes into pages the kernel must fault in and zero first. This script
times the same fp16 copy on one thread into a buffer allocated once (its pages already
resident) and into a tensor allocated for each copy, and prints the first-touch rate the
difference implies: bytes / (t_fresh - t_reused). Sizes: one under glibc's 32 MiB ceiling
(the heap reuses it), two above (mapped anew every time).

Run: .venv/bin/python benchmarks/first_touch.py [--reps 12]
Also with transparent huge pages on PyTorch's large blocks: THP_MEM_ALLOC_ENABLE=1 (2 MiB pages).
"""
import argparse
import statistics
import time

import torch

MiB = 1 << 20
GiB = 1 << 30


def copy_rate_GiBps(size_mib: int, reps: int, fresh: bool) -> float:
    n = size_mib * MiB // 2
    src = torch.ones(n, dtype=torch.float16)
    kept = torch.empty(n, dtype=torch.float16)
    kept.copy_(src)  # its pages resident before timing
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst = torch.empty(n, dtype=torch.float16) if fresh else kept
        dst.copy_(src)
        del dst  # a fresh one is unmapped here, as the temporary is after its cast
        times.append(time.perf_counter() - t0)
    return size_mib * MiB / GiB / statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=12, help="copies per size and mode; the median is printed")
    a = p.parse_args()
    if a.reps < 1:
        p.error(f"--reps {a.reps}: must be at least 1")
    torch.set_num_threads(1)  # one thread, as the copy that faults them in
    print(f"one thread, fp16 copies, median of {a.reps}; torch {torch.__version__}")
    print(f"{'size':>8} {'reused GiB/s':>13} {'fresh GiB/s':>12} {'first touch GiB/s':>18}")
    for size in (8, 64, 256):
        reused = copy_rate_GiBps(size, a.reps, fresh=False)
        fresh = copy_rate_GiBps(size, a.reps, fresh=True)
        extra_s = 1 / fresh - 1 / reused  # seconds per GiB the fresh pages add
        touch = f"{1 / extra_s:.1f}" if extra_s > 0 else "no cost"
        print(f"{size:>5} MiB {reused:>13.1f} {fresh:>12.1f} {touch:>18}")


if __name__ == "__main__":
    main()
