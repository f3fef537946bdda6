"""The planner never imports torch (it must start fast and install light): import every
module of horizon_sim and simulate a step in a fresh interpreter, then look at sys.modules."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    import horizon_sim

    failed = []
    def onerror(name):
        failed.append(name)

    names = []
    for info in pkgutil.walk_packages(horizon_sim.__path__, "horizon_sim.", onerror=onerror):
        names.append(info.name)
        importlib.import_module(info.name)  # an import error fails the test loudly

    from horizon_sim.schedule import build_schedule
    from horizon_sim.sim.simulate import simulate
    from horizon_sim.specs.hardware_presets import make_hardware
    from horizon_sim.specs.model_presets import model_preset
    from horizon_sim.specs.policy import Policy
    r = simulate(build_schedule(model_preset("qwen2.5-0.5b"), Policy(batch=2, seq=256)),
                 make_hardware("h100-sxm", "256GiB"))
    assert r.summary.step_time_s > 0

    torchy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
    print(json.dumps({"modules": names, "failed": failed, "torch": torchy}))
""")


def test_horizon_sim_never_imports_torch():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert not res["failed"], f"packages that failed to import: {res['failed']}"
    # the walk really covered the package
    for must in ("horizon_sim.schedule.builder", "horizon_sim.schedule.serialize",
                 "horizon_sim.sim.simulate", "horizon_sim.sim.dram", "horizon_sim.specs.model"):
        assert must in res["modules"]
    assert res["torch"] == [], f"horizon_sim imported {res['torch'][:5]}"


def test_the_check_would_see_torch(tmp_path):
    """Control: the same probe reports a torch that something did import (a stand-in package
    on the path, so the control costs no real torch import), so the test above can fail."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "torch" / "cuda.py").write_text("")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    out = subprocess.run([sys.executable, "-c", "import torch.cuda\n" + SCRIPT], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["torch"] == ["torch", "torch.cuda"]
