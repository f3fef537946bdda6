"""Chrome trace export: open the JSON in ui.perfetto.dev or chrome://tracing.

One process (pid 1) with one thread per lane (h2d, compute, d2h, cpu; fabric and net when the
step has them), one complete event
("ph": "X") per op, and a counter track ("ph": "C") for device memory. Times are microseconds
from the step's start, as the format requires."""
import json
from pathlib import Path

from horizon_sim.errors import HorizonError
from horizon_sim.safe_files import refuse_non_regular, write_atomic
from horizon_sim.schedule.op import Lane
from horizon_sim.units import GiB

PID = 1
TID = {lane.value: i + 1 for i, lane in enumerate(Lane)}  # h2d 1, compute 2, d2h 3, cpu 4
_US = 1e6


def _label(row, labels: dict) -> str:
    if row.op_id in labels:
        return labels[row.op_id]
    return f"{row.kind}[{row.unit}]"


def chrome_trace(result) -> dict:
    """The trace of one step as a dict in the Chrome Trace Event format."""
    tl, meta, hw = result.timeline, result.schedule.meta, result.hardware
    labels = {op.id: op.label for op in result.schedule.ops}
    name = f"horizon: {meta.model.name} on {hw.name or hw.device.name}"
    ev = [{"ph": "M", "pid": PID, "name": "process_name", "args": {"name": name}}]
    used = {lane.value for lane in result.schedule.lanes}
    for lane, tid in TID.items():
        if lane not in used:  # the fabric and net lanes only for a data-parallel step
            continue
        ev.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": lane}})
        ev.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index",
                   "args": {"sort_index": tid}})
    for r in tl.itertuples(index=False):
        ev.append({
            "ph": "X", "pid": PID, "tid": TID[r.lane], "name": _label(r, labels), "cat": r.kind,
            "ts": float(r.start_s) * _US, "dur": float(r.dur_s) * _US,
            "args": {"op_id": int(r.op_id), "unit": int(r.unit), "micro": int(r.micro),
                     "link_bytes": int(r.link_bytes), "flops": float(r.flops),
                     "host_bytes": int(r.host_bytes)},
        })
    mem = result.device_trace.drop_duplicates("time_s", keep="last")  # last value at each instant
    for t, b in zip(mem.time_s, mem.bytes):
        ev.append({"ph": "C", "pid": PID, "name": "device memory", "ts": float(t) * _US,
                   "args": {"GiB": float(b) / GiB}})
    s = result.summary
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"model": meta.model.name, "hardware": hw.name or hw.device.name,
                          "step_time_s": s.step_time_s, "mfu": s.mfu,
                          "device_usable_GiB": s.device_usable_bytes / GiB}}


def write_trace(result, path) -> Path:
    """Write chrome_trace(result) as JSON to `path`; returns the path."""
    path = Path(path)
    if not path.parent.is_dir():
        raise HorizonError(f"cannot write trace {str(path)!r}: directory {str(path.parent)!r} does not exist")
    refuse_non_regular(path, "cannot write trace", allow_chardev=True)  # a FIFO would block the open
    data = chrome_trace(result)
    return write_atomic(path, json.dumps(data, separators=(",", ":")).encode(), "trace")
