"""`horizon train --init-from SRC ... --save-hf OUT` end to end, for a model with each HF
feature Horizon honours: OUT loads in transformers with the same config as SRC (every field;
only the dtype is the save's), the tokenizer the model was trained with (chat template
included) encodes identically, and the logits are the trained weights'. Also: --model
config.json carries its config over, --tokenizer overrides the init folder's tokenizer in the
save, and model ids resolve in the local HF cache (never downloaded).
"""
import json
import os

import pytest
import torch

from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from tests.hf_tokenizers import CHATML, VOCAB, jsonl, tokenizer_folder
from tests.test_hf_features import BASE, CASES, _hf

CHAT = [{"messages": [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"},
                      {"role": "assistant", "content": f"It is {2 * i}."}]} for i in range(40)]
IGNORED_KEYS = ("dtype", "torch_dtype", "transformers_version", "_name_or_path")  # the save's own


def _source(tmp_path, name, bos=False):
    """An HF folder with model `name` of test_hf_features (vocab widened to the tokenizer's)
    and a BPE tokenizer with a ChatML template."""
    mt, over, _ = CASES[name]
    src = tmp_path / "src"
    _hf(mt, {**over, "vocab_size": VOCAB}).save_pretrained(src)
    tokenizer_folder(src, bos=bos)
    return src


def _train(*args) -> int:
    return main(["train", "--steps", "1", "--batch", "2", "--seq", "32", "--no-progress", "--eval-batches", "0",
                 *map(str, args)])


def _cfg(path) -> dict:
    d = json.loads((path / "config.json").read_text())
    return {k: v for k, v in d.items() if k not in IGNORED_KEYS}


@pytest.mark.parametrize("name", ["llama3-rope", "mistral-window", "qwen2-window", "tied-mqa", "qkv-bias"])
def test_saved_folder_loads_with_the_same_config_and_tokenizer(tmp_path, name):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    src = _source(tmp_path, name)
    out = tmp_path / "out"
    assert _train("--init-from", src, "--data", jsonl(tmp_path / "c.jsonl", CHAT), "--save-hf", out,
                  "--save-dtype", "fp32", "--lr", "1e-2") == 0
    assert _cfg(out) == _cfg(src)
    a, b = AutoConfig.from_pretrained(src).to_dict(), AutoConfig.from_pretrained(out).to_dict()
    assert {k: v for k, v in a.items() if k not in IGNORED_KEYS} == {k: v for k, v in b.items() if k not in IGNORED_KEYS}
    assert (out / "chat_template.jinja").read_text() == CHATML
    t_src, t_out = AutoTokenizer.from_pretrained(str(src)), AutoTokenizer.from_pretrained(str(out))
    for text in ("Return the number of items.", "hello <|im_end|> world"):
        assert t_src(text)["input_ids"] == t_out(text)["input_ids"]
    msgs = CHAT[0]["messages"]
    assert t_src.apply_chat_template(msgs, tokenize=False) == t_out.apply_chat_template(msgs, tokenize=False)
    before = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    after = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    toks = torch.randint(0, VOCAB, (1, 32))
    with torch.no_grad():
        assert not torch.equal(before(toks).logits, after(toks).logits)  # trained (lr 1e-2), and it loads
        after.generate(toks[:, :4], max_new_tokens=3, do_sample=False)


def test_tokenizer_flag_wins_over_the_init_folders(tmp_path):
    """--tokenizer with --init-from: the save carries the tokenizer the model was trained with."""
    from transformers import AutoTokenizer
    src = _source(tmp_path, "qkv-bias", bos=False)
    other = tokenizer_folder(tmp_path / "other", bos=True, eos="<|im_end|>")
    out = tmp_path / "out"
    assert _train("--init-from", src, "--tokenizer", other, "--save-hf", out) == 0
    t_out, t_other = AutoTokenizer.from_pretrained(str(out)), AutoTokenizer.from_pretrained(str(other))
    assert t_out("some text")["input_ids"] == t_other("some text")["input_ids"]
    assert t_out("some text")["input_ids"][0] == t_out.convert_tokens_to_ids("<s>")   # the BOS of 'other'
    assert json.loads((out / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"


def test_model_config_json_is_carried_over(tmp_path):
    """--model config.json (random init): the saved config is the source file's, with
    model_type, token ids, head_dim and max_position_embeddings kept."""
    cfg = {**BASE, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "head_dim": 32,
           "bos_token_id": 1, "eos_token_id": 2, "max_position_embeddings": 1234, "sliding_window": 16,
           "vocab_size": 256, "num_attention_heads": 4, "rope_theta": 1e4}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    assert _train("--model", tmp_path / "m" / "config.json", "--save-hf", out) == 0
    saved = _cfg(out)
    assert saved == {k: v for k, v in cfg.items() if k not in IGNORED_KEYS}


def _fake_cache(tmp_path, src, repo="acme/tiny-chat"):
    cache = tmp_path / "hub"
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    for f in src.iterdir():
        (snap / f.name).symlink_to(f)         # the hub cache links snapshot files to blobs
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0123abcd")
    return cache


def test_model_ids_resolve_in_the_local_cache(tmp_path, monkeypatch, capsys):
    src = _source(tmp_path, "tied-mqa")
    monkeypatch.setenv("HF_HUB_CACHE", str(_fake_cache(tmp_path, src)))
    assert _train("--init-from", "acme/tiny-chat", "--save-hf", tmp_path / "out") == 0
    assert "snapshots/0123abcd" in capsys.readouterr().out
    assert _train("--init-from", "acme/tiny-chat@0123abcd") == 0
    assert main(["plan", "--model", "acme/tiny-chat", "--gpu", "h100-pcie", "--ram", "64GiB", "--batch", "1",
                 "--seq", "64", "--no-advice"]) == 0
    assert _train("--init-from", "acme/missing") == 2
    assert "never downloads" in capsys.readouterr().err
    assert _train("--init-from", "acme/tiny-chat@v9") == 2
    assert "revision 'v9' is not in the local cache" in capsys.readouterr().err


def test_doc_masks_train_end_to_end(tmp_path, capsys):
    src = _source(tmp_path, "mistral-window")
    data = jsonl(tmp_path / "c.jsonl", CHAT)
    assert _train("--init-from", src, "--data", data, "--doc-masks", "--eval-batches", "1",
                  "--eval-fraction", "0.2") == 0
    assert "final loss" in capsys.readouterr().out


def test_resolver_refuses_a_snapshot_without_config(tmp_path, monkeypatch):
    from horizon_sim.specs.hf_cache import resolve_model_dir
    src = tmp_path / "empty"
    src.mkdir()
    (src / "README.md").write_text("x")
    monkeypatch.setenv("HF_HUB_CACHE", str(_fake_cache(tmp_path, src)))
    with pytest.raises(HorizonError, match="no config.json"):
        resolve_model_dir("acme/tiny-chat")
    assert os.environ["HF_HUB_CACHE"].endswith("hub")


# ---- issue 30, section 6 -----------------------------------------------------------------------

def test_model_config_overrides_the_init_folders_non_shape_fields(tmp_path, capsys):
    """The context-extension workflow: --init-from SRC --model cfg.json where cfg.json changes
    the rope scaling and max positions trains with cfg.json's and saves it; every tokenizer file
    of the folder (vocab.json, merges.txt, tokenizer.model, tekken.json...) goes along."""
    src = _source(tmp_path, "llama3-rope")
    extra = ("vocab.json", "merges.txt", "tokenizer.model", "tekken.json", "added_tokens.json")
    for name in extra:
        if not (src / name).exists():
            (src / name).write_text("{}\n")
    cfg = json.loads((src / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "factor": 16.0}
    cfg["max_position_embeddings"] = 8192
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    assert _train("--init-from", src, "--model", tmp_path / "m" / "config.json", "--save-hf", out,
                  "--data", jsonl(tmp_path / "c.jsonl", CHAT[:8])) == 0
    said = capsys.readouterr().out
    assert "its rope_scaling, max_position replace(s) --init-from" in said, said
    saved = json.loads((out / "config.json").read_text())
    assert saved["rope_parameters"]["factor"] == 16.0 and saved["max_position_embeddings"] == 8192
    for name in extra:
        assert (out / name).read_bytes() == (src / name).read_bytes(), name


def test_model_config_with_other_shapes_is_refused_by_field(tmp_path, capsys):
    src = _source(tmp_path, "llama3-rope")
    cfg = {**json.loads((src / "config.json").read_text()), "intermediate_size": 128}
    (tmp_path / "m.json").write_text(json.dumps(cfg))
    assert _train("--init-from", src, "--model", tmp_path / "m.json") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]   # (save_pretrained's progress bars before)
    assert "ffn_hidden=96 but --model" in err and "ffn_hidden=128" in err


def test_init_folder_without_a_tokenizer_needs_one(tmp_path, capsys):
    """Pretrained weights on UTF-8 byte ids would train, silently useless: --tokenizer is
    required (--tokenizer bytes says it on purpose; tests/test_outputs_permissions.py runs that)."""
    mt, over, _ = CASES["qkv-bias"]
    _hf(mt, over).save_pretrained(tmp_path / "src")
    assert _train("--init-from", tmp_path / "src") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "has no tokenizer.json" in err and "--tokenizer bytes" in err
