"""Issue 19, item 3: two trainers on one --ckpt-dir. The second is refused, naming who holds the
folder (pid, host, start time); a lock dies with its holder (kill -9 included); a save removes
only hidden temporaries it can prove dead (its own, or of a dead process of this host), never
another run's folder in flight."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.checkpoints import ckpt_lock
from horizon_exec.checkpoints.fileio import owner_tag
from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.train_run import ROOT, env, popen, train

SPEC = ModelSpec(n_layers=2, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=256)
POL = Policy(batch=1, seq=16)

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def test_a_second_trainer_on_the_folder_is_refused_and_the_first_goes_on(tmp_path):
    first = popen("--steps", "100000", "--ckpt-dir", tmp_path, "--ckpt-interval", "1")
    try:
        while not (tmp_path / "latest").exists():   # the first run is training and checkpointing
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        second = train("--steps", "2", "--ckpt-dir", tmp_path, timeout=120)
        assert first.poll() is None  # not disturbed
        first.send_signal(signal.SIGTERM)
        err = first.communicate(timeout=120)[1]
    finally:
        first.kill()
    assert second.returncode == 2 and "final loss" not in second.stdout
    line = second.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert f"checkpoint folder '{tmp_path}' is in use by another run (pid {first.pid} on host " \
           f"{socket.gethostname()}, since " in line and f"lock {tmp_path / '.lock'}" in line, line
    assert first.returncode == 143, err
    for p in ckpt_mod.list_checkpoints(tmp_path):
        ckpt_mod.verify_checkpoint(p)


def test_the_lock_dies_with_its_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from horizon_exec.checkpoints import ckpt_lock; "
                               "ckpt_lock.acquire(sys.argv[1]); print('held', flush=True); time.sleep(600)",
                               str(tmp_path)], cwd=ROOT, env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(ckpt_lock.CkptDirBusy, match=f"pid {holder.pid} on host"):
            ckpt_lock.acquire(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    with ckpt_lock.holding(tmp_path), ckpt_lock.holding(tmp_path):   # free now; re-entrant in a process
        assert f"pid {os.getpid()} on host" in (tmp_path / ".lock").read_text()


def test_a_save_removes_only_dead_leftovers(tmp_path):
    live = subprocess.Popen(["sleep", "600"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = owner_tag().rpartition("-")[0]
    names = {"live": f".step-00000003.{host}-{live.pid}.x1y2z3.tmp",       # another run, writing now
             "other host": f".step-00000003.elsewhere-{dead.pid}.x1y2z3.tmp",
             "dead": f".step-00000002.{host}-{dead.pid}.x1y2z3.tmp",       # killed mid-write
             "dead aside": f".step-00000001.{host}-{dead.pid}.old",
             "dead pointer": f".latest.{host}-{dead.pid}.abc.tmp"}
    try:
        for name in names.values():
            (tmp_path / name).mkdir() if not name.startswith(".latest") else (tmp_path / name).write_text("x")
        with Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
            tr.step(torch.randint(0, SPEC.vocab, (1, 16)))
            ckpt_mod.save_checkpoint(tmp_path, tr, 1)
        left = sorted(n for n in os.listdir(tmp_path) if n.startswith("."))
        assert left == sorted([".lock", names["live"], names["other host"]])
    finally:
        live.kill()
        live.wait()
