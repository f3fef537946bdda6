"""`horizon simulate`: the report of `horizon plan` plus an overlap plot and a Perfetto trace."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from horizon_sim.cli import main, simulate_cmd
from horizon_sim.errors import HorizonError

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BASE = ["--model", "tiny", "--gpu", "h100-pcie", "--ram", "64GiB"]


def _run(argv, capsys):
    p = argparse.ArgumentParser()
    simulate_cmd.configure(p)
    rc = simulate_cmd.run(p.parse_args(argv))
    return rc, capsys.readouterr().out


def test_writes_plot_and_trace(tmp_path, capsys):
    png, js = tmp_path / "step.png", tmp_path / "step.json"
    rc, out = _run(BASE + ["--plot", str(png), "--trace", str(js)], capsys)
    assert rc == 0
    assert png.read_bytes().startswith(PNG_MAGIC)
    events = json.loads(js.read_text())["traceEvents"]
    assert any(e["ph"] == "X" for e in events) and any(e["ph"] == "C" for e in events)
    assert out.startswith("FITS: tiny")  # the `horizon plan` report ...
    assert f"wrote {png}" in out and f"wrote {js}" in out  # ... and where the files went


def test_report_only(tmp_path, capsys):
    rc, out = _run(BASE, capsys)
    assert rc == 0 and "speed" in out and "wrote" not in out
    assert list(tmp_path.iterdir()) == []


def test_json(tmp_path, capsys):
    js = tmp_path / "t.json"
    rc, out = _run(BASE + ["--trace", str(js), "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["model"] == "tiny" and d["trace"] == str(js) and "plot" not in d
    assert js.exists()


def test_policy_flags_reach_the_trace(tmp_path, capsys):
    js = tmp_path / "t.json"
    _run(BASE + ["--act-ckpt-every", "2", "--micro-batches", "2", "--trace", str(js)], capsys)
    xs = [e for e in json.loads(js.read_text())["traceEvents"] if e["ph"] == "X"]
    assert any(e["cat"] == "recompute" for e in xs)
    assert {e["args"]["micro"] for e in xs} == {0, 1}


@pytest.mark.parametrize("flag", ["--plot", "--trace"])
def test_missing_directory_is_a_horizon_error(flag, tmp_path, capsys):
    bad = tmp_path / "missing" / "out.x"
    ok = tmp_path / ("ok.json" if flag == "--plot" else "ok.png")
    other = "--trace" if flag == "--plot" else "--plot"
    with pytest.raises(HorizonError, match="does not exist"):
        _run(BASE + [flag, str(bad), other, str(ok)], capsys)
    assert not ok.exists()  # checked before anything is written


def test_output_that_is_a_directory(tmp_path, capsys):
    with pytest.raises(HorizonError, match="is a directory"):
        _run(BASE + ["--plot", str(tmp_path)], capsys)


def test_import_is_light():
    """The command imports neither matplotlib (until --plot) nor torch."""
    code = ("import sys, horizon_sim.cli.simulate_cmd, horizon_sim.report.trace; "
            "print('matplotlib' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"], out.stderr


@pytest.mark.skipif("simulate" not in main.COMMANDS, reason="`simulate` not registered in cli.main yet")
def test_horizon_simulate_subprocess(tmp_path):
    cmd = [sys.executable, "-m", "horizon_sim.cli.main", "simulate", *BASE]
    png, js = tmp_path / "a.png", tmp_path / "a.json"
    ok = subprocess.run(cmd + ["--plot", str(png), "--trace", str(js)], cwd=ROOT,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert png.stat().st_size > 0 and json.loads(js.read_text())["traceEvents"]
    bad = subprocess.run(cmd + ["--plot", str(tmp_path / "nope" / "a.png")], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "does not exist" in bad.stderr
