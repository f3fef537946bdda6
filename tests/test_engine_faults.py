"""Faults (issue 7): an exception in any lane reaches the caller promptly naming the op, even
while another lane is stuck inside a long op; every wait polls well under a second; SIGINT and
SIGTERM stop `horizon train` / TrainLoop at a step boundary with a checkpoint (a second signal
aborts at once), and no signal or kill ever leaves a partial checkpoint under a final name."""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.runtime import engine as engine_mod
from horizon_exec.data.data import load_dataset
from horizon_exec.errors import ExecError
from horizon_exec.train.loop import Interrupted, LoopConfig, TrainLoop
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_exec.runtime.config import OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import OpKind
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy, exact_policy

ROOT = Path(__file__).resolve().parents[1]
SPEC = ModelSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=256)


pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _tokens(pol, seed=0):
    return torch.randint(0, SPEC.vocab, (pol.batch, pol.seq), generator=torch.Generator().manual_seed(seed))


# ---- lane faults ---------------------------------------------------------------------------

def test_every_wait_polls_well_under_a_second():
    assert engine_mod.POLL_S <= 0.1
    assert engine_mod.POLL_S + engine_mod.ABORT_GRACE_S <= 0.6


class _Waitable:
    """A CUDA event or stream stand-in: query() is true from the `done_after`-th call on."""
    def __init__(self, done_after):
        self.done_after, self.calls = done_after, 0

    def query(self):
        self.calls += 1
        return self.done_after is not None and self.calls >= self.done_after


def test_device_waits_are_bounded_and_name_what_hung():
    # the CUDA backend's host-side syncs poll through wait_bounded (no GPU here: fake waitables)
    from horizon_exec.device.backend import wait_bounded
    w = _Waitable(done_after=5)
    wait_bounded(w, timeout_s=5.0, what="x")
    assert w.calls == 5  # it polled until done, and stopped there
    never = _Waitable(done_after=None)
    with pytest.raises(ExecError, match=r"the end of the step: the compute stream was not done after 0.2s"):
        wait_bounded(never, timeout_s=0.2, what="the end of the step: the compute stream")
    assert never.calls >= 1  # it polled the stuck waitable, then gave up instead of waiting on


def test_engine_gives_its_timeout_to_the_backend():
    tr = Trainer(SPEC, Policy(batch=1, seq=16), TrainerConfig(runtime=RuntimeConfig(timeout_s=7.5)))
    try:
        assert tr.engine.backend.timeout_s == 7.5
    finally:
        tr.close()


def _matches(op, kind, layer, prev):
    return op.kind == kind and op.unit == layer and op.micro == 0 and op.prev_step == prev


# (failing op, op blocked on another lane when it fails): each pair can run at the same time in
# a pipelined step (the previous step's optimizer ops overlap the forward pass).
CASES = {
    "cpu-optimizer": ((OpKind.OPTIMIZER, 3, True), (OpKind.FORWARD, 0, False)),
    "h2d-copy": ((OpKind.LOAD_WEIGHTS, 1, False), (OpKind.FORWARD, 0, False)),
    "compute": ((OpKind.FORWARD, 0, False), (OpKind.OPTIMIZER, 3, True)),
    "d2h-copy": ((OpKind.SAVE_CKPT, 0, False), (OpKind.OPTIMIZER, 3, True)),
}


@pytest.mark.parametrize("case", CASES)
def test_a_lane_fault_reaches_the_caller_while_another_lane_is_stuck(case):
    (fk, fl, fprev), (bk, bl, bprev) = CASES[case]
    pol = Policy(batch=2, seq=16, optimizer="pipelined", act_ckpt_on="host")
    tr = Trainer(SPEC, pol)
    try:
        tr.step(_tokens(pol))  # so that the next step has the previous step's optimizer ops
        blocked, release = threading.Event(), threading.Event()

        def hook(op):
            if _matches(op, bk, bl, bprev):
                blocked.set()
                release.wait(30)           # a long op: the caller must not wait for it
            elif _matches(op, fk, fl, fprev):
                blocked.wait(10)
                raise RuntimeError("injected fault")

        tr.engine.hook = hook
        failing = next(o for o in tr.sched.ops if _matches(o, fk, fl, fprev))
        with pytest.raises(ExecError) as e:
            tr.step(_tokens(pol, 1))
        still_blocked = blocked.is_set() and not release.is_set()
        release.set()
        msg = str(e.value)
        assert f"op {failing.id} {failing.label} on lane {failing.lane.value} failed: RuntimeError: injected fault" in msg
        assert e.value.op == failing
        assert still_blocked  # the error reached the caller while the other lane's op was still stuck
        assert "engine is unusable" in msg
        with pytest.raises(ExecError, match="failed earlier"):
            tr.step(_tokens(pol))
    finally:
        tr.close()


# ---- signals in the loop (in process) --------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset():
    return load_dataset(None, ByteTokenizer(), seq=16, eval_fraction=0.01)


def _loop(ds, ckpt_dir, steps=50, save_every=2):
    pol = exact_policy(batch=2, seq=16, optimizer="pipelined")
    tr = Trainer(SPEC, pol, TrainerConfig(optimizer=OptimizerConfig(lr=1e-3)))
    cfg = LoopConfig(steps=steps, lr_schedule=CosineSchedule(peak=1e-3, total_steps=steps), eval_batches=0,
                     ckpt_dir=str(ckpt_dir), save_every=save_every, keep_ckpts=0, progress=False)
    return tr, TrainLoop(tr, ds, cfg, out=lambda *_: None)


def _kill_at(tr, step_of, at_step: int, times: int = 1, kind=OpKind.BACKWARD):
    """Send SIGTERM to this process `times` times from a lane thread during step `at_step`."""
    sent = []

    def hook(op):
        if step_of() == at_step and op.kind == kind and not sent:
            sent.append(op)
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)   # let the main thread run the handler between the two
    tr.engine.hook = hook
    return sent


def _no_partial(ckpt_dir: Path):
    names = sorted(n for n in os.listdir(ckpt_dir) if n not in (".lock", "report"))  # the lock stays; report: the plan check's (a calibrated machine)
    assert all(n == "latest" or re.fullmatch(r"step-\d{8}", n) for n in names), names
    for p in ckpt_mod.list_checkpoints(ckpt_dir):
        ckpt_mod.verify_checkpoint(p)
    return names


def test_first_signal_finishes_the_step_and_checkpoints(tmp_path, dataset):
    tr, loop = _loop(dataset, tmp_path, save_every=4)
    with tr:
        _kill_at(tr, lambda: loop.step, at_step=5)   # during the 6th step
        old = signal.getsignal(signal.SIGTERM)
        with pytest.raises(Interrupted) as e:
            loop.run()
        assert signal.getsignal(signal.SIGTERM) is old  # handlers restored
    it = e.value
    assert not it.immediate and it.signum == signal.SIGTERM and it.exit_code == 143 and it.step == 6
    assert str(it) == f"SIGTERM: stopped after step 6; last checkpoint {tmp_path / 'step-00000006'}"
    assert _no_partial(tmp_path) == ["latest", "step-00000004", "step-00000006"]
    assert ckpt_mod.latest_checkpoint(tmp_path).name == "step-00000006"
    tr2, loop2 = _loop(dataset, tmp_path)
    with tr2:
        loop2.resume(tmp_path)
        assert loop2.step == 6


def test_second_signal_aborts_mid_step_and_keeps_the_last_checkpoint(tmp_path, dataset):
    tr, loop = _loop(dataset, tmp_path, save_every=2)
    with tr:
        _kill_at(tr, lambda: loop.step, at_step=4, times=2)
        with pytest.raises(Interrupted) as e:
            loop.run()
        assert tr.failed and "interrupted mid-step" in tr.failed
    assert e.value.immediate and str(e.value).startswith("SIGTERM: aborted during step 5; last checkpoint")
    assert _no_partial(tmp_path) == ["latest", "step-00000002", "step-00000004"]


def test_second_signal_during_the_checkpoint_write_leaves_no_partial_one(tmp_path, dataset, monkeypatch):
    tr, loop = _loop(dataset, tmp_path, save_every=2)
    real = ckpt_mod.write_safetensors

    def slow_write(path, items, metadata=None):
        if loop.step == 3:  # the stop checkpoint after step 3: a second signal arrives mid-write
            real(path, items[:2], metadata)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        return real(path, items, metadata)

    monkeypatch.setattr(ckpt_mod, "write_safetensors", slow_write)
    with tr:
        _kill_at(tr, lambda: loop.step, at_step=2)
        with pytest.raises(Interrupted) as e:
            loop.run()
    assert e.value.immediate
    assert _no_partial(tmp_path) == ["latest", "step-00000002"]
    assert ckpt_mod.latest_checkpoint(tmp_path).name == "step-00000002"


# ---- signals and kills of `horizon train` (a subprocess) ------------------------------------------------

_STARTED: list = []


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test():
    """A `horizon train --steps 100000` left running by a failed test (one that ignored its
    signal) ate a core for the rest of the suite: each is killed when its test ends."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _train(ckpt_dir: Path, *extra) -> subprocess.Popen:
    # fp32: signals and checkpoint writes are the point, not the dtype (the tests wait for
    # checkpoints, and a bf16 step is slower on CPUs without bf16 instructions)
    cmd = [sys.executable, "-m", "horizon_sim.cli.main", "train", "--model", "tiny", "--steps", "100000",
           "--batch", "2", "--seq", "32", "--eval-batches", "0", "--no-progress", "--ckpt-dir", str(ckpt_dir),
           "--keep-ckpts", "2", "--compute-dtype", "fp32", "--no-working-copy", *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    _STARTED.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True))
    return _STARTED[-1]


def _wait_for_checkpoint(proc, ckpt_dir: Path, n: int = 1, timeout: float = 120):
    t0 = time.monotonic()
    while len(ckpt_mod.list_checkpoints(ckpt_dir)) < n:
        if proc.poll() is not None:
            raise AssertionError(f"horizon train exited early: {proc.communicate()}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise AssertionError("no checkpoint appeared")
        time.sleep(0.05)


def _load_latest(ckpt_dir: Path) -> dict:
    meta = ckpt_mod.read_meta(ckpt_mod.latest_checkpoint(ckpt_dir), verify=True)
    with Trainer(ModelSpec(**meta["model"]), Policy(**meta["policy"]), TrainerConfig(random_init=False)) as tr:
        return ckpt_mod.load_checkpoint(ckpt_dir, tr, warn=pytest.fail)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_horizon_train_stops_cleanly_on_a_signal(tmp_path, sig):
    proc = _train(tmp_path, "--ckpt-interval", "3")
    _wait_for_checkpoint(proc, tmp_path)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, (out, err)
    m = re.search(rf"horizon train: {signal.Signals(sig).name}: stopped after step (\d+); last checkpoint "
                  r"(\S+); resume with --resume", err)
    assert m, err
    step = int(m.group(1))
    assert Path(m.group(2)) == tmp_path / ckpt_mod.step_dir_name(step)
    assert f"{signal.Signals(sig).name} received: stopping at the next step boundary" in err
    _no_partial(tmp_path)
    assert ckpt_mod.latest_checkpoint(tmp_path).name == ckpt_mod.step_dir_name(step)
    assert _load_latest(tmp_path)["step"] == step


def test_horizon_train_killed_mid_checkpoint_leaves_only_complete_ones(tmp_path):
    """SIGKILL cannot be handled: atomic publication alone must keep every checkpoint whole."""
    proc = _train(tmp_path, "--ckpt-interval", "1")
    _wait_for_checkpoint(proc, tmp_path, n=2)
    time.sleep(0.37)  # somewhere in a step or a checkpoint write
    proc.kill()
    proc.communicate(timeout=60)
    names = [n for n in os.listdir(tmp_path) if not n.startswith(".")]  # hidden temporaries are allowed
    assert all(n == "latest" or re.fullmatch(r"step-\d{8}", n) for n in names), names
    for p in ckpt_mod.list_checkpoints(tmp_path):
        ckpt_mod.verify_checkpoint(p)
    assert _load_latest(tmp_path)["step"] >= 2
