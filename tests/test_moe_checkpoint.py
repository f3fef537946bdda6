"""MoE checkpoints in and out (issue 28): experts are stored per expert, as the hub's models and
transformers' save_pretrained store them, and held fused (checkpoints/hf_experts.py).

- save_hf (one file, sharded, and a split master's gathered save) writes the tensor names
  save_pretrained writes, and the folder loads in transformers with the master's logits;
- `horizon train --init-from <tiny qwen3_moe> --steps 2 --save-hf OUT` trains and OUT loads in
  transformers with the trained weights; a config with the router aux loss on
  (output_router_logits true) trains too, and each step's metrics line reports the aux loss.
"""
import pytest
import torch

from horizon_exec.checkpoints.hf_checkpoint import load_hf, save_hf, spec_from_hf_dir
from horizon_exec.optim import native
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.specs.policy import Policy, exact_policy
from tests.hf_tiny import rel_err
from tests.hf_tokenizers import VOCAB, jsonl, tokenizer_folder
from tests.test_moe_exec import CASES, hf_moe

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
T = 16


def _names(folder) -> set[str]:
    import json
    idx = folder / "model.safetensors.index.json"
    if idx.is_file():
        return set(json.loads(idx.read_text())["weight_map"])
    from safetensors import safe_open
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("name,shard,split", [("mixtral", None, False), ("qwen2_moe", 40_000, False),
                                              ("qwen3_moe-norm", 40_000, True)])
def test_save_writes_save_pretrained_names_and_loads_in_transformers(tmp_path, name, shard, split):
    from transformers import AutoModelForCausalLM
    if split and native.kernels() is None:
        pytest.skip(native.status())
    ref = hf_moe(*CASES[name])
    ref.save_pretrained(tmp_path / "src")
    spec = spec_from_hf_dir(tmp_path / "src")
    pol = Policy(batch=2, seq=T, act_ckpt_every=2, split_master=True) if split else \
        exact_policy(batch=2, seq=T, optimizer="pipelined", grad_clip=1.0)
    with Trainer(spec, pol, TrainerConfig(optimizer=OptimizerConfig(lr=1e-2), seed=1, random_init=False)) as tr:
        load_hf(tr, tmp_path / "src")
        for s in range(2):  # trained weights (and, pipelined, an update pending at the save)
            tr.step(torch.randint(0, spec.vocab, (2, T), generator=torch.Generator().manual_seed(s)))
        kw = {} if shard is None else {"max_shard_bytes": shard}
        out = save_hf(tr, tmp_path / "out", "fp32", **kw)
        sd = tr.state_dict()
        assert _names(out) == _names(tmp_path / "src")
        got = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, experts_implementation="eager")
        params = dict(got.named_parameters())
        assert set(params) == set(sd) and all(torch.equal(params[n].detach(), sd[n]) for n in sd)
        assert not torch.equal(params["model.layers.0.mlp.experts.gate_up_proj"],
                               dict(ref.named_parameters())["model.layers.0.mlp.experts.gate_up_proj"])  # trained
        toks = torch.randint(0, spec.vocab, (2, T), generator=torch.Generator().manual_seed(9))
        with torch.no_grad():
            want = got(input_ids=toks).logits
        if not split:  # a split master computes in bf16; its weights were compared bit for bit above
            assert rel_err(tr.logits(toks), want) <= 1e-5


def _source(tmp_path, **over):
    src = tmp_path / "src"
    mt, cfg = CASES["qwen3_moe-norm"]
    hf_moe(mt, {**cfg, "vocab_size": VOCAB, **over}).save_pretrained(src)
    tokenizer_folder(src)
    return src


def _train(*args) -> int:
    return main(["train", "--steps", "2", "--batch", "2", "--seq", "32", "--no-progress", "--eval-batches", "0",
                 *map(str, args)])


def test_train_cli_on_a_qwen3_moe_folder_saves_what_transformers_loads(tmp_path):
    from transformers import AutoModelForCausalLM
    src = _source(tmp_path)
    text = [{"text": f"expert {i} routes token {i * 7} to slot {i % 3}."} for i in range(60)]
    out = tmp_path / "out"
    assert _train("--init-from", src, "--data", jsonl(tmp_path / "c.jsonl", text), "--save-hf", out,
                  "--save-dtype", "fp32", "--lr", "1e-2") == 0
    before = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    after = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert _names(out) == _names(src)
    toks = torch.randint(0, VOCAB, (1, 32))
    with torch.no_grad():
        assert not torch.equal(before(toks).logits, after(toks).logits)  # trained, and it loads
        after.generate(toks[:, :4], max_new_tokens=3, do_sample=False)


def test_train_cli_trains_with_the_router_aux_loss(tmp_path, capsys):
    import json
    import math
    src = _source(tmp_path, output_router_logits=True, router_aux_loss_coef=0.02)
    log = tmp_path / "metrics.jsonl"
    assert _train("--init-from", src, "--tokenizer", "bytes", "--log-file", log) == 0
    assert "(router aux " in capsys.readouterr().out.split("final loss")[1]
    steps = [r for r in map(json.loads, log.read_text().splitlines()) if "loss" in r]
    assert len(steps) == 2
    # E * sum_e f_e p_e (f: each expert's share of the picks, p: of the probability): k = 2 for a
    # balanced router, at most E
    assert all(0 < r["aux_loss"] <= CASES["qwen3_moe-norm"][1]["num_experts"] and math.isfinite(r["loss"])
               for r in steps)
