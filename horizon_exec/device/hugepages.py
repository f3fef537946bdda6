"""Large host buffers on transparent huge pages (2 MiB) instead of 4 KiB pages.

Why: the optimizer lane streams five arrays at once per unit (fp32 master, gradient, both
moments, bf16 working copy) and the link lanes stream the rest. On 4 KiB pages each of those
streams crosses a page every 1-2 K elements, and the page walks take memory bandwidth from an
update that is memory-bound. On one core of a 2-core Zen 4 VM, the schedule's optimizer ops
with the working copy's streaming stores ran at 0.92-0.95x torch's kernel on 4 KiB pages (3
runs) and 0.94-1.05x on huge pages (7 runs alternated with them; 0.92-1.10x, median 0.99, in
17 runs in all): benchmarks/exec_vs_autograd.py, with and without HORIZON_HUGE_PAGES=0 (both
sides of the ratio move to 4 KiB pages). With plain stores, huge pages alone left the ratio
where it was (median 0.91 in 11 runs against 0.90 in 8). On CUDA boxes
cudaHostRegister also has 512x fewer pages to lock (not measured: no GPU here).

How: an anonymous mmap advised MADV_HUGEPAGE, so this works where the kernel's THP mode is
`madvise` (the common default) as well as `always`, and does nothing harmful under `never`
(plain pages, as before). The mapping is exactly the buffer (rounded up to 4 KiB): a huge
page is only used where all 2 MiB of it lie inside the mapping, so RSS never exceeds the
buffer, as the planner counts it. Linux >= 6.7 starts large anonymous mappings on a 2 MiB
boundary; on older kernels huge pages back the aligned interior. The tensor keeps the
mapping alive; the memory goes back to the OS when the last view dies (no allocator caching
it).

HORIZON_HUGE_PAGES=0 turns it off (plain torch.empty), for A/B measurements.
"""
import mmap
import os

import torch

from horizon_sim.errors import HorizonError
from horizon_sim.units import fmt_bytes

HUGE_PAGE_BYTES = 2 << 20
"""x86-64 and arm64 (4 KiB base pages) transparent huge page size; smaller buffers do not
get one and are allocated plainly."""


def wanted() -> bool:
    return os.environ.get("HORIZON_HUGE_PAGES", "1") != "0" and hasattr(mmap, "MADV_HUGEPAGE")


def host_bytes(nbytes: int) -> torch.Tensor:
    """A zeroed (nbytes,) uint8 host tensor in its own mapping advised to use huge pages,
    when it spans at least one and wanted() is true; else an uninitialised torch.empty."""
    # Refused memory (admission off, or taken since) is a one-line error naming the size.
    if nbytes < HUGE_PAGE_BYTES or not wanted():
        try:
            return torch.empty(nbytes, dtype=torch.uint8)
        except RuntimeError as e:
            if "can't allocate memory" not in str(e):  # DefaultCPUAllocator's words
                raise
            raise HorizonError(f"cannot allocate {fmt_bytes(nbytes)} of host memory") from e
    try:
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as e:
        raise HorizonError(f"cannot allocate {fmt_bytes(nbytes)} of host memory: {e.strerror}") from e
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # THP not built into this kernel: plain pages
        pass
    return torch.frombuffer(m, dtype=torch.uint8)  # shares the mapping and keeps it alive
