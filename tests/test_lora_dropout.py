"""Issue 42, item 1: the adapters' dropout (Policy.lora_dropout, peft's lora_dropout). With each
peft LoRA layer's dropout replaced by the executor's mask for that block, micro-batch, step and
projection, the loss and every adapter gradient equal peft's within 1e-5: the masks sit where
peft's dropout sits and the backward sees the forward's. The masks are drawn again the same by a
recompute, a kept layer's graph and either micro-batch order; they differ between projections,
blocks, micro-batches and steps; they keep 1 - p of the elements, scaled by 1 / (1 - p); eval
runs without them."""
import pytest
import torch

from horizon_exec.model.adapters import AdapterDropout
from tests.hf_tiny import rel_err
from tests.test_lora_exec import _copy_adapters_into, _peft, _step_grads, _tokens, _trainer, assert_pefts_step

P = 0.3


class _Injected(torch.nn.Module):
    """A peft LoRA layer's dropout, replaced by the executor's mask for its projection."""

    def __init__(self, drop: AdapterDropout, module: str):
        super().__init__()
        self.drop, self.module = drop, module

    def forward(self, x):
        return self.drop(self.module, x)


def test_dropout_sits_where_pefts_does(tmp_path):
    tr, ref = _trainer(tmp_path, "llama", "all-linear", lora_dropout=P)
    model = _peft(ref, "all-linear", 4, 8.0)
    _copy_adapters_into(tr, model)
    n = 0
    for name, mod in model.named_modules():
        if hasattr(mod, "lora_dropout") and "default" in mod.lora_dropout:
            u = int(name.split(".layers.")[1].split(".")[0])
            module = name.split(f".layers.{u}.")[1]
            drop = AdapterDropout(P, (tr.runner.sr_base, 0, 0, u, 0))  # seed, step 0, rank 0, block, micro 0
            mod.lora_dropout["default"] = _Injected(drop, module)
            n += 1
    assert n == 7 * tr.model.n_layers
    tokens = _tokens()
    with tr:
        res, grads = _step_grads(tr, tokens)
    assert_pefts_step(res, grads, model, tokens)
    plain, _ = _trainer(tmp_path / "plain", "llama", "all-linear")
    with plain:
        r0, g0 = _step_grads(plain, tokens)
    assert r0.loss != pytest.approx(res.loss, rel=1e-4)  # the masks act


def test_masks_keep_one_minus_p_scaled_and_differ_by_key():
    x = torch.ones(1 << 20)
    d = AdapterDropout(P, (0, 3, 0, 1, 0))
    m = d.mask("self_attn.q_proj", x)
    kept = m[m != 0]
    assert abs(kept.numel() / x.numel() - (1 - P)) < 0.005
    assert torch.all(kept == torch.tensor(1 / (1 - P)))
    assert torch.equal(m, AdapterDropout(P, (0, 3, 0, 1, 0)).mask("self_attn.q_proj", x))  # drawn again the same
    for other in (d.mask("self_attn.k_proj", x), AdapterDropout(P, (0, 4, 0, 1, 0)).mask("self_attn.q_proj", x),
                  AdapterDropout(P, (0, 3, 0, 2, 0)).mask("self_attn.q_proj", x),
                  AdapterDropout(P, (0, 3, 0, 1, 1)).mask("self_attn.q_proj", x),
                  AdapterDropout(P, (0, 3, 1, 1, 0)).mask("self_attn.q_proj", x)):
        assert (other != m).float().mean() > 0.3


@pytest.mark.parametrize("base, other", [
    (dict(), dict(keep_last=-1)),                                         # a kept graph against a recompute
    (dict(), dict(act_ckpt_every=2, act_ckpt_on="device")),               # K-blocks
    (dict(batch=4, micro_batches=2), dict(batch=4, micro_batches=2, mb_order="layer")),
])
def test_recompute_kept_graphs_and_orders_draw_the_same_masks(tmp_path, base, other):
    tokens = torch.cat([_tokens(), _tokens()]) if base.get("batch") == 4 else _tokens()
    a, _ = _trainer(tmp_path / "a", "llama", "all-linear", lora_dropout=P, **base)
    b, _ = _trainer(tmp_path / "b", "llama", "all-linear", lora_dropout=P, **other)
    with a, b:
        r1, g1 = _step_grads(a, tokens)
        r2, g2 = _step_grads(b, tokens)
    assert r2.loss == pytest.approx(r1.loss, rel=1e-6)
    assert max(rel_err(g2[n], g) for n, g in g1.items()) <= 1e-5


def test_eval_runs_without_dropout(tmp_path):
    tr, _ = _trainer(tmp_path / "d", "llama", "all-linear", lora_dropout=P)
    plain, _ = _trainer(tmp_path / "p", "llama", "all-linear")
    tokens = _tokens()
    with tr, plain, torch.no_grad():
        assert torch.equal(tr.logits(tokens), plain.logits(tokens))
        assert tr.evaluate(tokens).loss == plain.evaluate(tokens).loss
