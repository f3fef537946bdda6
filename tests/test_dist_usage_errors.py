"""Issue 43, item 7b: the usage errors of a data-parallel run (a missing --data, a tokenizer
larger than the model's vocab, --disk-tier with several processes, --resume with no checkpoint)
are found by `horizon train` itself before any rank starts (cli/run_inputs.py): one line, exit 2,
no torch launcher banner. They were found inside each rank: the banner, then the error once per
rank. In-process (a rank start fails the test), and once as a real command."""
import subprocess
import sys

import pytest

from horizon_exec.dist import launch
from horizon_sim.cli.main import main
from tests.train_run import MICRO, ROOT, env

BASE = ["train", "--model", str(MICRO), "--batch", "2", "--seq", "32", "--no-progress", "--eval-batches", "0",
        "--steps", "1", "--compute-dtype", "fp32", "--no-working-copy", "--nproc-per-node", "2", "--no-admission"]


@pytest.fixture(autouse=True)
def no_ranks(monkeypatch):
    """Any rank start fails the test; the launcher's environment changes are undone after it."""
    import torch.distributed.run as tdr

    def started(*a, **kw):
        raise AssertionError("a rank was started")
    monkeypatch.setattr(tdr, "run", started)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    for k in ("TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_DISTRIBUTED_DEBUG"):
        monkeypatch.setenv(k, "x")
        monkeypatch.delenv(k)
    monkeypatch.setenv(launch.ARGS_ENV, "")
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def _refused(capsys, *args) -> str:
    assert main(BASE + list(args)) == 2
    err = capsys.readouterr().err
    assert err.startswith("horizon train: error: ") and err.count("\n") == 1, err
    return err


def test_missing_data(capsys, tmp_path):
    err = _refused(capsys, "--data", str(tmp_path / "nope.txt"))
    assert f"data file {str(tmp_path / 'nope.txt')!r} not found" in err


def test_a_tokenizer_larger_than_the_vocab(capsys, tmp_path):
    from tests.hf_tokenizers import VOCAB, tokenizer_folder
    tokenizer_folder(tmp_path / "tok")
    err = _refused(capsys, "--tokenizer", str(tmp_path / "tok"))
    assert f"has {VOCAB} ids; the model's vocab is 256" in err


def test_the_disk_tier_with_several_processes(capsys):
    err = _refused(capsys, "--disk-tier", "moments")
    assert "--disk-tier moments runs in one process for now, not --nproc-per-node 2 x --nnodes 1" in err


@pytest.mark.parametrize("nnodes", [1, 2])
def test_resume_without_a_checkpoint(capsys, tmp_path, nnodes):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "node-1" / "step-00000001").mkdir(parents=True)  # another node's: not this node's to resume
    nodes = ["--nnodes", "2", "--nproc-per-node", "1"] if nnodes == 2 else []
    err = _refused(capsys, "--ckpt-dir", str(ck), "--resume", *nodes)
    where = ck / "node-0" if nnodes == 2 else ck
    assert f"--resume: no checkpoint in {str(where)!r}" in err


def test_the_command_says_it_once_without_the_launcher_banner(tmp_path):
    """The real command (its ranks would be real): one line on stderr, nothing from torch."""
    r = subprocess.run([sys.executable, "-m", "horizon_sim.cli.main", *BASE, "--data", str(tmp_path / "nope.txt")],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr == f"horizon train: error: data file {str(tmp_path / 'nope.txt')!r} not found\n"
    assert "*****" not in r.stdout and "OMP_NUM_THREADS" not in r.stdout + r.stderr
