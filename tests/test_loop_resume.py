"""The training loop: lr schedule values, exact resume (a run interrupted at step k and
resumed computes the uninterrupted run's losses, eval losses and final state bit for bit),
atomic checkpoints with checksums, and `horizon train` end to end."""
import errno
import json
import math
import os

import pytest
import torch

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.data.data import load_dataset
from horizon_exec.train.loop import LoopConfig, TrainLoop
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy, exact_policy


pytestmark = pytest.mark.usefixtures("one_intraop_thread")


# ---- lr schedule -----------------------------------------------------------------------------

def test_warmup_then_cosine_values():
    s = CosineSchedule(peak=1e-3, total_steps=10, warmup_steps=2, min_lr=1e-4)
    lrs = [s(i) for i in range(10)]
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)   # (s+1)/warmup
    assert lrs[2] == pytest.approx(1e-3)                                     # decay starts at the peak
    # p = (s - 2) / 8: halfway (s = 6) is the midpoint of peak and floor
    assert lrs[6] == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert lrs[9] == pytest.approx(1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi * 7 / 8)))
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))                     # monotone after warmup
    assert s(10) == pytest.approx(1e-4) and s(50) == pytest.approx(1e-4)     # floor past the end
    assert CosineSchedule(peak=2.0, total_steps=4)(0) == 2.0                 # no warmup


@pytest.mark.parametrize("kw,match", [(dict(peak=0.0), "lr"), (dict(min_lr=2.0), "min lr"),
                                      (dict(total_steps=0), "total steps"), (dict(warmup_steps=-1), "warmup")])
def test_schedule_validation(kw, match):
    base = dict(peak=1.0, total_steps=10, warmup_steps=0, min_lr=0.0)
    with pytest.raises(HorizonError, match=match):
        CosineSchedule(**{**base, **kw})


# ---- exact resume ------------------------------------------------------------------------------

SPEC = ModelSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=256)
STEPS, K = 7, 4


@pytest.fixture(scope="module")
def dataset():
    return load_dataset(None, ByteTokenizer(), seq=32, eval_fraction=0.01)


def _loop(ds, pol, ckpt_dir=None, seed=0):
    tr = Trainer(SPEC, pol, TrainerConfig(optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95)),
                                          seed=seed))
    cfg = LoopConfig(steps=STEPS, lr_schedule=CosineSchedule(peak=3e-3, total_steps=STEPS, warmup_steps=2,
                                                          min_lr=3e-4),
                     eval_every=3, eval_batches=2, ckpt_dir=ckpt_dir, save_every=2, keep_ckpts=0,
                     progress=False)
    return tr, TrainLoop(tr, ds, cfg, seed=5, out=lambda *_: None)


def _final_state(tr):
    tr.flush()
    return {n: t.clone() for n, t in tr.store.t.items() if n.startswith(("master.", "moments."))} | \
        {f"steps.{u}": s.clone() for u, s in tr.store.steps.items()}


POLICIES = {
    # fp32 everywhere, pipelined optimizer with clipping, gradient accumulation over 2 micro-batches
    "fp32-pipelined-clip-accum": exact_policy(batch=4, seq=32, micro_batches=2, act_ckpt_every=2,
                                              optimizer="pipelined", grad_clip=0.5),
    # the default mixed precision (bf16 device, bf16 working copy and link grads)
    "bf16-after": Policy(batch=2, seq=32, optimizer="after", grad_clip=1.0),
    # bf16 Adam moments (the native AdamW kernel), pipelined: moments and pending grads in the checkpoint
    "bf16-moments-pipelined": Policy(batch=2, seq=32, optimizer="pipelined", grad_clip=1.0, states_dtype="bf16"),
}


@pytest.mark.parametrize("name", POLICIES)
def test_resume_is_bit_exact(tmp_path, dataset, name):
    pol = POLICIES[name]
    tr_u, uninterrupted = _loop(dataset, pol)
    with tr_u:
        uninterrupted.run()
        want = _final_state(tr_u)
    # interrupted: checkpoints at 2 and 4, then the process "dies" after step K
    tr_i, interrupted = _loop(dataset, pol, ckpt_dir=tmp_path)
    with tr_i:
        interrupted.run(until=K)
    assert [p.name for p in ckpt_mod.list_checkpoints(tmp_path)] == ["step-00000002", "step-00000004"]
    meta = ckpt_mod.read_meta(tmp_path / "step-00000004")
    assert meta["trainer"]["pending"] == (pol.optimizer == "pipelined")  # pending grads were saved
    ckpt_mod.verify_checkpoint(tmp_path / "step-00000004")
    # resumed: a fresh process, other init seed (the weights must come from the checkpoint)
    tr_r, resumed = _loop(dataset, pol, ckpt_dir=tmp_path, seed=123)
    with tr_r:
        assert resumed.resume(tmp_path).name == "step-00000004" and resumed.step == K
        resumed.run()
        got = _final_state(tr_r)
    for s in range(K):
        assert interrupted.losses[s] == uninterrupted.losses[s]       # checkpointing changes nothing
    for s in range(K, STEPS):
        assert resumed.losses[s] == uninterrupted.losses[s], f"step {s}"  # bit for bit
    assert resumed.evals == {6: uninterrupted.evals[6], 7: uninterrupted.evals[7]}
    assert set(got) == set(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
    assert ckpt_mod.latest_checkpoint(tmp_path).name == "step-00000007"


def test_clipping_was_active_in_the_resume_run(dataset):
    """The fp32 case above really exercises clipping (its grad norms exceed 0.5)."""
    tr, loop = _loop(dataset, POLICIES["fp32-pipelined-clip-accum"])
    with tr:
        loop.run(until=2)
        assert loop.last.grad_norm > 0.5


def test_resume_refuses_other_policy_or_data(tmp_path, dataset):
    pol = POLICIES["bf16-after"]
    tr, loop = _loop(dataset, pol, ckpt_dir=tmp_path)
    with tr:
        loop.run(until=2)
    tr, loop = _loop(dataset, Policy(batch=2, seq=32, optimizer="after", grad_clip=0.5))
    with tr, pytest.raises(HorizonError, match="policy grad_clip=1.0.*grad_clip=0.5"):
        loop.resume(tmp_path)
    other = load_dataset(None, ByteTokenizer(), seq=32, eval_fraction=0.02)
    tr = Trainer(SPEC, pol)
    with tr, pytest.raises(HorizonError, match="different data"):
        TrainLoop(tr, other, LoopConfig(steps=3, lr_schedule=CosineSchedule(peak=1e-3, total_steps=3)),
                  seed=5).resume(tmp_path)
    with pytest.raises(HorizonError, match="no checkpoint"):
        ckpt_mod.resolve(tmp_path / "empty")


# ---- atomic checkpoints ------------------------------------------------------------------------

def test_failed_checkpoint_leaves_the_previous_one(tmp_path, monkeypatch):
    pol = POLICIES["bf16-after"]
    with Trainer(SPEC, pol, TrainerConfig(seed=1)) as tr:
        tr.step(torch.randint(0, 256, (2, 32)))
        good = ckpt_mod.save_checkpoint(tmp_path, tr, 1, {"x": 1})
        sums = (good / "SHA256SUMS").read_text()
        tr.step(torch.randint(0, 256, (2, 32)))
        real = ckpt_mod.write_safetensors

        def dies_midway(path, items, metadata=None):
            real(path, items[:3], metadata)  # a partial file, then the disk fills up
            raise OSError(errno.ENOSPC, "No space left on device (injected)", str(path))

        with monkeypatch.context() as full_disk:
            full_disk.setattr(ckpt_mod, "write_safetensors", dies_midway)
            with pytest.raises(HorizonError, match=r"cannot write checkpoint .*step-00000002: no space left on the "
                                                   r"device \(.*state.safetensors\); it needs about .* free there\); "
                                                   r"the checkpoints before it are intact"):
                ckpt_mod.save_checkpoint(tmp_path, tr, 2, {"x": 2})
        assert sorted(os.listdir(tmp_path)) == [".lock", "latest", "step-00000001"]  # no half-written folder
        assert ckpt_mod.latest_checkpoint(tmp_path) == good
        assert (good / "SHA256SUMS").read_text() == sums
        ckpt_mod.verify_checkpoint(good)
        assert ckpt_mod.load_checkpoint(tmp_path, tr)["loop"] == {"x": 1}
    # a flipped byte is caught by the checksums
    data = bytearray((good / "state.safetensors").read_bytes())
    data[-1] ^= 1
    (good / "state.safetensors").write_bytes(bytes(data))
    with pytest.raises(HorizonError, match="checksum mismatch"):
        ckpt_mod.verify_checkpoint(good)


def test_keep_prunes_old_checkpoints(tmp_path):
    with Trainer(SPEC, POLICIES["bf16-after"]) as tr:
        for s in (1, 2, 3):
            ckpt_mod.save_checkpoint(tmp_path, tr, s, keep=2)
    assert [p.name for p in ckpt_mod.list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    assert (tmp_path / "latest").read_text().strip() == "step-00000003"


# ---- horizon train ------------------------------------------------------------------------------

def test_horizon_train_end_to_end(tmp_path, capsys):
    """--init-from an HF folder (with its tokenizer.json), JSONL data, checkpoints, --save-hf;
    then --resume continues to more steps, and the saved folder loads in transformers."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM

    from tests.hf_tiny import tiny_hf
    hf = tmp_path / "hf"
    tiny_hf("qwen2").save_pretrained(hf)
    words = ["</s>", "[UNK]"] + [f"w{i}" for i in range(100)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(hf / "tokenizer.json"))
    g = torch.Generator().manual_seed(0)
    recs = [{"instruction": " ".join(f"w{int(i)}" for i in torch.randint(0, 100, (6,), generator=g)),
             "response": " ".join(f"w{int(i)}" for i in torch.randint(0, 100, (10,), generator=g))}
            for _ in range(60)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    common = ["train", "--init-from", str(hf), "--data", str(tmp_path / "sft.jsonl"), "--batch", "2",
              "--seq", "16", "--grad-accum", "2", "--compute-dtype", "fp32", "--lr", "1e-3",
              "--warmup-steps", "1", "--eval-every", "2", "--eval-batches", "1", "--ckpt-dir",
              str(tmp_path / "ckpt"), "--ckpt-interval", "2", "--gpu", "h100-sxm", "--no-progress",
              "--log-file", str(tmp_path / "log.jsonl")]
    assert main(common + ["--steps", "3", "--save-hf", str(tmp_path / "out"), "--save-dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert f"tokenizer {hf / 'tokenizer.json'}" in out and f"weights from {hf}" in out
    assert "final loss" in out and "eval loss" in out and "MFU" in out and "tokens/s" in out
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    logs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logs if "loss" in r] == [1, 2, 3] and all("mfu" in r for r in logs if "loss" in r)
    assert main(common + ["--steps", "5", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "at step 3" in out and "final loss" in out
    assert ckpt_mod.latest_checkpoint(tmp_path / "ckpt").name == "step-00000005"


@pytest.mark.parametrize("argv,match", [
    (["--model", "tiny", "--resume"], "--resume without a folder needs --ckpt-dir"),
    (["--model", "tiny", "--data", "/nonexistent.jsonl"], "not found"),
    (["--steps", "2"], "give --model"),
    (["--model", "tiny", "--warmup-steps", "-1"], "--warmup-steps -1 must be >= 0"),
    (["--model", "tiny", "--tokenizer", "/nonexistent/tokenizer.json"], "not found"),
    (["--model", "tiny", "--init-from", "/nonexistent"], "not a folder"),
    (["--model", "tiny", "--seq", "16", "--resume", "/nonexistent"], "no checkpoint"),
    (["--model", "tiny", "--seq", "16", "--gpu", "h100-sxm", "--hardware", "x.toml"], "not both"),
])
def test_horizon_train_bad_input_exits_2(argv, match, capsys):
    assert main(["train", *argv, "--no-progress", "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


def test_mfu_against_a_hardware_file(tmp_path, capsys):
    from horizon_sim.specs.hardware_io import save_hardware
    from horizon_sim.specs.hardware_presets import make_hardware
    save_hardware(make_hardware("a100-80gb", "512GiB"), tmp_path / "hw.toml")
    argv = ["train", "--model", "tiny", "--steps", "1", "--batch", "2", "--seq", "32", "--no-progress",
            "--eval-batches", "0", "--hardware", str(tmp_path / "hw.toml"), "--compute-dtype", "bf16"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "MFU against a100-80gb bf16 peak 312 TFLOP/s" in out and "% " in out.split("final loss")[1]


def test_tokenizer_larger_than_the_vocab_is_refused(tmp_path, capsys):
    from horizon_sim.specs.hf_export import to_hf_config_dict
    (tmp_path / "config.json").write_text(json.dumps(to_hf_config_dict(
        ModelSpec(n_layers=1, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=128))))
    assert main(["train", "--model", str(tmp_path / "config.json"), "--seq", "16", "--no-progress"]) == 2
    assert "tokenizer bytes has 256 ids; the model's vocab is 128" in capsys.readouterr().err


def test_a_checkpoint_from_before_a_field_existed_resumes_with_its_default(tmp_path):
    """trainer.json written before a ModelSpec/Policy field was added does not name it: the run
    it came from used the default, so it is compatible; a real difference is still refused."""
    from horizon_exec.checkpoints.ckpt import check_compatible
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.errors import HorizonError
    from horizon_sim.specs.model_presets import model_preset
    from horizon_sim.specs.policy import Policy
    with Trainer(model_preset("tiny"), Policy(batch=1, seq=16)) as tr:
        model, policy = tr.model.to_dict(), tr.policy.to_dict()
        for k in ("layer_windows", "rope_scaling", "max_position"):
            model.pop(k)
        for k in ("doc_masks", "doc_tokens"):
            policy.pop(k)
        for old, new in (("ckpt_every", "act_ckpt_every"), ("ckpt_on", "act_ckpt_on")):  # renamed since
            policy[old] = policy.pop(new)
        check_compatible(tmp_path, {"model": model, "policy": policy}, tr)
        with pytest.raises(HorizonError, match="policy doc_masks=True"):
            check_compatible(tmp_path, {"model": model, "policy": {**policy, "doc_masks": True}}, tr)
