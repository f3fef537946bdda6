"""Tiny random transformers models for the HF tests (no downloads)."""
import torch

from horizon_exec.model.layout import host_layout
from horizon_sim.schedule import Holds, OpKind
from horizon_sim.specs.families import FAMILIES
from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.model import ModelSpec

V, T = 128, 16


def tiny_spec(kind) -> ModelSpec:
    return ModelSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab=V,
                     tied_embeddings=kind == "llama-tied", family=kind if kind in ("qwen2", "qwen3") else "llama",
                     norm_eps=1e-6,
                     rope_theta=10000.0)


def tiny_hf(kind, seed=0):
    """A random transformers model of `kind` (randomized_)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(seed)
    d = to_hf_config_dict(tiny_spec(kind))
    if kind == "mistral":
        d.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None)
        d.pop("attention_bias"), d.pop("mlp_bias")
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    return randomized_(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32), seed + 1)


def randomized_(model, seed: int):
    """model with its biases, norm weights, MoE routers and experts random too (transformers
    starts them at 0, 1, 0 and small: every bias alike, routers tied), DeepSeek-V3's router
    correction bias (a buffer, zero at init), and gpt-oss's attention sinks of order one (as trained ones are: at 0.02 a sink changes nothing a test would see), so
    every tensor carries information; returned in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith((".bias", "norm.weight")):
                p.copy_(1.0 * n.endswith("norm.weight") + 0.1 * torch.randn(p.shape, generator=gen))
            elif n.endswith(("mlp.gate.weight", "mlp.router.weight")) or "experts." in n:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif n.endswith("self_attn.sinks"):
                p.copy_(torch.randn(p.shape, generator=gen))
        for n, b in model.named_buffers():  # DeepSeek-V3's router correction bias: zeros would hide it
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=gen))
    return model.eval()


def rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def fp32_error(ref, tokens, device: str = "cpu") -> float:
    """The worst relative error of transformers' own fp32 gradients on `tokens`, computed on
    `device`, against the same model's in float64 on the CPU: how exact an fp32 step of this
    model can be there."""
    import copy
    _, g32 = hf_grads(copy.deepcopy(ref).to(device), tokens.to(device))
    _, g64 = hf_grads(copy.deepcopy(ref).double(), tokens)
    return max(rel_err(g.cpu(), g64[n]) for n, g in g32.items())


def executor_grads(tr, tokens, labels=None, docs=None):
    """Run one step; return (loss, {name: host gradient as the optimizer receives it})."""
    grads = {}

    def snapshot(op):  # CPU lane, just before each unit's optimizer op
        if op.kind == OpKind.OPTIMIZER:
            g = tr.buffers.find(Holds.HOST_GRAD, unit=op.unit)
            grads.update({n: v.clone() for n, v in host_layout(tr.model, op.unit).views(g).items()})

    tr.engine.hook = snapshot
    res = tr.step(tokens, labels, docs=docs)
    tr.engine.hook = None
    return res.loss, grads


def hf_grads(ref, tokens, shift_labels=None):
    ref.zero_grad()
    if shift_labels is None:
        out = ref(input_ids=tokens, labels=tokens)
    else:  # targets per position, like ours (transformers shifts `labels` itself otherwise)
        out = ref(input_ids=tokens, labels=shift_labels, shift_labels=shift_labels)
    out.loss.backward()
    g = {n: p.grad.clone() for n, p in ref.named_parameters()}
    if ref.config.tie_word_embeddings:  # one tensor, one gradient (both uses summed)
        g.pop("lm_head.weight", None)
    head = FAMILIES[ref.config.model_type].head_name  # the checkpoint's name (GPT-NeoX's module is lm_head, saved embed_out)
    if "lm_head.weight" in g and head != "lm_head.weight":
        g[head] = g.pop("lm_head.weight")
    return out.loss.item(), g


def assert_step_matches(tr, ref, tokens, ref_grads=hf_grads, tol: float = 1e-5) -> dict:
    """The executor's logits, one step's loss and every gradient equal transformers' on `tokens`
    (relative error <= tol); returns transformers' gradients."""
    import pytest
    with tr:
        with torch.no_grad():
            want = ref(input_ids=tokens).logits
        assert rel_err(tr.logits(tokens), want) <= tol
        loss, grads = executor_grads(tr, tokens)
    ref_loss, ref_g = ref_grads(ref, tokens)
    assert loss == pytest.approx(ref_loss, rel=tol)
    assert set(grads) == set(ref_g)
    errs = {n: rel_err(g, ref_g[n]) for n, g in grads.items()}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= tol, f"{worst}: {errs[worst]:.2e}"
    return ref_g


def saved_bytes(fn, own=()):
    """(fn()'s result, bytes of every storage autograd saves while fn runs, each counted once,
    but those of the tensors `own`: weights, inputs and tables that are buffers of their own)."""
    mine = {t.untyped_storage().data_ptr() for t in own}
    kept = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in mine:
            kept[s.data_ptr()] = s.nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(kept.values())
