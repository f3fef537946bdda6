"""Block-wise FP8 checkpoints (DeepSeek-V3's hub format; horizon_exec/checkpoints/hf_fp8.py):

- the dequantization equals transformers' Fp8Dequantize bit for bit on shapes that are multiples
  of the block, and covers other shapes with partial blocks (DeepSeek's reference rule);
- a tiny DeepSeek-V3 checkpoint whose projections are stored FP8 (its experts per expert, as the
  hub's) loads in transformers and in Horizon to the same logits, Horizon says it dequantized
  them, and a damaged one is refused naming the tensor;
- an FP8 setting Horizon does not read is refused by name."""
import json

import pytest
import torch

from horizon_exec.checkpoints import hf_fp8
from horizon_exec.checkpoints.hf_checkpoint import load_hf, spec_from_hf_dir
from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hf_config import spec_from_config_dict
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import rel_err
from tests.test_deepseek import B, T, V, hf_v3

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
BLOCK = (8, 8)


def test_dequantize_is_transformers_on_whole_blocks_and_covers_partial_ones():
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(256, 384, generator=gen)
    q, s = hf_fp8.quantize(w, (128, 128))
    assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 3)
    want = Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=torch.float32)
    assert torch.equal(hf_fp8.dequantize(q, s, (128, 128)), want)
    assert rel_err(want, w) < 0.05  # e4m3: three mantissa bits
    w = torch.randn(200, 300, generator=gen)  # partial blocks at the right and bottom edges
    q, s = hf_fp8.quantize(w, (128, 128))
    assert s.shape == (2, 3)
    got = hf_fp8.dequantize(q, s, (128, 128))
    i, j = 150, 290
    assert got[i, j] == q[i, j].float() * s[i // 128, j // 128]
    assert rel_err(got, w) < 0.05


def _write_fp8(ref, folder) -> int:
    """ref saved as transformers does (experts per expert), every projection's weight then stored
    FP8 with its block scales, the config saying so; the router and the norms stay fp32 (as the
    hub's). Returns the weights stored FP8."""
    from safetensors.torch import load_file, save_file
    ref.save_pretrained(folder)
    f = next(folder.glob("*.safetensors"))
    sd, out, n = load_file(f), {}, 0
    for name, t in sd.items():
        if t.dim() == 2 and name.endswith(".weight") and ("self_attn." in name or "mlp." in name) \
                and not name.endswith("mlp.gate.weight"):
            out[name], out[name + hf_fp8.SCALE] = hf_fp8.quantize(t, BLOCK)
            n += 1
        else:
            out[name] = t
    save_file(out, str(f), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(BLOCK)}
    (folder / "config.json").write_text(json.dumps(cfg))
    return n


def test_an_fp8_checkpoint_loads_as_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM
    n = _write_fp8(hf_v3(), tmp_path / "hub")
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(2))
    hub = AutoModelForCausalLM.from_pretrained(tmp_path / "hub", dtype=torch.float32,
                                               experts_implementation="eager").eval()
    with torch.no_grad():
        want = hub(input_ids=tokens).logits
    tr = Trainer(spec_from_hf_dir(tmp_path / "hub"), exact_policy(batch=B, seq=T),
                 TrainerConfig(random_init=False, runtime=RuntimeConfig(device="cpu")))
    notes = load_hf(tr, tmp_path / "hub")
    assert notes == [f"{tmp_path / 'hub'}: {n} block-wise FP8 weights dequantized into the master (trained, and "
                     "saved by --save-hf, unquantized)"]
    with tr:
        assert rel_err(tr.logits(tokens), want) <= 1e-5


def test_a_damaged_fp8_checkpoint_is_refused_naming_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file
    _write_fp8(hf_v3(), tmp_path / "hub")
    f = next((tmp_path / "hub").glob("*.safetensors"))
    sd = load_file(f)
    name = "model.layers.0.self_attn.o_proj.weight"
    sd[name + hf_fp8.SCALE] = sd[name + hf_fp8.SCALE][:1].contiguous()  # a scale grid that does not cover it
    save_file(sd, str(f), metadata={"format": "pt"})
    tr = Trainer(spec_from_hf_dir(tmp_path / "hub"), exact_policy(batch=B, seq=T),
                 TrainerConfig(random_init=False, runtime=RuntimeConfig(device="cpu")))
    with pytest.raises(HorizonError, match=f"{name}_scale_inv' has shape .* blocks of \\[8, 8\\]"):
        load_hf(tr, tmp_path / "hub")


@pytest.mark.parametrize("q,match", [({"fmt": "e5m2"}, "fmt = \"e5m2\""),
                                     ({"activation_scheme": "static"}, "activation_scheme = \"static\""),
                                     ({"weight_block_size": [128]}, "weight_block_size = \\[128\\]")])
def test_other_fp8_settings_are_refused_by_name(q, match):
    from horizon_sim.specs.hf_export import to_hf_config_dict
    from tests.test_families import tiny
    d = to_hf_config_dict(tiny("deepseek_v3"))
    d["quantization_config"] = {"quant_method": "fp8", **q}
    with pytest.raises(HorizonError, match=match):
        spec_from_config_dict(d)
