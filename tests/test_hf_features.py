"""HF model features the executor honours, checked against transformers itself on tiny random
models saved with save_pretrained and read back through config.json + safetensors:

- RoPE scaling (llama3, linear, dynamic below and past max_position_embeddings, yarn with a
  derived and a given attention factor): the cos/sin tables equal transformers' bit for bit,
  and logits, loss and every gradient of one fp32 step agree at a T where the scaling acts;
- sliding windows shorter than the sequence (Mistral on every layer, Qwen2 on the layers at
  and past max_window_layers);
- tied embeddings with one kv head (MQA), and Qwen2's q/k/v biases, at T = 64;
- Qwen3's per-head q/k norms, with its default head_dim (128, not hidden // heads) and with a
  sliding window on some layers;
- document masks: packed documents with positions restarting at each one equal transformers
  given position_ids with resets (its packed-sequence mask).
Each case runs the executor's schedule (forward, recompute, backward with K = 2, 2 micro-
batches), so the features are checked in the streamed step, not in a side path.
"""
import pytest
import torch

from horizon_exec.checkpoints.hf_checkpoint import load_hf, spec_from_hf_dir
from horizon_exec.model.rope import rope_tables
from horizon_exec.runtime.config import TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import assert_step_matches, executor_grads, rel_err

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
V, B = 96, 4

BASE = dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=V, rms_norm_eps=1e-6, tie_word_embeddings=False,
            hidden_act="silu", max_position_embeddings=4096)

CASES = {
    # name: (model_type, config overrides, T)
    "llama3-rope": ("llama", dict(rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                                       low_freq_factor=1.0, high_freq_factor=4.0,
                                                       original_max_position_embeddings=16)), 64),
    "linear-rope": ("llama", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0)), 32),
    "dynamic-rope": ("llama", dict(max_position_embeddings=24,
                                   rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)), 64),
    "yarn-rope": ("qwen2", dict(max_position_embeddings=128,
                                rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                     original_max_position_embeddings=32)), 64),
    "mistral-window": ("mistral", dict(sliding_window=8, head_dim=16), 32),
    "qwen2-window": ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1), 32),
    "tied-mqa": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True), 64),
    "qkv-bias": ("qwen2", dict(), 64),
    # Qwen3: per-head q/k norms; head_dim absent = Qwen3Config's 128 (q is 512 wide on a 64-wide model)
    "qwen3-qk-norm": ("qwen3", dict(), 64),
    "qwen3-window": ("qwen3", dict(head_dim=16, use_sliding_window=True, sliding_window=8, max_window_layers=1), 32),
}


def _hf(model_type, overrides, seed=0):
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(model_type, **{**BASE, **overrides})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # biases and norm weights random too, so every tensor carries information
        for n, p in model.named_parameters():
            if n.endswith((".bias", "norm.weight")):
                p.copy_(1.0 * n.endswith("norm.weight") + 0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


def _pair(tmp_path, name, doc_masks=False):
    mt, over, T = CASES[name]
    ref = _hf(mt, over)
    ref.save_pretrained(tmp_path / "hf")
    spec = spec_from_hf_dir(tmp_path / "hf")
    pol = exact_policy(batch=B, seq=T, micro_batches=2, act_ckpt_every=2, optimizer="after", grad_clip=0.0,
                       loss_chunk_tokens=40, doc_masks=doc_masks)
    tr = Trainer(spec, pol, TrainerConfig(random_init=False))
    load_hf(tr, tmp_path / "hf")
    return tr, ref, T


def _ref_grads(ref, tokens, **kw):
    ref.zero_grad()
    out = ref(input_ids=tokens, labels=tokens, **kw)
    out.loss.backward()
    g = {n: p.grad.clone() for n, p in ref.named_parameters()}
    if ref.config.tie_word_embeddings:
        g.pop("lm_head.weight", None)
    return out.loss.item(), g


@pytest.mark.parametrize("name", list(CASES))
def test_logits_and_one_training_step_match_transformers(tmp_path, name):
    tr, ref, T = _pair(tmp_path, name)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    assert_step_matches(tr, ref, tokens, _ref_grads)


@pytest.mark.parametrize("name", ["llama3-rope", "linear-rope", "dynamic-rope", "yarn-rope"])
def test_the_feature_matters_at_this_length(tmp_path, name):
    """The same weights with plain RoPE (or full attention) give other logits: the tests above
    would fail if the feature were dropped."""
    import dataclasses
    tr, ref, T = _pair(tmp_path, name)
    tokens = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(4))
    with tr:
        with torch.no_grad():
            want = ref(input_ids=tokens).logits
        plain = dataclasses.replace(tr.model, rope_scaling=None)
        cos, sin = rope_tables(plain, T, torch.float32, "cpu")
        tr.runner.attn.cos[0].copy_(cos)
        tr.runner.attn.sin[0].copy_(sin)
        assert rel_err(tr.logits(tokens), want) > 1e-3


@pytest.mark.parametrize("name", ["mistral-window", "qwen2-window"])
def test_window_matters_at_this_length(tmp_path, name):
    tr, ref, T = _pair(tmp_path, name)
    assert any(0 < w < T for w in tr.model.layer_windows)
    if name == "qwen2-window":  # max_window_layers=1: layer 0 full, layers 1 and 2 windowed
        assert tr.model.layer_windows == (0, 8, 8)
    tokens = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(4))
    with tr:
        with torch.no_grad():
            want = ref(input_ids=tokens).logits
        object.__setattr__(tr.model, "layer_windows", ())   # the same weights, full attention
        assert rel_err(tr.logits(tokens), want) > 1e-3


def test_qk_norms_matter(tmp_path):
    """Without its q/k norms the same Qwen3 weights give other logits, and the spec read from
    the folder has them (and transformers' default head_dim)."""
    tr, ref, T = _pair(tmp_path, "qwen3-qk-norm")
    assert tr.model.family == "qwen3" and tr.model.hd == 128
    tokens = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(4))
    with tr:
        with torch.no_grad():
            want = ref(input_ids=tokens).logits
        assert rel_err(tr.logits(tokens), want) <= 1e-5
        from horizon_exec.model.families import llama
        tr.runner.block(0).forward = llama.forward   # the same weights run as Llama's block: no q/k norms
        assert rel_err(tr.logits(tokens), want) > 1e-3


@pytest.mark.parametrize("name,seq", [("llama3-rope", 64), ("dynamic-rope", 16), ("dynamic-rope", 64),
                                      ("yarn-rope", 64), ("linear-rope", 32)])
def test_rope_tables_equal_transformers_bit_for_bit(tmp_path, name, seq):
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    mt, over, _ = CASES[name]
    cfg = AutoConfig.for_model(mt, **{**BASE, **over})
    ref = _hf(mt, over)
    ref.save_pretrained(tmp_path / "hf")
    spec = spec_from_hf_dir(tmp_path / "hf")
    rot = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, seq, 4)
    want_cos, want_sin = rot(x, torch.arange(seq)[None])
    cos, sin = rope_tables(spec, seq, torch.float32, "cpu")
    assert torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0])


def test_yarn_attention_factor_and_null_factor(tmp_path):
    """yarn with a given attention_factor, and with factor null (derived from the context
    lengths, as transformers does)."""
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    for rp in (dict(rope_type="yarn", rope_theta=500.0, factor=3.0, attention_factor=0.8,
                    original_max_position_embeddings=16, beta_fast=16, beta_slow=2),
               dict(rope_type="yarn", rope_theta=10000.0, factor=None, original_max_position_embeddings=32)):
        cfg = AutoConfig.for_model("llama", **{**BASE, "max_position_embeddings": 128, "rope_parameters": rp})
        cfg.save_pretrained(tmp_path)
        spec = spec_from_hf_dir(tmp_path)
        want_cos, want_sin = LlamaRotaryEmbedding(cfg)(torch.zeros(1, 48, 4), torch.arange(48)[None])
        cos, sin = rope_tables(spec, 48, torch.float32, "cpu")
        assert torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0]), rp


@pytest.mark.parametrize("name", ["llama3-rope", "mistral-window"])
def test_document_masks_match_transformers_packed_sequences(tmp_path, name):
    """Rows hold several documents; the executor gets each token's document, transformers the
    position_ids that restart at each document (it derives the same block-diagonal mask when
    no cache is in use)."""
    tr, ref, T = _pair(tmp_path, name, doc_masks=True)
    g = torch.Generator().manual_seed(9)
    tokens = torch.randint(0, V, (B, T), generator=g)
    docs = torch.zeros(B, T, dtype=torch.int64)
    for b, cuts in enumerate(([5, 20], [], [T // 2], [1, 2, 3, T - 1])):
        for c in cuts:
            docs[b, c:] += 1
    from horizon_exec.runtime.positions import doc_positions
    pos = doc_positions(docs)
    labels = tokens.clone()
    labels[:, 1:][docs[:, 1:] != docs[:, :-1]] = -100   # no target across a document boundary
    shift = torch.full_like(labels, -100)
    shift[:, :-1] = labels[:, 1:]
    with tr:
        with torch.no_grad():
            want = ref(input_ids=tokens, position_ids=pos, use_cache=False).logits
        assert rel_err(tr.logits(tokens, docs=docs), want) <= 1e-5
        with torch.no_grad():
            whole = ref(input_ids=tokens).logits
        assert rel_err(whole, want) > 1e-3            # the documents do change the answer
        loss, grads = executor_grads(tr, tokens, shift, docs)
    ref.zero_grad()
    out = ref(input_ids=tokens, position_ids=pos, labels=shift, shift_labels=shift, use_cache=False)
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    for n, p in ref.named_parameters():
        if n in grads:
            assert rel_err(grads[n], p.grad) <= 1e-5, n


def test_dynamic_rope_past_its_context_with_document_masks_is_refused(tmp_path):
    from horizon_sim.errors import HorizonError
    mt, over, _ = CASES["dynamic-rope"]        # max_position_embeddings 24
    _hf(mt, over).save_pretrained(tmp_path / "hf")
    spec = spec_from_hf_dir(tmp_path / "hf")
    with pytest.raises(HorizonError, match="dynamic RoPE past max_position_embeddings"):
        Trainer(spec, exact_policy(batch=2, seq=32, doc_masks=True), TrainerConfig(random_init=False))
    Trainer(spec, exact_policy(batch=2, seq=24, doc_masks=True), TrainerConfig(random_init=False)).close()
