"""The GH100 presets price compute from an H200 measurement (horizon_sim/specs/measured): the
H200 as measured, the H100 SXM and GH200 with the same compute rates, the H100 PCIe scaled by
its dense peak, elementwise work scaled by each part's HBM peak; the other presets keep the flat
efficiency. The file is read as a hardware file's tables are, so a measured shape comes back
exactly."""
import tomllib

import pytest

from horizon_sim.sim.costs import CostModel
from horizon_sim.specs.hardware_presets import DEVICES, make_hardware
from horizon_sim.specs.measured_kernels import H200_FILE

MEASURED = tomllib.loads(H200_FILE.read_text())


def test_the_h200_preset_carries_the_measured_tables_as_measured():
    d = DEVICES["h200"]
    assert [tuple(r) for r in MEASURED["gemm_TFLOPs"]] == [tuple(r) for r in d.gemm_TFLOPs]
    assert [tuple(r) for r in MEASURED["attention_TFLOPs"]] == [tuple(r) for r in d.attention_TFLOPs]
    assert d.elementwise_GBps == pytest.approx(MEASURED["elementwise_GBps"])
    assert dict(d.op_overhead_us) == dict(MEASURED["op_overhead_us"])


@pytest.mark.parametrize("name,compute,hbm", [("h100-sxm", 1.0, 3350 / 4800), ("gh200", 990 / 989, 4000 / 4800),
                                              ("h100-pcie", 756 / 989, 2000 / 4800)])
def test_other_gh100_parts_scale_it_by_their_peaks(name, compute, hbm):
    d, h = DEVICES[name], DEVICES["h200"]
    for mine, ref in zip(d.gemm_TFLOPs, h.gemm_TFLOPs):
        assert mine[:5] == ref[:5] and mine[5] == pytest.approx(ref[5] * compute)
    assert d.attention_TFLOPs[3][3] == pytest.approx(h.attention_TFLOPs[3][3] * compute)
    assert d.elementwise_GBps == pytest.approx(h.elementwise_GBps * hbm)


def test_other_presets_keep_the_flat_efficiency():
    for name in ("a100-80gb", "l40s", "rtx-4090", "v100-32gb"):
        d = DEVICES[name]
        assert not d.gemm_TFLOPs and not d.attention_TFLOPs and d.elementwise_GBps == 0


def test_the_planner_prices_a_measured_shape_at_its_measured_rate():
    """A GEMM the H200 measured runs at that rate in the cost model (not at peak x 0.70)."""
    row = next(r for r in MEASURED["gemm_TFLOPs"] if r[0] == "bf16" and r[1] == "nt" and r[2] == 4096.0
               and r[3] == 4096.0 and r[4] == 4096.0)
    cm = CostModel(make_hardware("h200"), "bf16")
    assert cm.gemm.rate("nt", (4096.0, 4096.0, 4096.0)) == pytest.approx(row[5])
    assert row[5] != pytest.approx(989 * 0.70, rel=0.02)  # the flat figure it replaces
