"""The executor's disk tier (policy disk_tier='moments', runtime/disk_store.py).

- A run with the Adam moments on disk is the run with them in RAM, bit for bit (masters and
  moments), in every optimizer mode; RAM holds two units' moments, not all of them.
- The file is unlinked at once: nothing is left in --disk-dir, during the run or after.
- Checkpoints hold the moments: a disk-tier run resumes exactly, into RAM or onto disk.
- Killed with SIGKILL mid-run, `horizon train --disk-tier moments --resume` continues from the
  last checkpoint and ends where an uninterrupted run ends (the disk file is never a source
  of truth: a crash cannot leave it inconsistent with the checkpoint).
- Every method of moving the bytes (direct, buffered, mmap) reads back what it wrote,
  aligned or not.
"""
import dataclasses
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.runtime.disk_store import METHODS, DiskStore, disk_buffers
from horizon_exec.runtime.config import OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import Holds, build_schedule
from horizon_sim.schedule.op import Space
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.unit_state import moments

ROOT = Path(__file__).resolve().parents[1]
SPEC = ModelSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab=128)
POL = Policy(batch=2, seq=16, disk_tier="moments")

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _tokens(s):
    return torch.randint(0, SPEC.vocab, (2, 16), generator=torch.Generator().manual_seed(s))


def _on_disk(folder, seed: int) -> TrainerConfig:
    """lr 1e-3, the disk tier's file in `folder`."""
    return TrainerConfig(optimizer=OptimizerConfig(lr=1e-3), runtime=RuntimeConfig(disk_dir=folder), seed=seed)


@pytest.mark.parametrize("optimizer", ["pipelined", "backward", "after"])
def test_moments_on_disk_train_exactly_as_in_ram(optimizer, tmp_path):
    pol = dataclasses.replace(POL, optimizer=optimizer, grad_clip=0.0 if optimizer == "backward" else 1.0)
    runs = {}
    for tier in ("none", "moments"):
        with Trainer(SPEC, dataclasses.replace(pol, disk_tier=tier), _on_disk(tmp_path, 0)) as tr:
            losses = [tr.step(_tokens(s)).loss for s in range(3)]
            tr.flush()
            runs[tier] = (losses, {u: (tr.gather_master(u), moments(tr, u)) for u in tr.units}, tr.store.nbytes)
            if tier == "moments":
                assert os.listdir(tmp_path) == []  # unlinked at once
                assert tr.disk.nbytes >= 2 * 4 * SPEC.total_params
    assert runs["none"][0] == runs["moments"][0]
    for u, (master, mom) in runs["none"][1].items():
        assert torch.equal(master, runs["moments"][1][u][0]) and torch.equal(mom, runs["moments"][1][u][1])
    assert runs["none"][2] - runs["moments"][2] >= 2 * 4 * SPEC.total_params - 4096 * 6
    assert os.listdir(tmp_path) == []


def test_a_disk_tier_checkpoint_resumes_exactly_in_ram_or_on_disk(tmp_path):
    with Trainer(SPEC, POL, _on_disk(tmp_path, 0)) as tr:
        for s in range(2):
            tr.step(_tokens(s))
        path = ckpt_mod.save_checkpoint(tmp_path / "ckpt", tr, 2)
        want = [tr.step(_tokens(s)).loss for s in range(2, 4)]
    for tier in ("moments", "none"):
        with Trainer(SPEC, dataclasses.replace(POL, disk_tier=tier), _on_disk(tmp_path, 3)) as tr:
            if tier == "none":  # another policy: the checkpoint says so
                with pytest.raises(Exception, match="disk_tier"):
                    ckpt_mod.load_checkpoint(path, tr)
                continue
            ckpt_mod.load_checkpoint(path, tr)
            assert [tr.step(_tokens(s)).loss for s in range(2, 4)] == want


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("offset", [0, 4096 + 4, 64])
def test_every_method_reads_back_what_it_wrote(method, offset, tmp_path):
    sched = build_schedule(SPEC, POL)
    d = DiskStore(disk_buffers(sched), tmp_path, method)
    try:
        names = [n for n, b in sched.buffers.items() if b.space == Space.DISK]
        gen = torch.Generator().manual_seed(0)
        want = {}
        for n in names:
            b = sched.buffers[n]
            # page-aligned (offset 0: O_DIRECT straight into it), or not (through the bounce buffer)
            raw = torch.frombuffer(mmap.mmap(-1, b.bytes + offset), dtype=torch.uint8)
            t = raw[offset:].view(torch.float32).view(b.shape)
            t.copy_(torch.randn(b.shape, generator=gen))
            d.write(n, t)
            want[n] = t.clone()
        for n in names:
            got = torch.empty(sched.buffers[n].shape)
            d.read(n, got)
            assert torch.equal(got, want[n]), (method, n)
        d.zero(names[0])
        got = torch.empty(sched.buffers[names[0]].shape)
        d.read(names[0], got)
        assert not got.any()
    finally:
        d.close()


def test_no_room_on_the_disk_is_one_clear_error(tmp_path, monkeypatch):
    def full(fd, off, n):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(Exception, match=r"the disk tier needs .* No space left on device"):
        DiskStore(disk_buffers(build_schedule(SPEC, POL)), tmp_path)


def _train(tmp_path, *extra):
    cmd = [sys.executable, "-m", "horizon_sim.cli.main", "train", "--model", "tiny", "--batch", "2", "--seq", "32",
           "--eval-batches", "0", "--no-progress", "--ckpt-dir", str(tmp_path / "ckpt"), "--disk-tier", "moments",
           "--disk-dir", str(tmp_path / "disk"), "--log-file", str(tmp_path / "log.jsonl"), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_killed_mid_run_resumes_to_the_uninterrupted_end(tmp_path):
    (tmp_path / "disk").mkdir()
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "disk").mkdir()
    out, err = _train(ref, "--steps", "8").communicate(timeout=300)
    want = [json.loads(x) for x in (ref / "log.jsonl").read_text().splitlines() if '"loss"' in x][-1]
    proc = _train(tmp_path, "--steps", "8", "--ckpt-interval", "2")
    t0 = time.monotonic()
    while len(ckpt_mod.list_checkpoints(tmp_path / "ckpt")) < 2:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < 300
        time.sleep(0.02)
    proc.kill()  # mid-step: the disk file holds moments the checkpoint does not
    proc.communicate(timeout=60)
    assert os.listdir(tmp_path / "disk") == []  # the file went with the process
    out, err = _train(tmp_path, "--steps", "8", "--ckpt-interval", "2", "--resume").communicate(timeout=300)
    got = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines() if '"loss"' in x][-1]
    assert got["step"] == want["step"] == 8, err
    assert got["loss"] == want["loss"]


@pytest.mark.parametrize("optimizer", ["pipelined", "backward"])
def test_a_split_masters_low_halves_on_disk_train_exactly_as_in_ram(optimizer, tmp_path):
    """disk_tier='moments+low': RAM keeps only the working copy (the high halves); the low
    halves and the moments are read into stages ahead of each update. The same run as with
    everything in RAM, bit for bit, and a checkpoint of it resumes exactly."""
    pol = Policy(batch=2, seq=16, split_master=True, optimizer=optimizer,
                 grad_clip=0.0 if optimizer == "backward" else 1.0)
    runs = {}
    for tier in ("none", "moments+low"):
        with Trainer(SPEC, dataclasses.replace(pol, disk_tier=tier), _on_disk(tmp_path, 0)) as tr:
            losses = [tr.step(_tokens(s)).loss for s in range(2)]
            if tier != "none":
                assert not any(tr.store.has(Holds.MASTER_LOW, u) for u in tr.units)
                path = ckpt_mod.save_checkpoint(tmp_path / "ckpt", tr, 2)
            losses += [tr.step(_tokens(s)).loss for s in range(2, 4)]
            tr.flush()
            runs[tier] = (losses, {u: (tr.gather_master(u), moments(tr, u)) for u in tr.units}, tr.store.nbytes)
    assert runs["none"][0] == runs["moments+low"][0]
    for u, (master, mom) in runs["none"][1].items():
        assert torch.equal(master, runs["moments+low"][1][u][0]) and torch.equal(mom, runs["moments+low"][1][u][1])
    assert runs["none"][2] - runs["moments+low"][2] >= 10 * SPEC.total_params - 4096 * 12
    with Trainer(SPEC, dataclasses.replace(pol, disk_tier="moments+low"), _on_disk(tmp_path, 5)) as tr:
        ckpt_mod.load_checkpoint(path, tr)
        assert [tr.step(_tokens(s)).loss for s in range(2, 4)] == runs["none"][0][2:]
