"""Issue 43: the local Hugging Face cache is looked up where huggingface_hub puts it. With
XDG_CACHE_HOME set, `hf download` writes under $XDG_CACHE_HOME/huggingface/hub, and Horizon
looked in ~/.cache only: "not in the local Hugging Face cache". $VARS in HF_HOME/HF_HUB_CACHE
are expanded as huggingface_hub expands them. An empty or relative XDG_CACHE_HOME is ignored
(the XDG spec), never a lookup under the current folder."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from horizon_sim.specs.hf_cache import hub_cache_dir, resolve_model_dir

ROOT = Path(__file__).resolve().parents[1]
VARS = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.fixture
def env(tmp_path, monkeypatch):
    for v in VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _model(hub):
    snap = hub / "models--org--m" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (hub / "models--org--m" / "refs").mkdir()
    (hub / "models--org--m" / "refs" / "main").write_text("abc123")
    return snap


def test_a_model_under_xdg_cache_home_is_found(env, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(env / "xdg"))
    snap = _model(env / "xdg" / "huggingface" / "hub")
    assert resolve_model_dir("org/m") == snap


@pytest.mark.parametrize("xdg", ["", "relative"])
def test_an_empty_or_relative_xdg_cache_home_is_ignored(env, monkeypatch, xdg):
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert hub_cache_dir() == env / "home" / ".cache" / "huggingface" / "hub"


@pytest.mark.parametrize("setting", [
    {"XDG_CACHE_HOME": "{tmp}/xdg"},
    {"HF_HOME": "$HORIZON_T_ROOT/hf", "HORIZON_T_ROOT": "{tmp}"},
    {"HF_HUB_CACHE": "~/hub"},
    {"HF_HOME": "{tmp}/hf", "XDG_CACHE_HOME": "{tmp}/xdg"},
])
def test_the_same_folder_as_huggingface_hub(env, setting):
    """huggingface_hub's own answer (huggingface_hub.constants.HF_HUB_CACHE) is the oracle."""
    pytest.importorskip("huggingface_hub")
    e = {k: v for k, v in os.environ.items() if k not in VARS}
    e.update({k: v.format(tmp=env) for k, v in setting.items()}, PYTHONPATH=str(ROOT))
    code = ("import json, huggingface_hub.constants as c; from horizon_sim.specs.hf_cache import hub_cache_dir; "
            "print(json.dumps([c.HF_HUB_CACHE, str(hub_cache_dir())]))")
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    theirs, ours = json.loads(r.stdout.strip().splitlines()[-1])
    assert ours == theirs
