"""DeepSpeed's JIT-built CPU ops are kept per Python environment (peer_deepspeed.extensions_dir):
torch's default folder is shared by every checkout of the user while its build files name one
environment's paths, so two checkouts rebuilt the op (minutes) each time the other had used it.
The child that runs DeepSpeed, and make setup's prebuild, use the same folder."""
import os
import sys

from horizon_exec.measure import peer_deepspeed as P


def test_the_folder_is_the_environments_unless_the_user_names_one(monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert P.extensions_dir() == os.path.join(sys.prefix, "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/somewhere/else")
    assert P.extensions_dir() == "/somewhere/else"


def test_the_deepspeed_child_builds_into_it(monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    seen = {}

    def child(module, req, *, what, env, timeout_s):
        seen.update(env)
        return {"adam": {"Gparams_per_s": 1.0}}
    monkeypatch.setattr(P, "deepspeed_available", lambda: "0.19.8")
    monkeypatch.setattr(P, "run_json_child", child)
    assert P.deepspeed_adam_Gparams_per_s() == 1.0
    assert seen["TORCH_EXTENSIONS_DIR"] == os.path.join(sys.prefix, "torch_extensions")
    assert seen["DS_ACCELERATOR"] == "cpu"


def test_make_setup_prebuilds_through_the_same_function():
    makefile = open(os.path.join(os.path.dirname(__file__), "..", "Makefile")).read()
    assert "from horizon_exec.measure.peer_deepspeed import prebuild; prebuild()" in makefile
