"""Large host buffers are advised onto transparent huge pages (horizon_exec/device/hugepages.py).

What is asserted is the advice the kernel recorded for the mapping (the `hg` flag of its
/proc/self/smaps entry), not whether huge pages were actually free to back it: that depends
on the system's THP mode and fragmentation, the advice does not.
"""
import gc
import sys

import pytest
import torch

from horizon_exec.device import hugepages
from horizon_exec.device.cpu import CpuBackend
from horizon_exec.device.hugepages import HUGE_PAGE_BYTES, host_bytes
from horizon_sim.errors import HorizonError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not hugepages.wanted(),
                                reason="huge pages are off (HORIZON_HUGE_PAGES=0) or not Linux")


def _vm_flags(addr: int) -> set[str]:
    """The VmFlags of the mapping holding `addr`."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's first line: "start-end perms ..."
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("VmFlags:"):
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_a_large_buffer_is_advised_and_outlives_its_mapping_object():
    n = 3 * HUGE_PAGE_BYTES + 4096 + 3
    t = host_bytes(n)
    assert t.dtype == torch.uint8 and t.numel() == n
    assert "hg" in _vm_flags(t.data_ptr())
    gc.collect()  # only the tensor refers to the mapping now
    t.fill_(7)
    assert int(t[::4096].sum()) == 7 * t[::4096].numel()


def test_small_buffers_and_the_off_switch_are_plain(monkeypatch):
    assert "hg" not in _vm_flags(host_bytes(HUGE_PAGE_BYTES - 1).data_ptr())
    monkeypatch.setenv("HORIZON_HUGE_PAGES", "0")
    assert "hg" not in _vm_flags(host_bytes(4 * HUGE_PAGE_BYTES).data_ptr())


def test_the_cpu_backends_store_and_pool_blocks_are_advised():
    b = CpuBackend()
    assert "hg" in _vm_flags(b.host_raw(2 * HUGE_PAGE_BYTES).data_ptr())
    assert "hg" in _vm_flags(b.host_empty((HUGE_PAGE_BYTES,), torch.float32).data_ptr())


@pytest.mark.parametrize("huge", ["1", "0"])
def test_memory_the_os_refuses_is_a_one_line_error(huge, monkeypatch):
    """1 PiB: beyond a Linux process's default address space (128 TiB) and any machine's RAM,
    so refused everywhere, on the huge-page path (mmap) and the plain one (torch.empty)."""
    monkeypatch.setenv("HORIZON_HUGE_PAGES", huge)
    with pytest.raises(HorizonError, match=r"^cannot allocate 1024.0 TiB of host memory"):
        host_bytes(1 << 50)
