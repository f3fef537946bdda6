"""The real peer here: DeepSpeed ZeRO-3 with parameters and optimizer offloaded to CPU runs on this
machine (its CPU accelerator, gloo, DeepSpeedCPUAdam), trains what Horizon trains to the same
losses, and `horizon validate --peer zero3-offload` compares it with its simulated Schedule.
DeepSpeed's first run on a machine builds its CPU ops (about a minute); later runs load them."""
import json
import math

import pytest
import torch

from horizon_exec.checkpoints.hf_checkpoint import load_hf
from horizon_exec.measure.peer_deepspeed import deepspeed_available, run_deepspeed
from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.specs.hardware_io import save_hardware
from horizon_sim.specs.policy import Policy
from tests.cpu_machine import CPU_HW
from tests.hf_tiny import tiny_hf, tiny_spec

pytestmark = pytest.mark.skipif(deepspeed_available() is None, reason="DeepSpeed is not installed")

STEPS, B, T = 20, 2, 32


def test_losses_agree_with_deepspeed_zero3_offload_over_20_steps(tmp_path):
    """fp32, the same initial weights, data, AdamW and clipping: Horizon's executor and DeepSpeed
    ZeRO-3 offload (its own CPU Adam, its own fp32 gradient partitions) give the same losses."""
    ref = tiny_hf("llama")
    ref.save_pretrained(tmp_path / "init", safe_serialization=True)
    spec = tiny_spec("llama")
    gen = torch.Generator().manual_seed(7)
    data = torch.randint(0, spec.vocab, (2, B, T), generator=gen).repeat(STEPS // 2, 1, 1)  # learnable
    hp = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    ds = run_deepspeed(spec, Zero3Policy(batch=B, seq=T, compute_dtype="fp32", act_ckpt=False, grad_clip=1.0),
                       steps=STEPS, warmup=0, threads=1, tokens=data.tolist(), init_dir=str(tmp_path / "init"), **hp)
    assert ds["optimizer"] == "DeepSpeedCPUAdam"
    pol = Policy(batch=B, seq=T, compute_dtype="fp32", master_dtype="fp32", grad_dtype="fp32", working_copy=False,
                 grad_clip=1.0)
    cfg = TrainerConfig(optimizer=OptimizerConfig(**hp), admission=AdmissionConfig(enabled=False), random_init=False)
    with Trainer(spec, pol, cfg) as tr:
        load_hf(tr, tmp_path / "init")
        ours = [tr.step(data[i]).loss for i in range(STEPS)]
    theirs = [s["loss"] for s in ds["steps"]]
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, theirs)]
    assert ours[-1] < ours[0] - 0.5  # it trained: the comparison is not of two constants
    assert max(rel) < 1e-4, (max(rel), ours, theirs)


def test_validate_peer_quick_writes_the_comparison(tmp_path, capsys):
    save_hardware(CPU_HW, tmp_path / "hw.toml")
    out = tmp_path / "r"
    assert main(["validate", "--peer", "deepspeed", "--quick", "--hardware", str(tmp_path / "hw.toml"),
                 "--out", str(out), "--steps", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["configs"]
    assert row["config"] == "ds_tiny" and row["step_s_meas"] > 0 and row["rss_MiB_meas"] > 100
    for k in ("step_s_err", "rss_MiB_err"):
        assert math.isfinite(row[k])
    assert doc["adam_Gparams_per_s"] > 0 and doc["runtime_GiB"] > 0
    md = (out / "validation_peer.md").read_text()
    assert "ds_tiny" in md and "Median |step-time error|" in md and "validation_peer_ds_tiny.png" in md
    png = (out / "validation_peer_ds_tiny.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # the measured compute (hooked layer windows) is there and inside the step
    assert 0 < row["compute_s_meas"] <= row["step_s_meas"] * 2


def test_validate_peer_refuses_what_it_does_not_offer(tmp_path, capsys):
    save_hardware(CPU_HW, tmp_path / "hw.toml")
    base = ["validate", "--peer", "zero3-offload", "--hardware", str(tmp_path / "hw.toml"), "--out", str(tmp_path / "r")]
    for extra, says in ((["--configs", "nosuch"], "unknown peer configuration(s) nosuch"),
                        (["--peer-threads", "0"], "--peer-threads 0 must be >= 1")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err
