"""`horizon validate --published`: published GPU measurements set beside the planner. The rows
are read and checked (a typo is an error naming the row), every row is planned on its own
setup or listed with the reason it was not, and each predicted figure is what `horizon plan`
gives for that setup, recomputed in the source's own counting."""
import math
import statistics

import pytest

from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from horizon_sim.peer.compare import plan_zero3, zero3_like
from horizon_sim.plan import plan
from horizon_sim.published import load_rows, run_suite
from horizon_sim.published.quantity import QUANTITIES, error
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.specs.policy import Policy

ROW = '''
[[row]]
id = "{id}"
source = "{source}"
cite = "somewhere, table 1"
setup = "as the source ran it"
system = "{system}"
plan = "{plan}"
quantity = "{quantity}"
value = {value}
'''
SMALL = "--model qwen2.5-0.5b --gpu a100-80gb --ram 256GiB --batch 4 --seq 1024"


def _file(tmp_path, *rows, extra=""):
    p = tmp_path / "rows.toml"
    p.write_text("".join(ROW.format(**{"id": f"r{i}", "source": "S", "system": "horizon", "plan": SMALL,
                                       "quantity": "tokens_per_s", "value": 1000, **r}) for i, r in enumerate(rows))
                 + extra)
    return p


def test_builtin_rows_cover_the_issue_floor():
    """At least 15 rows from at least 5 independent sources, each with a citation and a setup;
    a row the planner cannot reach says why."""
    rows = load_rows()
    assert len(rows) >= 15 and len({r.source for r in rows}) >= 5
    for r in rows:
        assert r.cite.strip() and r.setup.strip(), r.id


def test_builtin_suite_plans_every_reachable_row():
    res = run_suite(load_rows())
    t = res.table
    assert len(t) == len(load_rows())  # nothing dropped
    assert (t.status.str.startswith("ok") | t.status.str.startswith("not modelled")).all(), \
        t[~t.status.str.startswith(("ok", "not modelled"))][["id", "status"]].to_string()
    ok = res.compared
    assert ok.predicted.notna().all() and (ok.predicted >= 0).all()
    # 9 since the V100 ZeRO-3 figures and MegaTrain's 4-GPU one were found unreachable (listed
    # with the reason) and the four ZeRO-2 Offload rows became comparable
    assert res.figures()["groups"]["throughput"]["rows"] >= 9
    assert len(ok) >= 15 and ok.source.nunique() >= 5  # the issue's floor, among the rows compared


def test_predictions_are_the_planners_in_the_sources_counting(tmp_path):
    """tokens/s, step time and both TFLOPS countings come from the same plan as `horizon plan`."""
    f = _file(tmp_path, {"quantity": "tokens_per_s"}, {"quantity": "step_s", "value": 5.0},
              {"quantity": "tflops_6NT", "value": 100}, {"quantity": "tflops_8NT", "value": 100},
              {"quantity": "host_GB", "value": 50}, {"quantity": "host_GiB_between_steps", "value": 50},
              {"quantity": "device_GiB", "value": 20}, extra='memory_figure = "allocated"\n')
    res = run_suite(load_rows(f))
    model = load_model("qwen2.5-0.5b")
    r = plan(model, make_hardware("a100-80gb", "256GiB"), Policy(batch=4, seq=1024))
    s, n = r.summary, model.total_params
    got = dict(zip(res.table.quantity, res.table.predicted))
    assert got["tokens_per_s"] == pytest.approx(s.tokens_per_s)
    assert got["step_s"] == pytest.approx(s.step_time_s)
    assert got["tflops_6NT"] == pytest.approx(6 * n * s.tokens_per_s / 1e12)
    assert got["tflops_8NT"] == pytest.approx(8 * n * s.tokens_per_s / 1e12)
    assert got["host_GB"] == pytest.approx(s.host_bytes / 1e9)
    assert got["host_GiB_between_steps"] == pytest.approx(r.host.between_steps_bytes / 2**30)
    assert got["device_GiB"] == pytest.approx(s.device_peak_bytes / 2**30)
    errs = dict(zip(res.table.quantity, res.table.error))
    assert errs["tokens_per_s"] == pytest.approx(s.tokens_per_s / 1000 - 1)
    # a longer predicted step is a slower prediction: negative, like a lower tokens/s
    assert errs["step_s"] == pytest.approx(5.0 / s.step_time_s - 1)


def test_host_between_steps_holds_the_store_not_the_steps_gradients_or_checkpoints():
    """What a trainer's RSS holds after zero_grad(set_to_none=True) (MegaTrain's sample): with a bf16
    master and fp32 moments the store is 10 bytes a parameter; the `after` mode's gradients and the
    host checkpoints live only within the step. A pipelined optimizer's gradients cross the step
    boundary, so they stay."""
    model, hw = load_model("qwen2.5-0.5b"), make_hardware("a100-80gb", "256GiB")
    n = model.total_params
    after = plan(model, hw, Policy.from_choices(batch=4, seq=1024, master="bf16", optimizer="after",
                                                act_ckpt_every=2)).host
    assert after.by_role["grads"] >= 2 * n and after.by_role["act_checkpoints"] > 0
    kept = after.by_role["staging"] + after.by_role["scalars"] + after.by_role["runtime"]
    assert after.between_steps_bytes == 10 * n + kept
    piped = plan(model, hw, Policy.from_choices(batch=4, seq=1024, master="bf16", optimizer="pipelined")).host
    assert piped.between_steps_bytes == piped.total_bytes - piped.by_role["act_checkpoints"]
    assert piped.between_steps_bytes - after.between_steps_bytes >= 2 * n  # the kept gradients


def test_peer_rows_use_the_zero3_offload_peer(tmp_path):
    f = _file(tmp_path, {"system": "zero3-offload", "plan": SMALL + " --peer-knobs act_ckpt=off"})
    res = run_suite(load_rows(f))
    pol = Policy(batch=4, seq=1024)
    peer = plan_zero3(load_model("qwen2.5-0.5b"), make_hardware("a100-80gb", "256GiB"), zero3_like(pol, act_ckpt=False))
    ours = plan(load_model("qwen2.5-0.5b"), make_hardware("a100-80gb", "256GiB"), pol)
    assert res.table.predicted[0] == pytest.approx(peer.summary.tokens_per_s)
    assert peer.summary.tokens_per_s != pytest.approx(ours.summary.tokens_per_s)


def test_model_table_and_fit_verdicts(tmp_path):
    """A model given by its shape; a fit verdict that is wrong is counted as wrong."""
    shape = '\n[row.model]\nn_layers = 4\nhidden = 512\nn_heads = 8\nn_kv_heads = 8\nffn_hidden = 2048\nvocab = 1000\n'
    p = tmp_path / "rows.toml"
    p.write_text(ROW.format(id="fits", source="S", system="horizon", plan="--gpu a100-80gb --ram 64GiB",
                            quantity="fits", value="false") + shape)
    res = run_suite(load_rows(p))
    row = res.table.iloc[0]
    assert row.status == "ok" and row.predicted == 1.0 and row.error == 1.0  # it fits; the row says not
    assert res.medians()["fit"]["wrong"] == 1


def test_rows_the_planner_refuses_or_cannot_model_are_listed(tmp_path):
    f = _file(tmp_path, {"plan": "--model qwen2.5-0.5b --gpu a100-80gb --ram 64GiB --seq 0"},
              extra=ROW.format(id="moe", source="T", system="horizon", plan=SMALL, quantity="tokens_per_s",
                               value=5) + 'unreachable = "a mixture of experts"\n')
    res = run_suite(load_rows(f))
    st = dict(zip(res.table.id, res.table.status))
    assert st["r0"].startswith("the planner refused the setup:") and "seq=0" in st["r0"]
    assert st["moe"] == "not modelled: a mixture of experts"
    assert "not compared:" in res.text() and "a mixture of experts" in res.text()
    assert math.isnan(res.table.error[0])


@pytest.mark.parametrize("bad,msg", [
    ({"quantity": "tflops"}, "quantity 'tflops'; allowed: tokens_per_s"),
    ({"system": "megatron"}, "system 'megatron'; allowed: horizon, zero3-offload, zero2-offload"),
    ({"value": -3}, "value -3 must be a positive number"),
    ({"value": '"fast"'}, "value 'fast' must be a positive number"),
])
def test_bad_rows_are_one_line_errors_naming_the_row(tmp_path, bad, msg):
    with pytest.raises(HorizonError, match="r0: " + msg.replace("(", r"\(").replace(")", r"\)")):
        load_rows(_file(tmp_path, bad))


def test_bad_files(tmp_path):
    with pytest.raises(HorizonError, match="row id 'r0' appears twice"):
        load_rows(_file(tmp_path, {}, {"id": "r0"}))
    p = tmp_path / "x.toml"
    p.write_text('[[row]]\nid = "a"\nspeed = 3\n')
    with pytest.raises(HorizonError, match="a: unknown field"):
        load_rows(p)
    p.write_text('[[row]]\nid = "a"\n')
    with pytest.raises(HorizonError, match="a: missing source, cite"):
        load_rows(p)
    p.write_text(ROW.format(id="m", source="S", system="horizon", plan="--gpu h200", quantity="tokens_per_s",
                            value=1) + "[row.model]\nlayers = 4\n")
    with pytest.raises(HorizonError, match="m: model field\\(s\\) layers unknown"):
        load_rows(p)
    p.write_text("[[row]\n")
    with pytest.raises(HorizonError, match="not valid TOML"):
        load_rows(p)
    with pytest.raises(HorizonError, match="cannot read"):
        load_rows(tmp_path / "none.toml")


def test_error_signs():
    q = QUANTITIES
    assert error(q["tokens_per_s"], 110, 100) == pytest.approx(0.10)
    assert error(q["step_s"], 2.0, 1.0) == pytest.approx(-0.5)  # twice as long: half the speed
    assert error(q["fits"], 1.0, 1.0) == 0 and error(q["fits"], 0.0, 1.0) == 1


def test_cli(tmp_path, capsys):
    f = _file(tmp_path, {}, {"quantity": "host_GB", "value": 30})
    out = tmp_path / "out"
    assert main(["validate", "--published", str(f), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "published measurements: 2 rows from 1 sources; 2 compared" in text
    assert "throughput: median |error|" in text and "host RAM: median |error|" in text
    assert {p.name for p in out.iterdir()} == {"published.csv", "published.md", "published.png"}
    assert main(["validate", "--published", "--hardware", "m.toml", "--out", str(out)]) == 2
    assert "--hardware does not apply to --published" in capsys.readouterr().err
    assert main(["validate", "--published", str(tmp_path / "none.toml"), "--out", str(out)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_marks_for_assumptions_and_setups_that_do_not_fit(tmp_path):
    """An assumed setup part is marked *, and a speed predicted for a setup the planner says does
    not fit is marked ! (still shown: the row is not dropped)."""
    f = _file(tmp_path, {"plan": "--model qwen2.5-72b --gpu a100-40gb --ram 64GiB --batch 4 --seq 1024"},
              extra=ROW.format(id="guess", source="S", system="horizon", plan=SMALL, quantity="tokens_per_s",
                               value=5) + 'assumed = "batch 4 (not stated)"\n')
    res = run_suite(load_rows(f))
    t = res.table.set_index("id")
    assert not t.planned_fits["r0"] and t.planned_fits["guess"]
    lines = {ln.split()[0]: ln for ln in res.text().splitlines() if ln.startswith(("r0", "guess"))}
    assert lines["r0"].endswith(" !") and "guess*" in lines
    assert not lines["guess*"].endswith("!")


def test_published_runs_without_torch(tmp_path):
    """The planner alone: `horizon validate --published` never imports torch."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    code = ("import json, sys\nfrom horizon_sim.cli.main import main\n"
            f"rc = main(['validate', '--published', '--out', {str(tmp_path)!r}, '--no-plots', '--json'])\n"
            "print(json.dumps({'rc': rc, 'torch': sorted(m for m in sys.modules if m.split('.')[0] == 'torch')}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, timeout=120)
    lines = out.stdout.strip().splitlines()
    res = json.loads(lines[-1])
    assert res == {"rc": 0, "torch": []}, out.stderr[-2000:]
    # strict JSON (no NaN): rows not compared have null predictions
    printed = json.loads(lines[-2], parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert any(r["predicted"] is None for r in printed["rows"]) and printed["figures"]["rows"] >= 15


def test_held_out_rows_are_reported_apart(tmp_path):
    """Issue 44 item 4: rows entered to test the planner and never used to build it have their
    own medians; the others' medians leave them out."""
    f = _file(tmp_path, {"value": 1000}, {"value": 2000},
              extra=ROW.format(id="h0", source="T", system="horizon", plan=SMALL, quantity="tokens_per_s",
                               value=500) + 'held_out = true\nentered = "+10% at abc1234"\n')
    res = run_suite(load_rows(f))
    assert list(res.table.held_out) == [False, False, True] and res.table.entered[2] == "+10% at abc1234"
    built, held = res.medians()["throughput"], res.medians(held_out=True)["throughput"]
    assert (built["rows"], held["rows"]) == (2, 1)
    pred = res.table.predicted[0]
    assert held["median_abs_err"] == pytest.approx(abs(pred / 500 - 1))
    assert built["median_abs_err"] == pytest.approx(statistics.median([abs(pred / 1000 - 1), abs(pred / 2000 - 1)]))
    whole = res.medians(held_out=None)["throughput"]  # the issue's "whole suite" figure: every row
    assert whole["rows"] == 3 and whole["median_abs_err"] == pytest.approx(
        statistics.median([abs(pred / v - 1) for v in (1000, 2000, 500)]))
    text = res.text()
    assert "held out (1 rows entered to test the planner" in text and "h0^" in text
    assert f"the whole suite (built and held-out rows together):\n    throughput: median |error| " \
           f"{whole['median_abs_err']:.1%} over 3 rows" in text
    with pytest.raises(HorizonError, match="r0: held_out 'yes' must be true or false"):
        load_rows(_file(tmp_path, {}, extra='held_out = "yes"\n'))


def test_device_rows_say_which_figure_and_are_read_alike(tmp_path):
    """Issue 44: a device-memory row names the figure its source reports; 'allocated' reads the
    planner's device peak, 'nvidia-smi' adds the device's reserve (context and allocator slack:
    what the fit verdict counts besides the peak), and a figure the planner does not model is
    listed with the reason instead of compared."""
    q = {"quantity": "device_GiB", "value": 5}
    f = _file(tmp_path, {**q}, {**q}, {**q}, {**q})
    text = f.read_text().split("[[row]]")
    figures = ["allocated", "nvidia-smi", "reserved", "unknown"]
    f.write_text("[[row]]".join([text[0]] + [t.rstrip("\n") + f'\nmemory_figure = "{g}"\n'
                                              for t, g in zip(text[1:], figures)]))
    res = run_suite(load_rows(f))
    t = res.table.set_index("id")
    hw = make_hardware("a100-80gb", "256GiB")
    assert t.predicted["r1"] - t.predicted["r0"] == pytest.approx(hw.device.reserved_GiB)
    assert t.status["r0"] == t.status["r1"] == "ok"
    assert t.status["r2"].startswith("not modelled: the 'reserved' device figure")
    assert t.status["r3"].startswith("not modelled: the 'unknown' device figure")
    assert "device_GiB (nvidia-smi)" in res.text()
    with pytest.raises(HorizonError, match="r0: a device-memory row says which figure .* allowed: allocated"):
        load_rows(_file(tmp_path, {**q}))
    with pytest.raises(HorizonError, match="r0: memory_figure is for device-memory rows"):
        load_rows(_file(tmp_path, {}, extra='memory_figure = "allocated"\n'))
