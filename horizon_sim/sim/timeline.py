"""Timeline: one row per op with when it ran. The simulator predicts one, the executor
measures one, in the same columns, so the two can be compared op by op."""
import pandas as pd

from horizon_sim.schedule.op import Op

COLUMNS = ["op_id", "kind", "lane", "unit", "micro", "start_s", "end_s", "link_bytes", "flops",
           "host_bytes"]


def timeline_frame(ops: list[Op] | tuple[Op, ...], start_s, end_s) -> pd.DataFrame:
    """Rows for `ops` with matching start/end times (seconds from the step's start)."""
    df = pd.DataFrame({
        "op_id": [o.id for o in ops],
        "kind": [o.kind.value for o in ops],
        "lane": [o.lane.value for o in ops],
        "unit": [o.unit for o in ops],
        "micro": [o.micro for o in ops],
        "start_s": list(start_s),
        "end_s": list(end_s),
        "link_bytes": [o.link_bytes for o in ops],
        "flops": [o.flops for o in ops],
        "host_bytes": [o.host_bytes for o in ops],
    }, columns=COLUMNS)
    df["dur_s"] = df["end_s"] - df["start_s"]
    return df


def check_obeys_schedule(df: pd.DataFrame, sched, tol_s: float = 1e-9) -> None:
    """Raise AssertionError if a row starts before a dependency or its lane predecessor ended."""
    by_id = df.set_index("op_id")
    end = by_id["end_s"].to_dict()
    start = by_id["start_s"].to_dict()
    prev_on_lane: dict = {}
    for op in sched.ops:
        if op.id not in start:
            continue
        waits = [d for d in op.deps if d in end]
        if op.lane in prev_on_lane:
            waits.append(prev_on_lane[op.lane])
        for d in waits:
            if start[op.id] + tol_s < end[d]:
                raise AssertionError(f"{op.label} started at {start[op.id]:.6f}s before "
                                     f"{sched.ops[d].label} ended at {end[d]:.6f}s")
        prev_on_lane[op.lane] = op.id
