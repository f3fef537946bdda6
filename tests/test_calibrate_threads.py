"""calibrate's compute-thread measurement (measure/calibrate/threads.py): a row per count the
executor may use, relative to the base split alone, and old files still read."""
import os

import pytest

from horizon_exec.measure.calibrate.threads import measure_thread_speeds, thread_counts
from horizon_sim.specs.core_split import thread_speeds
from horizon_sim.specs.hardware_io import load_hardware


def test_counts_cover_what_auto_may_choose():
    assert thread_counts(1) == [1] and thread_counts(2) == [1, 2] and thread_counts(8) == list(range(1, 9))
    assert thread_counts(12) == [1, 2, 4, 8, 11, 12]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_rows_are_relative_to_the_base_split():
    cores = sorted(os.sched_getaffinity(0))[:2]
    rows = measure_thread_speeds(cores, 1, quick=True)
    assert [t for t, _, _ in rows] == [1.0, 2.0]
    assert rows[0][1] == 1.0  # the base alone: the reference of every round
    assert all(a > 0 and s > 0 for _, a, s in rows)


def test_a_file_from_before_the_table_still_prices_every_count(tmp_path):
    """A calibrated file as calibrate wrote it before the thread table: the demo's file with the
    table's two keys taken out (the repo's reports/machine.toml is rewritten by make demo)."""
    import re
    text = open("reports/machine.toml").read()
    old = re.sub(r"\nthread_speed = \[\n(?:    \[.*\],\n)*\]", "", re.sub(r"\ncompute_threads = \d+", "", text))
    assert "thread_speed" not in old and "compute_threads" not in old
    (tmp_path / "old.toml").write_text(old)
    hw = load_hardware(tmp_path / "old.toml")
    assert hw.device.compute_threads == 0 and hw.device.thread_speed == ()
    assert sorted(thread_speeds(hw)) == list(range(1, hw.host.cores + 1))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_kernel_rows_are_relative_to_the_base_split_and_restore_the_thread():
    import torch

    from horizon_exec.measure.calibrate.kernel_threads import measure_kernel_speeds
    cores = sorted(os.sched_getaffinity(0))[:2]
    before = (torch.get_num_threads(), os.sched_getaffinity(0))
    rows = measure_kernel_speeds(cores, 1, True, [1, 2])
    assert [r[0] for r in rows] == [1.0, 2.0] and rows[0][1:] == (1.0, 1.0, 1.0)  # the base: each round's reference
    assert all(len(r) == 4 and all(v > 0 for v in r[1:]) for r in rows)
    assert (torch.get_num_threads(), os.sched_getaffinity(0)) == before
