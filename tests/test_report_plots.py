"""The overlap plot, the memory plot and the Chrome trace of a simulated step."""
import dataclasses
import json

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from horizon_sim.errors import HorizonError
from horizon_sim.plan import plan
from horizon_sim.report.gantt import LANES, plot_overlap
from horizon_sim.report.memory_plot import plot_memory
from horizon_sim.report.trace import TID, chrome_trace, write_trace
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny():
    return plan("tiny", gpu="h100-pcie")


@pytest.fixture(scope="module")
def llama():  # 265 ops, the limit far above the curve
    return plan("llama-3.1-8b", gpu="h100-pcie")


@pytest.fixture(scope="module")
def tight():  # device checkpoints of a big batch: peak close to the usable limit
    return plan("llama-3.1-8b", gpu="h100-pcie", policy=Policy(batch=64, act_ckpt_on="device"))


def _is_png(path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG_MAGIC) and len(data) > 10_000


# ---- Gantt -------------------------------------------------------------------------------

def test_overlap_plot_writes_png_and_labels_axes(tiny, tmp_path):
    out = tmp_path / "step.png"
    fig = plot_overlap(tiny, out)
    assert isinstance(fig, Figure) and _is_png(out)
    lanes, mem = fig.axes[:2]
    assert mem.get_xlabel() == "time (s)"
    assert mem.get_ylabel() == "device memory (GiB)"
    assert lanes.get_shared_x_axes().joined(lanes, mem)
    ticks = [t.get_text().split("\n")[0] for t in lanes.get_yticklabels()]
    assert ticks == LANES[:4]  # one row per lane of one device, h2d on top (no fabric or net rows)
    title = lanes.get_title()
    assert "tiny" in title and "h100-pcie" in title and "MFU" in title and "step" in title
    legend = {t.get_text() for t in lanes.get_legend().get_texts()}
    assert set(tiny.timeline.kind) == legend  # every kind drawn has a legend entry, and only those
    assert lanes.get_xlim() == pytest.approx((0, tiny.summary.step_time_s))


def test_overlap_plot_custom_title_and_no_file(tiny, tmp_path):
    fig = plot_overlap(tiny, title="hello")
    assert fig.axes[0].get_title() == "hello"
    assert list(tmp_path.iterdir()) == []


def test_one_bar_per_op(tiny):
    lanes = plot_overlap(tiny).axes[0]
    bars = sum(len(c.get_paths()) for c in lanes.collections)
    assert bars == len(tiny.timeline)


def _label_boxes(fig):
    """(lane, box in pixels, box in seconds) of every bar label."""
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    inv = ax.transData.inverted()
    row = {round(y): t.get_text().split("\n")[0] for y, t in zip(ax.get_yticks(), ax.get_yticklabels())}
    out = []
    for t in ax.texts:
        b = t.get_window_extent()
        lane = row[round(t.get_position()[1])]
        out.append((lane, b, (inv.transform((b.x0, b.y0))[0], inv.transform((b.x1, b.y1))[0])))
    return out


def test_layer_numbers_on_wide_bars(tiny):
    texts = {t.get_text() for t in plot_overlap(tiny).axes[0].texts}
    assert {str(i) for i in range(tiny.schedule.meta.n_layers)} <= texts


@pytest.mark.parametrize("which", ["tiny", "llama", "tight"])
def test_bar_labels_do_not_collide(which, request):
    """Labels fit inside their bar and never overlap, however many ops there are."""
    result = request.getfixturevalue(which)
    fig = plot_overlap(result)
    boxes = _label_boxes(fig)
    assert 0 < len(boxes) <= len(result.timeline)
    tl = result.timeline
    for lane, _, (lo, hi) in boxes:  # inside the bar it names
        mid = (lo + hi) / 2
        bar = tl[(tl.lane == lane) & (tl.start_s <= mid) & (tl.end_s >= mid)]
        assert len(bar) == 1
        assert bar.start_s.iloc[0] <= lo and hi <= bar.end_s.iloc[0]
    for lane in {lane for lane, _, _ in boxes}:  # and apart from each other
        xs = sorted((b.x0, b.x1) for l, b, _ in boxes if l == lane)
        for (_, right), (left, _) in zip(xs, xs[1:]):
            assert right <= left


def test_hundreds_of_ops_draw_as_a_few_artists():
    # What keeps a long step's plot cheap, checked by counting artists rather than timing the
    # draw: one bar collection per (lane, op kind), never one patch per op, and thin bars
    # carry no label.
    spec = dataclasses.replace(model_preset("llama-2-7b"), n_layers=80)
    r = plan(spec, gpu="h100-pcie", policy=Policy(act_ckpt_every=4, micro_batches=2))
    assert len(r.timeline) > 500
    fig = plot_overlap(r)
    FigureCanvasAgg(fig).draw()
    lanes = fig.axes[0]
    groups = r.timeline.groupby(["lane", "kind"]).ngroups
    assert len(lanes.collections) == groups
    assert sum(len(c.get_paths()) for c in lanes.collections) == len(r.timeline)  # every op drawn
    assert len(lanes.patches) == 0
    assert len(lanes.texts) < len(r.timeline) / 2  # thin bars stay unlabelled


# ---- memory -------------------------------------------------------------------------------

def _dashed(ax):
    return [l for l in ax.get_lines() if l.get_linestyle() == "--"]


def test_memory_plot_standalone(tight, tmp_path):
    out = tmp_path / "mem.png"
    fig = plot_memory(tight, out)
    assert _is_png(out)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (s)" and ax.get_ylabel() == "device memory (GiB)"
    limit = tight.summary.device_usable_bytes / GiB
    (line,) = _dashed(ax)
    assert line.get_ydata()[0] == pytest.approx(limit)  # the usable limit, to scale
    curve = ax.get_lines()[0]
    assert max(curve.get_ydata()) == pytest.approx(tight.summary.device_typical_peak_bytes / GiB)
    if tight.summary.device_peak_bytes > tight.summary.device_typical_peak_bytes:  # the bound, dotted
        (bound,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
        assert bound.get_ydata()[0] == pytest.approx(tight.summary.device_peak_bytes / GiB)
    assert ax.get_ylim()[1] > limit


def test_memory_limit_far_above_is_marked_off_scale(tiny):
    ax = plot_memory(tiny).axes[0]
    assert ax.get_ylim()[1] < tiny.summary.device_usable_bytes / GiB  # zoomed on the curve
    assert len(_dashed(ax)) == 1
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("usable limit" in t and "off scale" in t for t in labels)


@pytest.mark.parametrize("fn", [plot_overlap, plot_memory])
def test_bad_plot_paths_raise(fn, tiny, tmp_path):
    with pytest.raises(HorizonError, match="does not exist"):
        fn(tiny, tmp_path / "missing" / "x.png")
    with pytest.raises(HorizonError, match="unknown image format"):
        fn(tiny, tmp_path / "x.notaformat")


def test_svg_output(tiny, tmp_path):
    plot_overlap(tiny, tmp_path / "x.svg")
    assert (tmp_path / "x.svg").read_text().lstrip().startswith("<?xml")


# ---- Chrome trace -------------------------------------------------------------------------

def test_trace_one_event_per_op(llama):
    trace = json.loads(json.dumps(chrome_trace(llama)))  # plain JSON types only
    ev = trace["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    tl = llama.timeline.set_index("op_id")
    assert sorted(e["args"]["op_id"] for e in xs) == sorted(tl.index)
    threads = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {v: k for k, v in TID.items() if k in {"h2d", "compute", "d2h", "cpu"}}  # one device
    labels = {op.id: op.label for op in llama.schedule.ops}
    for e in xs:
        row = tl.loc[e["args"]["op_id"]]
        assert e["pid"] == 1
        assert threads[e["tid"]] == row.lane
        assert e["name"] == labels[e["args"]["op_id"]] and e["cat"] == row.kind
        assert e["ts"] == pytest.approx(row.start_s * 1e6)
        assert e["dur"] == pytest.approx(row.dur_s * 1e6)
        assert e["args"]["unit"] == row.unit and e["args"]["micro"] == row.micro
        assert e["args"]["link_bytes"] == row.link_bytes
        assert e["args"]["flops"] == pytest.approx(row.flops)


def test_trace_memory_counter(llama):
    cs = [e for e in chrome_trace(llama)["traceEvents"] if e["ph"] == "C"]
    assert cs and all(e["pid"] == 1 and e["name"] == "device memory" for e in cs)
    ts = [e["ts"] for e in cs]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    assert max(e["args"]["GiB"] for e in cs) == pytest.approx(llama.summary.device_peak_bytes / GiB)


def test_write_trace(tiny, tmp_path):
    out = write_trace(tiny, tmp_path / "t.json")
    data = json.loads(out.read_text())
    assert sum(e["ph"] == "X" for e in data["traceEvents"]) == len(tiny.timeline)
    with pytest.raises(HorizonError, match="does not exist"):
        write_trace(tiny, tmp_path / "missing" / "t.json")


def test_every_op_kind_has_a_colour():
    """A Gantt or overlay of any Schedule (the disk tier's ops included) can be drawn."""
    from horizon_sim.report.gantt import KIND_COLOR
    from horizon_sim.schedule.op import OpKind
    assert set(KIND_COLOR) == set(OpKind)
