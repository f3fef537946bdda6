"""Issue 30: hardware file numbers have sane ranges (horizon_sim/specs/ranges.py). A finite but
absurd value (hbm_GiB = 1e300 overflowed to inf bytes: OverflowError in the planner) is one
line naming the file, the table's key and the range; every preset lies inside the ranges."""
import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware_io import load_hardware, save_hardware
from horizon_sim.specs.hardware_presets import DEVICES, make_hardware


@pytest.fixture(scope="module")
def toml_text(tmp_path_factory):
    p = tmp_path_factory.mktemp("hw") / "hw.toml"
    save_hardware(make_hardware("a100-80gb"), p)  # no measured tables: one line per key
    return p.read_text()


def _with(text: str, table: str, key: str, value: str) -> str:
    out, part = [], None
    for line in text.splitlines():
        if line.startswith("["):
            part = line.strip("[]")
        if part == table and line.startswith(f"{key} = "):
            line = f"{key} = {value}"
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("table,key,value,says", [
    ("device", "hbm_GiB", "1e300", "device hbm_GiB=1e+300 must be from"),
    ("device", "bf16_TFLOPs", "1e-300", "device bf16_TFLOPs=1e-300 must be from"),
    ("link", "h2d_GBps", "1e200", "link h2d_GBps=1e+200 must be from"),
    ("host", "ram_GiB", "1e300", "host ram_GiB=1e+300 must be from"),
    ("host", "cores", "9223372036854775807", "host cores=9223372036854775807 must be from"),
    ("host", "disk_latency_us", "1e300", "host disk_latency_us=1e+300 must be from"),
    ("device", "gemm_TFLOPs", '[["bf16", "nt", 512.0, 512.0, 1e300, 0.2]]', "K=1e+300 in row"),
    ("device", "op_overhead_us", '[["forward", 1e300]]', "US=1e+300 in row"),
])
def test_absurd_values_are_refused_by_name(tmp_path, toml_text, table, key, value, says):
    p = tmp_path / "hw.toml"
    p.write_text(_with(toml_text, table, key, value))
    with pytest.raises(HorizonError) as e:
        load_hardware(p)
    msg = str(e.value)
    assert says in msg and str(p) in msg and "\n" not in msg, msg


def test_cluster_rates_have_ranges():
    from horizon_sim.specs.cluster import ClusterSpec
    from horizon_sim.specs.layout import Layout
    with pytest.raises(HorizonError, match="cluster net_GBps=1e\\+300 must be from 0 to"):
        ClusterSpec(name="x", layout=Layout(1, 2), net_GBps=1e300)


def test_every_preset_is_inside_the_ranges():
    for name in DEVICES:
        make_hardware(name)  # builds every part: the range checks run


def test_the_planner_runs_at_the_edges(tmp_path, toml_text):
    """The largest accepted hbm_GiB and RAM plan without overflowing."""
    from horizon_sim.plan import plan
    from horizon_sim.specs.policy import Policy
    p = tmp_path / "hw.toml"
    p.write_text(_with(_with(toml_text, "device", "hbm_GiB", str(float(1 << 50))), "host", "ram_GiB",
                       str(float(1 << 50))))
    plan("tiny", load_hardware(p), Policy(batch=1, seq=64))
