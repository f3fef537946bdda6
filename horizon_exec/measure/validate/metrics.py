"""Metrics of one timeline, predicted or measured alike: the step's end, each lane's busy time
(sum of op durations) and the overlap (the fraction of the copy/CPU lanes' busy time that runs
while the compute lane is busy, by interval union and intersection).
"""
import pandas as pd

LANES = ("compute", "h2d", "d2h", "cpu")


def _union(intervals) -> list[tuple[float, float]]:
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(iv) -> float:
    return sum(b - a for a, b in iv)


def _intersect(x, y) -> float:
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def timeline_metrics(tl: pd.DataFrame) -> dict:
    """busy_<lane> (s), overlap (fraction of the other lanes' busy time that overlaps compute),
    end_s (the last op's end)."""
    out = {"end_s": float(tl.end_s.max())}
    for lane in LANES:
        out[f"busy_{lane}"] = float(tl[tl.lane == lane].dur_s.sum())
    comp = _union(zip(tl[tl.lane == "compute"].start_s, tl[tl.lane == "compute"].end_s))
    other = _union(zip(tl[tl.lane != "compute"].start_s, tl[tl.lane != "compute"].end_s))
    out["overlap"] = _intersect(comp, other) / _length(other) if other else 0.0
    return out
