"""HF checkpoints in and out of the host store (checkpoints/hf_checkpoint.py), against transformers itself.

- save_hf -> AutoModelForCausalLM.from_pretrained(dir) gives the master weights bit for bit
  and logits equal to the executor's own forward (fp32, 1e-5 norm-relative), sharded or
  not, tied or not, with q/k/v biases; bf16 saves load as bf16 (the master rounded).
- a checkpoint transformers wrote (save_pretrained, sharded by max_shard_size) loads into
  the store bit for bit, for llama (tied and untied), qwen2 and mistral.
- the loader reads one tensor at a time (never the model twice in RAM).
- bad checkpoints fail with a one-line HorizonError naming the tensor or key.
- a save that fails midway leaves the previous folder as it was.
All models are tiny and random: no downloads.
"""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from horizon_exec.checkpoints import hf_checkpoint
from horizon_exec.checkpoints.hf_checkpoint import load_hf, save_hf, spec_from_hf_dir
from horizon_exec.checkpoints.fileio import sha256_file
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.errors import HorizonError
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import T, V, rel_err, tiny_hf, tiny_spec

KINDS = ["llama", "llama-tied", "qwen2", "mistral", "qwen3"]
_spec, _hf, _rel = tiny_spec, tiny_hf, rel_err


pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _tokens(n=2, seed=0):
    return torch.randint(0, V, (n, T), generator=torch.Generator().manual_seed(seed))


# ---- save -> transformers ------------------------------------------------------------------

@pytest.mark.parametrize("kind,shard", [("llama", None), ("llama-tied", 40_000), ("qwen2", 40_000),
                                        ("qwen3", 40_000)])
def test_save_loads_in_transformers_with_equal_logits(tmp_path, kind, shard):
    from transformers import AutoModelForCausalLM
    pol = exact_policy(batch=2, seq=T, optimizer="pipelined", grad_clip=1.0)
    with Trainer(_spec(kind), pol, TrainerConfig(optimizer=OptimizerConfig(lr=1e-2), seed=1)) as tr:
        for s in range(2):  # trained weights, and a pending pipelined update at save time
            tr.step(_tokens(seed=s))
        assert tr.pending
        kw = {} if shard is None else {"max_shard_bytes": shard}
        out = save_hf(tr, tmp_path / "out", "fp32", **kw)
        assert not tr.pending  # the pending update was applied before writing
        files = sorted(os.listdir(out))
        if shard is None:
            assert files == ["config.json", "model.safetensors"]
        else:
            idx = json.loads((out / "model.safetensors.index.json").read_text())
            assert len(set(idx["weight_map"].values())) > 1
            assert sorted(idx["weight_map"]) == sorted(tr.state_dict())
        ref = AutoModelForCausalLM.from_pretrained(out)
        assert ref.dtype == torch.float32
        sd = tr.state_dict()
        for n, p in ref.named_parameters():
            src = sd.get(n, sd["model.embed_tokens.weight"] if n == "lm_head.weight" else None)
            assert torch.equal(p.detach(), src), n
        toks = _tokens(4, seed=9)
        with torch.no_grad():
            want = ref(input_ids=toks).logits
        got = tr.logits(toks)
        assert _rel(got, want) <= 1e-5
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_save_bf16_loads_as_bf16(tmp_path):
    from transformers import AutoModelForCausalLM
    with Trainer(_spec("qwen2"), exact_policy(batch=2, seq=T), TrainerConfig(seed=2)) as tr:
        out = save_hf(tr, tmp_path / "bf16", "bf16")
        ref = AutoModelForCausalLM.from_pretrained(out)
        assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
        assert ref.dtype == torch.bfloat16
        sd = tr.state_dict()
        for n, p in ref.named_parameters():
            assert torch.equal(p.detach(), sd[n].to(torch.bfloat16)), n


# ---- transformers -> load ------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_load_transformers_checkpoint(tmp_path, kind):
    ref = _hf(kind)
    ref.save_pretrained(tmp_path / "hf", max_shard_size="40KB")  # sharded, with an index
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    spec = spec_from_hf_dir(tmp_path / "hf")
    pol = exact_policy(batch=2, seq=T)
    with Trainer(spec, pol, TrainerConfig(random_init=False)) as tr:
        load_hf(tr, tmp_path / "hf")
        params = dict(ref.named_parameters())
        assert set(tr.state_dict()) == set(params) - ({"lm_head.weight"} if spec.tied_embeddings else set())
        for n, t in tr.state_dict().items():
            assert torch.equal(t, params[n].detach()), n
        toks = _tokens(2, seed=3)
        with torch.no_grad():
            want = ref(input_ids=toks).logits
        assert _rel(tr.logits(toks), want) <= 1e-5


def test_load_unsharded_and_bf16(tmp_path):
    ref = _hf("llama").to(torch.bfloat16)
    ref.save_pretrained(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    with Trainer(spec_from_hf_dir(tmp_path / "hf"), exact_policy(batch=2, seq=T),
                 TrainerConfig(random_init=False)) as tr:
        load_hf(tr, tmp_path / "hf")
        for n, p in ref.named_parameters():
            assert tr.state_dict()[n].dtype == torch.float32
            assert torch.equal(tr.state_dict()[n], p.detach().float()), n


def test_loader_holds_one_tensor_at_a_time(tmp_path, monkeypatch):
    """Every tensor the loader reads is dropped before the next one is read: the extra
    memory of a load is one tensor, never a second copy of the model."""
    import weakref

    import safetensors
    ref = _hf("llama")
    ref.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    live, peak, reads = [0], [0], [0]
    real_open = safetensors.safe_open

    class Handle:
        def __init__(self, *a, **k):
            self.h = real_open(*a, **k)

        def __enter__(self):
            self.h.__enter__()
            return self

        def __exit__(self, *exc):
            return self.h.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self.h, name)

        def get_tensor(self, name):
            t = self.h.get_tensor(name)
            n = t.numel() * t.element_size()
            live[0] += n
            peak[0] = max(peak[0], live[0])
            reads[0] += 1
            weakref.finalize(t, lambda: live.__setitem__(0, live[0] - n))
            return t

    monkeypatch.setattr(safetensors, "safe_open", Handle)
    with Trainer(spec_from_hf_dir(tmp_path / "hf"), exact_policy(batch=2, seq=T),
                 TrainerConfig(random_init=False)) as tr:
        load_hf(tr, tmp_path / "hf")
        largest = max(t.numel() * 4 for t in tr.state_dict().values())
        assert reads[0] == len(tr.state_dict())
    assert 0 < peak[0] <= largest and live[0] == 0


# ---- bad checkpoints ----------------------------------------------------------------------------

def _broken(tmp_path, how):
    """A single-file llama checkpoint, damaged as `how` says; returns its folder."""
    ref = _hf("llama")
    d = tmp_path / how
    ref.save_pretrained(d)
    sd = load_file(d / "model.safetensors")
    cfg = json.loads((d / "config.json").read_text())
    if how == "missing":
        del sd["model.layers.1.mlp.up_proj.weight"]
    elif how == "unexpected":
        sd["model.layers.1.mlp.extra.weight"] = torch.zeros(3)
    elif how == "shape":
        sd["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    elif how == "dtype":
        sd["model.norm.weight"] = torch.zeros(64, dtype=torch.int32)
    elif how in ("nan", "inf"):  # issue 30: caught at load, not as nan evals
        sd["model.layers.1.mlp.up_proj.weight"][3, 5] = float(how)
    elif how == "model_type":
        cfg["model_type"] = "bloom"
    elif how == "config_shape":
        cfg["intermediate_size"] = 128
    elif how == "index":
        (d / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    elif how == "truncated":
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[:len(data) // 2])
        return d
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("how,match", [
    ("missing", "tensor 'model.layers.1.mlp.up_proj.weight' is missing"),
    ("unexpected", "unexpected tensor 'model.layers.1.mlp.extra.weight'"),
    ("shape", r"tensor 'model.layers.0.self_attn.k_proj.weight' has shape \(16, 64\), the model needs \(32, 64\)"),
    ("dtype", "tensor 'model.norm.weight' has dtype I32"),
    ("model_type", "model_type 'bloom' is not supported"),
    ("config_shape", "ffn_hidden=128 but the model being trained has ffn_hidden=96"),
    ("index", "shard 'model-00002-of-00002.safetensors' is missing"),
    ("truncated", "cannot read"),
    ("nan", r"model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' holds 1 NaN or infinite value"),
    ("inf", r"tensor 'model.layers.1.mlp.up_proj.weight' holds 1 NaN or infinite value\(s\) \(first at \[3, 5\]: inf\)"),
])
def test_bad_checkpoint_is_a_one_line_error(tmp_path, how, match):
    d = _broken(tmp_path, how)
    with Trainer(_spec("llama"), exact_policy(batch=2, seq=T), TrainerConfig(random_init=False)) as tr:
        with pytest.raises(HorizonError, match=match) as e:
            load_hf(tr, d)
    assert "\n" not in str(e.value)


def test_not_a_folder_and_bin_only(tmp_path):
    with pytest.raises(HorizonError, match="not a folder"):
        spec_from_hf_dir(tmp_path / "nope")
    d = _broken(tmp_path, "missing")
    os.rename(d / "model.safetensors", d / "pytorch_model.bin")
    with Trainer(_spec("llama"), exact_policy(batch=2, seq=T), TrainerConfig(random_init=False)) as tr:
        with pytest.raises(HorizonError, match="convert them to safetensors"):
            load_hf(tr, d)


# ---- atomic save ---------------------------------------------------------------------------------

def test_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "model"
    with Trainer(_spec("llama"), exact_policy(batch=2, seq=T), TrainerConfig(seed=1)) as tr:
        save_hf(tr, out, "fp32", max_shard_bytes=40_000)
        before = {f: sha256_file(out / f) for f in os.listdir(out)}
        tr.step(_tokens())
        real = hf_checkpoint.write_safetensors
        calls = [0]

        def dies_midway(path, items, metadata=None):
            calls[0] += 1
            if calls[0] == 2:  # the second shard: write half of it, then fail
                real(path, items[:1], metadata)
                raise OSError("disk full (injected)")
            return real(path, items, metadata)

        monkeypatch.setattr(hf_checkpoint, "write_safetensors", dies_midway)
        with pytest.raises(OSError, match="injected"):
            save_hf(tr, out, "fp32", max_shard_bytes=40_000)
    assert {f: sha256_file(out / f) for f in os.listdir(out)} == before
    assert sorted(os.listdir(tmp_path)) == ["model"]  # no temporary folder left behind


def test_save_refuses_to_replace_a_folder_with_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with Trainer(_spec("llama"), exact_policy(batch=2, seq=T)) as tr:
        with pytest.raises(HorizonError, match="notes.txt"):
            save_hf(tr, tmp_path, "fp32")
    assert (tmp_path / "notes.txt").read_text() == "mine"
