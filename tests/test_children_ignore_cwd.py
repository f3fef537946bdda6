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


def test_data_parallel_ranks_do_not_import_from_the_current_folder(tmp_path):
    """torch.distributed.run starts each rank as `python -m horizon_exec.cli.train_cmd` in the
    user's folder; the launcher hands its ranks PYTHONSAFEPATH and its own checkout first. The
    launcher itself runs with -P here, as the installed `horizon` script does (its sys.path[0] is
    the script's folder, not the current one)."""
    import subprocess
    import sys

    from tests.train_run import MICRO, ROOT, env
    marker = tmp_path / "planted-package-ran"
    (tmp_path / "cwd" / "horizon_exec").mkdir(parents=True)
    (tmp_path / "cwd" / "horizon_exec" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n")
    r = subprocess.run([sys.executable, "-P", "-m", "horizon_sim.cli.main", "train", "--model", str(MICRO),
                        "--batch", "2", "--seq", "32", "--no-progress", "--eval-batches", "0", "--steps", "1",
                        "--compute-dtype", "fp32", "--no-working-copy", "--nproc-per-node", "2", "--no-admission",
                        "--oversubscribe"], cwd=tmp_path / "cwd", env=env(), capture_output=True, text=True,
                       timeout=300)
    assert not marker.exists(), "a package in the current folder ran in a data-parallel rank"
    assert r.returncode == 0, r.stderr[-2000:]
    assert ROOT.name  # the ranks imported this checkout
