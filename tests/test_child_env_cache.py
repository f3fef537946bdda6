"""Issue 43: a measurement child (measure/child.py; the DeepSpeed peer among them) inherited an
empty or relative XDG_CACHE_HOME, and torch's cache folder (where DeepSpeed's JIT ops are built
and loaded from, torch_extensions) became relative to the child's current folder. The XDG spec
says such a value is ignored: the child does not see it, so torch uses ~/.cache."""
import json
import os
import subprocess
import sys

import pytest

from horizon_exec.measure.child import ROOT, child_env


@pytest.mark.parametrize("xdg", ["", "relative/cache"])
def test_an_empty_or_relative_xdg_cache_home_is_not_passed_on(monkeypatch, tmp_path, xdg):
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    monkeypatch.setenv("HOME", str(tmp_path))
    code = "import json, torch._appdirs as a; print(json.dumps(a.user_cache_dir(appname='torch_extensions')))"
    r = subprocess.run([sys.executable, "-c", code], env=child_env(), cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == str(tmp_path / ".cache" / "torch_extensions")


def test_an_absolute_xdg_cache_home_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert child_env()["XDG_CACHE_HOME"] == str(tmp_path)
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert "XDG_CACHE_HOME" not in child_env() and os.environ.get("XDG_CACHE_HOME") is None
