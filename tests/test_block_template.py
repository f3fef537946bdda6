"""The decoder block is described once (horizon_sim/specs/block.py): the executor's block reads
exactly the tensors the description lists, in its shapes, and runs its projections in the
description's order; the planner's GEMMs are the same projections."""
import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import work
from horizon_sim.specs import block
from horizon_sim.specs.model import ModelSpec

torch = pytest.importorskip("torch")
from horizon_exec.model.layers import DecoderBlock  # noqa: E402
from horizon_exec.model.layout import block_layout  # noqa: E402

SHAPES = [dict(), dict(qkv_bias=True), dict(mlp_bias=True), dict(head_dim=32, n_kv_heads=1)]


class Recording(dict):
    """The block's weights, recording the order in which the block reads them."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read = []

    def __getitem__(self, k):
        self.read.append(k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        if k in self:
            return self[k]
        return default


@pytest.mark.parametrize("kw", SHAPES, ids=str)
def test_the_executor_reads_exactly_the_described_tensors_in_order(kw):
    m = ModelSpec(n_layers=1, hidden=64, n_heads=4, n_kv_heads=kw.pop("n_kv_heads", 2), ffn_hidden=96,
                  vocab=100, **kw)
    lay = block_layout(m)
    assert [(e.name, e.shape) for e in lay.entries] == list(block.parameters(m))
    assert lay.numel == m.layer_params
    w = Recording(lay.views(torch.randn(lay.numel) * 0.02))
    x = torch.randn(1, 8, m.hidden)
    cos, sin = torch.ones(8, m.hd), torch.zeros(8, m.hd)
    DecoderBlock(m)(w, x, cos, sin)
    assert sorted(set(w.read)) == sorted(name for name, _ in block.parameters(m))
    weights = [k[:-len(".weight")] for k in w.read if k.endswith("_proj.weight")]
    assert weights == [p.module for p in block.projections(m)]  # the order the planner's GEMMs assume
    assert work.linears(m) == [(p.in_features, p.out_features) for p in block.projections(m)]


@pytest.mark.parametrize("kw", [dict(ffn_type="plain"), dict(norm="layernorm")], ids=str)
def test_the_executor_refuses_a_block_it_does_not_run_by_name(kw):
    m = ModelSpec(n_layers=1, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab=100, **kw)
    with pytest.raises(HorizonError, match="the executor's block template is a gated"):
        DecoderBlock(m)
