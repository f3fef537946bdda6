"""A multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration, model_type gemma3): its
language model is planned and trained (its text_config), exactly as transformers' multimodal model
computes text; --save-hf writes it back inside the multimodal checkpoint under the stored names,
with the vision tower and projector copied unchanged in their own dtype, and transformers loads
the folder with the trained logits. Through the CLI the run says what it trains and carries."""
import json

import pytest
import torch

from horizon_sim.errors import HorizonError
from horizon_sim.specs.hf_config import spec_from_config_dict
from horizon_sim.specs.hf_export import to_hf_config_dict
from tests.test_families import B, T, V, tiny

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)


def _multimodal(folder, seed: int = 0, vision_dtype=torch.bfloat16, vocab: int = V):
    """A random tiny Gemma3ForConditionalGeneration saved to folder (its vision tower in
    vision_dtype, as the published checkpoints hold it in bf16); the model in fp32."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from tests.hf_tiny import randomized_
    torch.manual_seed(seed)
    text = {k: v for k, v in to_hf_config_dict(tiny("gemma3_text")).items() if k not in ("architectures", "_name_or_path")}
    cfg = Gemma3Config(text_config={**text, "vocab_size": vocab}, vision_config=VISION, mm_tokens_per_image=4)
    model = randomized_(Gemma3ForConditionalGeneration(cfg), seed + 1)
    with torch.no_grad():  # transformers starts the projector at zero: random, so carrying it is checked
        for p in model.model.multi_modal_projector.parameters():
            p.normal_(generator=torch.Generator().manual_seed(seed))
    model.model.vision_tower.to(vision_dtype)
    model.save_pretrained(folder)
    return model.float()


def _language_model_grads(ref, tokens):
    """transformers' loss and the language model's gradients, by the trainer's names."""
    ref.zero_grad()
    out = ref(input_ids=tokens, labels=tokens, token_type_ids=torch.zeros_like(tokens))
    out.loss.backward()
    g = {"model." + n.removeprefix("model.language_model."): p.grad.clone() for n, p in ref.named_parameters()
         if n.startswith("model.language_model.")}
    return out.loss.item(), g


def test_the_language_model_trains_as_transformers_and_is_saved_back_with_the_vision_tower(tmp_path):
    from safetensors import safe_open
    from transformers import Gemma3ForConditionalGeneration

    from horizon_exec.checkpoints.hf_checkpoint import base_config, load_hf, save_hf, spec_from_hf_dir
    from horizon_exec.checkpoints.hf_wrapped import wrapped
    from horizon_exec.runtime.config import TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.policy import exact_policy
    from tests.hf_tiny import assert_step_matches, rel_err
    ref = _multimodal(tmp_path / "mm")
    spec = spec_from_hf_dir(tmp_path / "mm")
    assert spec.family == "gemma3_text" and spec.tied_embeddings
    wrap = wrapped(tmp_path / "mm")
    assert wrap.prefix == "language_model.model." and wrap.carried_params == sum(
        p.numel() for n, p in ref.named_parameters() if not n.startswith("model.language_model."))
    tr = Trainer(spec, exact_policy(batch=B, seq=T, optimizer="after", grad_clip=0.0), TrainerConfig(random_init=False))
    load_hf(tr, tmp_path / "mm")
    tokens = torch.randint(1, V, (B, T), generator=torch.Generator().manual_seed(3))
    assert_step_matches(tr, ref, tokens, ref_grads=_language_model_grads)
    with tr:
        save_hf(tr, tmp_path / "out", "fp32", base_config=base_config(tmp_path / "mm"), carry=wrap)
        want = tr.logits(tokens)
    back = Gemma3ForConditionalGeneration.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    with torch.no_grad():
        assert rel_err(back(input_ids=tokens).logits, want) <= 1e-5
    with safe_open(str(tmp_path / "mm" / "model.safetensors"), "pt") as a, \
            safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as b:
        assert set(a.keys()) == set(b.keys())  # the stored names, nothing lost or added
        for c in wrap.carried:  # carried bit for bit, in their own dtype (the vision tower's bf16)
            assert b.get_tensor(c.name).dtype == a.get_tensor(c.name).dtype == c.dtype
            assert torch.equal(a.get_tensor(c.name), b.get_tensor(c.name))
    assert {c.dtype for c in wrap.carried if c.name.startswith("vision_tower.")} == {torch.bfloat16}
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["model_type"] == "gemma3" and "vision_config" in saved


def test_a_multimodal_config_plans_its_language_model_and_refuses_a_missing_text_config(tmp_path):
    from transformers import Gemma3Config
    text = to_hf_config_dict(tiny("gemma3_text"))
    cfg = Gemma3Config(text_config={k: v for k, v in text.items() if k != "architectures"}, vision_config=VISION).to_dict()
    assert spec_from_config_dict(cfg).layer_params == tiny("gemma3_text").layer_params
    with pytest.raises(HorizonError, match=r"model_type 'gemma3' needs a text_config"):
        spec_from_config_dict({"model_type": "gemma3", "vision_config": VISION})


def test_the_cli_says_what_it_trains_and_carries_and_refuses_a_model_override(tmp_path, capsys):
    from horizon_sim.cli.main import main as horizon
    _multimodal(tmp_path / "mm", vision_dtype=torch.float32, vocab=256)  # the byte tokenizer's ids
    args = ["train", "--init-from", str(tmp_path / "mm"), "--tokenizer", "bytes", "--steps", "1", "--batch", "2",
            "--seq", "16", "--no-search", "--no-progress", "--eval-batches", "0", "--save-hf", str(tmp_path / "out"),
            "--save-dtype", "bf16"]
    assert horizon(args) == 0
    out = capsys.readouterr().out
    assert "a multimodal gemma3 checkpoint: its language model" in out and "--save-hf copies them unchanged" in out
    from safetensors import safe_open
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        dtypes = {n: f.get_slice(n).get_dtype() for n in f.keys()}
    assert {d for n, d in dtypes.items() if n.startswith("language_model.")} == {"BF16"}
    assert {d for n, d in dtypes.items() if not n.startswith("language_model.")} == {"F32"}  # carried as they were
    assert horizon(["train", "--init-from", str(tmp_path / "mm"), "--model", "gemma-3-1b", "--steps", "1"]) == 2
    assert "is a multimodal gemma3 checkpoint" in capsys.readouterr().err
