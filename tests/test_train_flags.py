"""Issue 19, items 8 and 12 (flags): harmful or malformed hyper-parameters and flags of
`horizon train` / `horizon validate` are refused up front with one line naming the value and
what is allowed, and the same rules hold for Python callers (AdamW, Trainer, the CPU backend);
a run whose every step was skipped as non-finite does not exit 0."""
import math
import re

import pytest
import torch

from horizon_exec.device.cpu import CpuBackend
from horizon_exec.optim.adamw import AdamW
from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

BASE = ["train", "--model", "tiny", "--steps", "2", "--batch", "2", "--seq", "32", "--no-progress",
        "--eval-batches", "0"]

FLAGS = {
    "--eps 0": "--eps 0.0 must be a finite number >= 1.18e-38",
    "--eps=-1e-8": "--eps -1e-08 must be",
    "--eps nan": "--eps nan must be",
    "--eps 1e-50": "--eps 1e-50 must be",
    "--eps 1e30": "--eps 1e+30 must be <= 0.01",   # issue 30: trains nothing, looks healthy
    "--beta1 2": "--beta1 2.0 must lie in [0, 1)",
    "--beta1 -0.1": "--beta1 -0.1 must lie in [0, 1)",
    "--beta2 1": "--beta2 1.0 must lie in [0, 1)",
    "--beta2 nan": "--beta2 nan must lie in [0, 1)",
    "--lr 1e30": "--lr 1e+30 must lie in [0, 1]",
    "--lr inf": "--lr inf must lie in [0, 1]",
    "--lr nan": "--lr nan must be positive",
    "--lr=-1e-3": "--lr -0.001 must be positive",
    "--lr 0": "--lr 0.0 must be positive",
    "--weight-decay nan": "--weight-decay nan must be a finite number >= 0",
    "--weight-decay -0.1": "--weight-decay -0.1 must be a finite number >= 0",
    "--weight-decay inf": "--weight-decay inf must be a finite number >= 0",
    "--lr 0.01 --weight-decay 200": "--weight-decay 200.0 times lr 0.01 is above 1",
    "--min-lr nan": "--min-lr nan must lie in [0, --lr 0.0003]",
    "--min-lr -1": "--min-lr -1.0 must lie in",
    "--min-lr 0.1": "--min-lr 0.1 must lie in",
    "--grad-clip nan": "grad_clip=nan must be a finite number >= 0",
    "--grad-clip inf": "grad_clip=inf must be a finite number >= 0",
    "--grad-clip -1": "grad_clip=-1.0 must be a finite number >= 0",
    "--warmup-steps -2": "--warmup-steps -2 must be >= 0",
    "--seed 18446744073709551616": "--seed 18446744073709551616 must lie in [0, 2**64)",
    "--seed -1": "--seed -1 must lie in [0, 2**64)",
    "--compute-threads -1": "--compute-threads -1 must be >= 1",
    "--compute-threads 0": "--compute-threads 0 must be >= 1",
    "--disk-dir /tmp": "--disk-dir /tmp needs --disk-tier moments or moments+low",   # issue 30: was ignored
    "--eos-token </s>": "--eos-token '</s>' needs a tokenizer (--tokenizer, or one in the --init-from folder)",
    "--device tpu": "--device: device 'tpu' is not supported; use 'cpu' or 'cuda[:N]'",
    "--device cuda:x": "--device: device 'cuda:x' is not supported",
}
if not torch.cuda.is_available():
    FLAGS["--device cuda"] = "--device: device 'cuda': "
    FLAGS["--device cuda:1"] = "--device: device 'cuda:1': "
elif torch.cuda.device_count() < 8:
    FLAGS["--device cuda:8"] = f"has {torch.cuda.device_count()} CUDA device(s)"


@pytest.mark.parametrize("flags", FLAGS)
def test_train_refuses_a_bad_flag_up_front(capsys, flags):
    assert main(BASE + flags.split()) == 2
    out, err = capsys.readouterr()
    assert "admission:" not in out and "final loss" not in out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("horizon train: error: ") and FLAGS[flags] in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:3"])
def test_validate_refuses_a_missing_gpu_up_front(tmp_path, capsys, device):
    assert main(["validate", "--quick", "--device", device, "--hardware", str(tmp_path / "none.toml"),
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"horizon validate: error: --device: device '{device}': ") and len(err.splitlines()) == 1


SPEC = ModelSpec(n_layers=1, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=256)


@pytest.mark.parametrize("kw,words", [
    (dict(eps=0.0), "AdamW eps=0.0 must be"), (dict(eps=math.nan), "AdamW eps=nan"),
    (dict(betas=(0.9, 1.0)), "AdamW beta2=1.0"), (dict(betas=(2, 0.9)), "AdamW beta1=2"),
    (dict(lr=1e30), "AdamW lr=1e+30 must lie in [0, 1]"), (dict(lr=-1.0), "AdamW lr=-1.0"),
    (dict(weight_decay=math.nan), "AdamW weight_decay=nan"), (dict(weight_decay=-1), "AdamW weight_decay=-1"),
    (dict(betas=(0.9,)), "AdamW betas=(0.9,) must be two numbers"),
])
def test_the_python_api_applies_the_same_rules(kw, words):
    with pytest.raises(HorizonError, match=re.escape(words)):
        AdamW(**kw)
    with pytest.raises(HorizonError, match="AdamW "):
        Trainer(SPEC, Policy(batch=1, seq=16),
                TrainerConfig(optimizer=OptimizerConfig(**kw), admission=AdmissionConfig(enabled=False)))


def test_the_trainer_checks_its_seed_threads_device_and_each_step_lr():
    pol = Policy(batch=1, seq=16)
    with pytest.raises(HorizonError, match=r"seed=18446744073709551616 must be an integer in \[0, 2\*\*64\)"):
        Trainer(SPEC, pol, TrainerConfig(admission=AdmissionConfig(enabled=False), seed=2**64))
    with pytest.raises(HorizonError, match="compute_threads=-1 must be a positive integer"):
        CpuBackend(compute_threads=-1)
    with pytest.raises(HorizonError, match="device 'gpu' is not supported"):
        Trainer(SPEC, pol, TrainerConfig(runtime=RuntimeConfig(device="gpu"), admission=AdmissionConfig(enabled=False)))
    cfg = TrainerConfig(optimizer=OptimizerConfig(weight_decay=0.1), admission=AdmissionConfig(enabled=False))
    with Trainer(SPEC, pol, cfg) as tr:
        before = {n: t.clone() for n, t in tr.state_dict().items()}
        for lr in (math.nan, math.inf, 1e30, -1.0):
            with pytest.raises(HorizonError, match=re.escape(f"lr={lr!r} must lie in [0, 1]")):
                tr.step(torch.zeros(1, 16, dtype=torch.long), lr=lr)
            with pytest.raises(HorizonError, match=re.escape(f"lr={lr!r} must lie in [0, 1]")):
                tr.lr = lr
        assert tr.steps_done == 0 and all(torch.equal(before[n], t) for n, t in tr.state_dict().items())


def test_a_run_whose_every_step_was_skipped_does_not_succeed(tmp_path, capsys, monkeypatch):
    real = Trainer.init_weights

    def nan_weights(self, seed):   # a NaN in the final norm: every loss is NaN
        real(self, seed)
        self.state_dict()["model.norm.weight"][0] = math.nan
        self.refresh_working_copy()

    monkeypatch.setattr(Trainer, "init_weights", nan_weights)
    # the whole fp32 master, whose state_dict() tensors are the master itself (where the CPU
    # has bf16 the default is a split master, whose state_dict() is assembled, a copy)
    assert main(BASE + ["--steps", "3", "--master-dtype", "fp32", "--save-hf", str(tmp_path / "out")]) == 1
    out, err = capsys.readouterr()
    assert "3 step(s) skipped for a non-finite loss or gradient: 1, 2, 3" in out
    assert err.strip() == ("horizon train: error: every step of this run (3) was skipped for a non-finite loss "
                           "or gradient, so the weights never changed (--save-hf not written); lower --lr or "
                           "check the data and the initial weights")
    assert not (tmp_path / "out").exists()
