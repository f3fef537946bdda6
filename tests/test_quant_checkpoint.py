"""Issue 42, item 2: a checkpoint saved 4-bit by transformers' bitsandbytes integration (NF4 with
double quantization, QLoRA's, as the '-bnb-4bit' checkpoints are) is read as it is. A run on an
nf4 base keeps its packed bytes bit for bit and computes QLoRA's logits exactly; any other run
takes the weights dequantized, equal to bitsandbytes' own dequantization; a save is full
precision and loads in transformers; other bitsandbytes formats are refused in one line."""
import json
from dataclasses import replace

import pytest
import torch

from horizon_exec.checkpoints.hf_checkpoint import load_hf, save_hf, spec_from_hf_dir
from horizon_exec.model import quant as Q
from horizon_exec.runtime.config import TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import Holds
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import rel_err
from tests.test_families import T, _random_hf, tiny

bnb = pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(the fp32 folder, the 4-bit folder, the 4-bit model in training mode: bitsandbytes' exact
    path on the CPU) of a tiny Llama whose MLP width is a multiple of 64."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    d = tmp_path_factory.mktemp("bnb")
    _random_hf(replace(tiny("llama"), ffn_hidden=128)).save_pretrained(d / "fp32")
    cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.float32)
    q = AutoModelForCausalLM.from_pretrained(d / "fp32", quantization_config=cfg, device_map="cpu", dtype=torch.float32)
    q.save_pretrained(d / "q4")
    return d / "fp32", d / "q4", q.train()


def _trainer(folder, **policy):
    spec = spec_from_hf_dir(folder)
    pol = exact_policy(**{"batch": 2, "seq": T, "optimizer": "after", "lora_rank": 4, **policy})
    tr = Trainer(spec, pol, TrainerConfig(random_init=False))
    load_hf(tr, folder)
    return tr


def _file(folder) -> dict:
    from safetensors.torch import load_file
    return load_file(str(folder / "model.safetensors"))


def test_an_nf4_run_keeps_the_checkpoints_bytes_and_computes_qloras_logits(saved, tmp_path):
    _, q4, qmodel = saved
    stored = _file(q4)
    tokens = torch.randint(0, 96, (2, T), generator=torch.Generator().manual_seed(0))
    with _trainer(q4, base_quant="nf4") as tr:
        unit = Q.QuantUnit(tr.model, "nf4", "fp32")
        n = 0
        for u in range(tr.model.n_layers):
            buf = tr.store.of(Holds.QUANT_BASE, u)
            for t in (t for t in unit.layout if t.fmt == "nf4"):
                r, w = unit.regions(buf, t), f"model.layers.{u}.{t.name}"
                assert torch.equal(r["codes"], stored[w].view(-1)) and torch.equal(r["absmax"], stored[f"{w}.absmax"])
                assert torch.equal(r["absmax2"], stored[f"{w}.nested_absmax"])
                n += 1
        assert n == 7 * tr.model.n_layers
        with torch.no_grad():
            assert rel_err(tr.logits(tokens), qmodel(input_ids=tokens).logits) <= 1e-6
        tr.step(tokens)
        with torch.no_grad():
            want = tr.logits(tokens)
        save_hf(tr, tmp_path / "out")
    from transformers import AutoModelForCausalLM
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    with torch.no_grad():
        assert rel_err(got(input_ids=tokens).logits, want) <= 1e-5


@pytest.mark.parametrize("policy", [dict(), dict(lora_rank=0, optimizer="pipelined")])
def test_other_runs_take_the_weights_as_bitsandbytes_dequantizes_them(saved, policy):
    _, q4, qmodel = saved
    want = {}
    for name, mod in qmodel.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            want[f"{name}.weight"] = bnb.functional.dequantize_4bit(mod.weight.data, mod.weight.quant_state)
    with _trainer(q4, **policy) as tr:
        sd = tr.state_dict()
        assert want and all(torch.equal(sd[n].float(), w) for n, w in want.items())


def _broken(q4, tmp_path, edit):
    """A copy of the 4-bit folder with down_proj's quant state edited by `edit`."""
    import shutil

    from safetensors.torch import save_file
    out = tmp_path / "broken"
    shutil.copytree(q4, out)
    t = _file(q4)
    key = "model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4"
    state = json.loads(bytes(t[key].tolist()).decode())
    edit(state)
    t[key] = torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("edit, says", [
    (lambda s: s.update(blocksize=128), "stored with blocksize = 128; Horizon reads bitsandbytes' nf4"),
    (lambda s: s.update(quant_type="fp4"), "stored with quant_type = 'fp4'"),
])
def test_another_4bit_format_is_refused_naming_it(saved, tmp_path, edit, says):
    with pytest.raises(HorizonError, match=says):
        _trainer(_broken(saved[1], tmp_path, edit), base_quant="nf4")


def test_another_quantization_config_is_refused_in_one_line(saved, tmp_path):
    import shutil
    out = tmp_path / "fp4"
    shutil.copytree(saved[1], out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["bnb_4bit_use_double_quant"] = False
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HorizonError, match="bnb_4bit_use_double_quant = false; Horizon reads bitsandbytes' 4-bit NF4"):
        spec_from_hf_dir(out)
