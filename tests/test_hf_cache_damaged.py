"""Issue 30: a damaged local Hugging Face cache: refs/main holding binary bytes
(UnicodeDecodeError before), a FIFO (a hang), a folder, or a path; a revision that leads out
of the cache. Each is one line naming the ref file (or the revision)."""
import os

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.specs.hf_cache import resolve_model_dir


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "hub" / "models--org--m"
    (root / "refs").mkdir(parents=True)
    (root / "snapshots" / "abc123").mkdir(parents=True)
    (root / "snapshots" / "abc123" / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return root


def test_a_good_ref_resolves(cache):
    (cache / "refs" / "main").write_text("abc123\n")
    assert resolve_model_dir("org/m") == cache / "snapshots" / "abc123"


@pytest.mark.parametrize("damage", ["binary", "fifo", "folder", "path", "empty"])
def test_a_damaged_ref_is_one_line_naming_it(cache, damage):
    ref = cache / "refs" / "main"
    if damage == "binary":
        ref.write_bytes(b"\xff\xfe\x00garbage")
    elif damage == "fifo":
        os.mkfifo(ref)
    elif damage == "folder":
        ref.mkdir()
    elif damage == "path":
        ref.write_text("../../../etc\n")
    else:
        ref.write_text("")
    with pytest.raises(HorizonError) as e:
        resolve_model_dir("org/m")
    msg = str(e.value)
    assert str(ref) in msg and "\n" not in msg, msg


def test_a_revision_is_never_a_path(cache):
    with pytest.raises(HorizonError, match="is not a branch, tag or commit name"):
        resolve_model_dir("org/m@../../x")
