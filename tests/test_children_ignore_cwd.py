"""Issue 43: a child started with `python -m` has the current folder first on sys.path, so a
horizon_exec/ (or torch/) package lying where the user stands ran as the user instead of
Horizon's own. measure_ranks (benchmarks/scaling.py) started its ranks that way; they now run
with PYTHONSAFEPATH (python -P), which torch.distributed.run's workers inherit too. (The native
kernel's self-test child: tests/test_native_cache_private.py.)"""
import pytest

from tests import dist_worker


def test_measure_ranks_does_not_import_from_the_current_folder(tmp_path, monkeypatch):
    from horizon_exec.measure.ranks import measure_ranks
    marker = tmp_path / "planted-package-ran"
    (tmp_path / "cwd" / "horizon_exec").mkdir(parents=True)
    (tmp_path / "cwd" / "horizon_exec" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path / "cwd")
    try:
        res = measure_ranks(dist_worker.spec(False), dist_worker.policy(1, "pipelined"), 1, steps=1, warmup=0)
    except RuntimeError as e:
        pytest.fail(f"{e}".splitlines()[0])
    assert not marker.exists(), "a package in the current folder ran in the measured rank"
    assert len(res["step_s"]) == 1
