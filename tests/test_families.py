"""Every registered model family (horizon_sim/specs/families), old and new, passes the same checks;
adding a family adds its registration and one tiny config to TINY here, nothing else:

- it is runnable by the executor (horizon_exec/model/families) or refused there by name;
- its transformers class builds exactly the tensors the planner counts (names and shapes, on the
  meta device), and its config.json reads back to the same spec;
- op by op, the executor's block is the description the planner prices: it reads exactly the
  described tensors, its GEMMs are the described projections (shapes; an MoE block's routed
  rows, which depend on the router, by their FLOPs), and what autograd saves is what
  schedule/work.py counts (fp32 and bf16);
- logits, one fp32 step's loss and every gradient equal transformers' on a random model saved
  with save_pretrained and read back (sliding and global layers at a sequence longer than the
  window, tied and untied heads, biases, an MoE router)."""
import math
from collections import Counter
from dataclasses import replace

import pytest
import torch

from horizon_exec.model.families import FORWARDS
from horizon_exec.model.block import DecoderBlock
from horizon_exec.model.layout import block_layout
from horizon_exec.model.rope import rope_tables
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import work
from horizon_sim.specs import block
from horizon_sim.specs.families import FAMILIES
from horizon_sim.specs.hf_config import spec_from_config_dict
from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.model import ModelSpec
from tests.hf_tiny import randomized_, saved_bytes

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
V, B, T = 96, 2, 16
_BASE = dict(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, vocab=V, norm_eps=1e-6, max_position=256)
TINY = {  # family: its tiny spec's fields (T = 16 tokens: longer than every window here)
    "llama": dict(ffn_hidden=96, mlp_bias=True, padding_idx=5),  # token 5 is in the batch
    "qwen2": dict(ffn_hidden=96, tied_embeddings=True, layer_windows=(6, 0)),      # sliding, then global
    "mistral": dict(ffn_hidden=96, layer_windows=(5, 5)),
    "qwen3": dict(ffn_hidden=96, head_dim=24),
    "qwen3_moe": dict(ffn_hidden=96, head_dim=24, n_experts=6, experts_per_token=2, expert_ffn_hidden=32,
                      norm_topk_prob=True),
    "mixtral": dict(ffn_hidden=48, n_experts=4, experts_per_token=2, expert_ffn_hidden=48, norm_topk_prob=True),
    "qwen2_moe": dict(ffn_hidden=96, n_experts=5, experts_per_token=3, expert_ffn_hidden=24,
                      shared_expert_ffn_hidden=40),
    "phi3": dict(ffn_hidden=96, n_kv_heads=1, layer_windows=(7, 7), padding_idx=5),  # fused q/k/v, gate/up
    "gpt2": dict(ffn_hidden=256, n_kv_heads=4, tied_embeddings=True, max_position=64),
    "gpt_neox": dict(ffn_hidden=256, n_kv_heads=4, rotary_fraction=0.25),
    "gemma2": dict(ffn_hidden=96, head_dim=32, tied_embeddings=True, padding_idx=0, layer_windows=(6, 0),
                   attn_softcap=50.0, logit_softcap=30.0, query_scale=24.0),
    "olmo2": dict(ffn_hidden=96, padding_idx=1),
    "gemma3_text": dict(ffn_hidden=96, head_dim=32, tied_embeddings=True, padding_idx=0, layer_windows=(6, 0),
                        query_scale=24.0, rope_theta=1e6, rope_local_theta=1e4),
    # sinks, biases, a window; the clamp's limit low enough that random weights cross it both ways
    "gpt_oss": dict(ffn_hidden=32, head_dim=24, n_experts=4, experts_per_token=2, expert_ffn_hidden=32,
                    norm_topk_prob=True, layer_windows=(6, 0), swiglu_alpha=1.702, swiglu_limit=0.5, padding_idx=5),
    # MLA (a q bottleneck in V3, a q_proj in V2), a dense first block, then an MoE one with grouped routing
    "deepseek_v3": dict(ffn_hidden=96, n_kv_heads=4, head_dim=24, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                        v_head_dim=12, first_dense_layers=1, n_experts=4, experts_per_token=2, expert_ffn_hidden=32,
                        shared_expert_ffn_hidden=32, norm_topk_prob=True, expert_groups=2, topk_groups=1,
                        routed_scaling=2.5),
    "deepseek_v2": dict(ffn_hidden=96, n_kv_heads=4, head_dim=24, kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=12,
                        first_dense_layers=1, n_experts=4, experts_per_token=2, expert_ffn_hidden=32,
                        shared_expert_ffn_hidden=64, expert_groups=2, topk_groups=1, routed_scaling=2.0),
}
RUNNABLE = [f for f in FAMILIES if f in FORWARDS]
WITH_HF = [f for f in FAMILIES if FAMILIES[f].hf is not None]


def tiny(family: str) -> ModelSpec:
    return ModelSpec(name=f"tiny-{family}", family=family, **{**_BASE, **TINY[family]})


def shapes(spec: ModelSpec) -> list[tuple[int, ModelSpec]]:
    """(the first block of each block shape, that shape's spec): block 0, and DeepSeek's first
    MoE block after its dense ones."""
    firsts = [0] + ([spec.first_dense_layers] if spec.first_dense_layers else [])
    return [(i, spec.block_spec(i)) for i in firsts]


def test_every_family_has_a_tiny_config_and_is_run_or_refused_by_name(monkeypatch):
    import horizon_exec.model.families as executor
    assert set(TINY) == set(FAMILIES)
    assert set(FORWARDS) <= set(FAMILIES)
    # every family runs today: a planner family the executor does not register is refused by name
    monkeypatch.setattr(executor, "FORWARDS", {f: run for f, run in FORWARDS.items() if f != "gpt2"})
    for f in set(FAMILIES) - set(executor.FORWARDS):
        with pytest.raises(HorizonError, match=f"family '{f}' .* is planned only; the executor runs llama"):
            DecoderBlock(tiny(f))


# ---- the planner's description against transformers' classes ---------------------------------
@pytest.mark.parametrize("family", WITH_HF)
def test_transformers_builds_exactly_the_described_tensors(family):
    from transformers import AutoConfig, AutoModelForCausalLM
    spec = tiny(family)
    d = to_hf_config_dict(spec)
    assert spec_from_config_dict(dict(d)) == spec  # the config.json reads back to the spec
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    for i, bs in shapes(spec):
        prefix = f"{FAMILIES[family].layer_prefix}{i}."
        layer = [(n.removeprefix(prefix), tuple(p.shape)) for n, p in model.named_parameters() if n.startswith(prefix)]
        assert layer == list(block.parameters(bs))
        state = set(model.state_dict())
        kept = [(n.removeprefix(prefix), tuple(b.shape)) for n, b in model.named_buffers()
                if n.startswith(prefix) and n in state]
        assert kept == list(block.buffers(bs))  # its persistent buffers too
    assert sum(p.numel() for p in model.parameters()) == spec.total_params


# ---- the executor's block against the description, op by op -----------------------------------
class _Reads(dict):
    """The block's weights, recording which it reads."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read = set()

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        return self[k] if k in self else default


def _gemms(run):
    """[(m, n, k)] of every aten GEMM `run()` dispatches (but attention's own: a soft-capped
    attention's products of q, k and v, which the planner prices as attention)."""
    from horizon_exec.device.dispatch_mode import UncompiledDispatchMode
    from horizon_exec.model.softcap_attention import phase
    seen = []

    class Mode(UncompiledDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func)
            if name.startswith(("aten.mm", "aten.addmm", "aten.bmm")) and not phase():
                a, b = (args[1], args[2]) if name.startswith("aten.addmm") else args[:2]
                assert a.dim() == 2, f"{name}: the planner prices 2-D GEMMs"
                seen.append((a.shape[0], b.shape[1], a.shape[1]))
            return out

    with Mode():
        run()
    return seen


def _mask_elements(spec, seq: int) -> int:
    """The explicit mask block 0 attends under (its window shorter than seq), 0 when causal."""
    return work.mask_bytes(B, seq, False) if work.masked_attention(spec, 0, seq, False) else 0


def _flops(gemms) -> float:
    return sum(2.0 * math.prod(g) for g in gemms)


def _planned(spec, backward: bool):
    gs = work.block_gemms(spec, B * T, backward)
    return [(g.m, g.n, g.k) for g in gs for _ in range(g.count)]


@pytest.mark.parametrize("family", RUNNABLE)
def test_the_executor_block_is_the_description_op_by_op(family):
    for _, spec in shapes(tiny(family)):
        _op_by_op(spec)


def _op_by_op(spec):
    lay = block_layout(spec)
    gen = torch.Generator().manual_seed(0)
    w = _Reads(lay.views(torch.randn(lay.numel, generator=gen) * 0.2))
    w.update({n: torch.randn(s, generator=gen) for n, s in block.buffers(spec)})
    x = torch.randn(B, T, spec.hidden, generator=gen)
    cos, sin = rope_tables(spec, T, torch.float32, "cpu")
    blk = DecoderBlock(spec)
    window = spec.window(0)

    def forward():
        with torch.no_grad():
            blk(w, x, cos, sin, window)

    fwd = _gemms(forward)
    assert w.read == {name for name, _ in (*block.parameters(spec), *block.buffers(spec))}  # exactly the described tensors

    def backward():  # the executor's recomputing backward: the forward with grad, then autograd.grad
        with torch.enable_grad():
            xg = x.detach().requires_grad_()
            wp = {k: v.detach().requires_grad_() for k, v in w.items() if k not in dict(block.buffers(spec))}
            y = blk({**w, **wp}, xg, cos, sin, window)
            torch.autograd.grad(y, [xg, *wp.values()], torch.ones_like(y))

    bwd = _gemms(backward)
    assert _flops(fwd) == _flops(_planned(spec, False))
    assert _flops(bwd) == _flops(_planned(spec, True))
    if not spec.is_moe:  # routed rows follow the router; a dense block's GEMMs are its shapes exactly
        assert Counter(tuple(sorted(g)) for g in fwd) == Counter(tuple(sorted(g)) for g in _planned(spec, False))
        assert Counter(tuple(sorted(g)) for g in bwd) == Counter(tuple(sorted(g)) for g in _planned(spec, True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family", RUNNABLE)
def test_what_autograd_saves_is_what_the_planner_counts(family, dtype):
    for _, spec in shapes(tiny(family)):
        _saved_is_counted(spec, dtype)


def _saved_is_counted(spec, dtype):
    """work.block_saved_bytes: every tensor the block's graph saves, but the weights (they stay in
    the slot), its input and the RoPE tables (buffers of their own), plus its output, which the
    next block saves as its input. In bf16 on the CPU an MoE block's experts pad their rows to a
    multiple of 16 (moe_block.py): what that adds is bounded by work.expert_padding_bytes."""
    lay = block_layout(spec)
    gen = torch.Generator().manual_seed(1)
    flat = (torch.randn(lay.numel, generator=gen) * 0.2).to(dtype)
    w = {k: v.requires_grad_() for k, v in lay.views(flat.detach()).items()}
    bufs = {n: torch.randn(s, generator=gen) for n, s in block.buffers(spec)}
    x = torch.randn(B, T, spec.hidden, generator=gen).to(dtype).requires_grad_()
    cos, sin = rope_tables(spec, T, dtype, "cpu")
    y, kept = saved_bytes(lambda: DecoderBlock(spec)({**w, **bufs}, x, cos, sin, spec.window(0)),
                          (flat, x, cos, sin, *bufs.values()))
    a = torch.empty((), dtype=dtype).element_size()
    mask = a * _mask_elements(spec, T)  # SDPA keeps the additive mask
    padding = kept + y.numel() * a - work.block_saved_bytes(spec, B, T, a) - mask
    assert 0 <= padding <= work.expert_padding_bytes(spec, a)
    if a == 4 or not spec.is_moe:
        assert padding == 0


# ---- the executor against transformers ---------------------------------------------------------
def _random_hf(spec, seed: int = 0):
    """A transformers model of spec's family with every tensor random (hf_tiny.randomized_)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(seed)
    d = to_hf_config_dict(spec)
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    kw = dict(experts_implementation="eager") if spec.is_moe else {}
    return randomized_(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **kw), seed + 1)


@pytest.mark.parametrize("family", RUNNABLE)
def test_one_step_equals_transformers_and_saves_what_transformers_loads(tmp_path, family):
    check_one_step(tmp_path, family, "cpu")


def check_one_step(tmp_path, family: str, device: str) -> None:
    """One fp32 step of family's tiny model on `device` equals transformers' on the CPU, and its
    --save-hf folder loads in transformers with the executor's logits (test_exec_cuda runs it
    on a GPU). On the CPU within 1e-5; on a GPU, whose kernels round and sum otherwise, within
    1e-5 or twice the error of transformers' own fp32 step on that GPU against float64
    (hf_tiny.fp32_error), the larger: as exact as an fp32 step of the model is there."""
    from transformers import AutoModelForCausalLM

    from horizon_exec.checkpoints.hf_checkpoint import load_hf, save_hf, spec_from_hf_dir
    from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.policy import exact_policy
    from tests.hf_tiny import assert_step_matches, fp32_error, rel_err
    ref = _random_hf(tiny(family))
    ref.save_pretrained(tmp_path / "hf")
    spec = spec_from_hf_dir(tmp_path / "hf")
    assert spec.family == family
    pol = exact_policy(batch=B, seq=T, act_ckpt_every=2, optimizer="after", grad_clip=0.0, loss_chunk_tokens=24)
    tr = Trainer(spec, pol, TrainerConfig(random_init=False, runtime=RuntimeConfig(device=device)))
    load_hf(tr, tmp_path / "hf")
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    tokens[:, ::5] = 5   # a padding token among them, where a spec has one (its row gets no gradient)
    tol = 1e-5 if device == "cpu" else max(1e-5, 2 * fp32_error(ref, tokens, device))
    assert_step_matches(tr, ref, tokens, tol=tol)
    with tr:
        save_hf(tr, tmp_path / "out")
        want = tr.logits(tokens)
    kw = dict(experts_implementation="eager") if spec.is_moe else {}
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32, **kw).eval()
    with torch.no_grad():
        assert rel_err(back(input_ids=tokens).logits, want) <= 1e-5


def _shaped(spec, **fields):
    """spec with fields replaced; a family of plain multi-head attention (GPT-NeoX: as many kv
    heads as query heads, hidden / heads wide) keeps its heads so."""
    try:
        return replace(spec, **fields)
    except HorizonError:
        return replace(spec, **{**fields, "n_kv_heads": fields.get("n_heads", spec.n_heads), "head_dim": 0})


def _as_wide_as_real_models(spec):
    """spec 128 wide with an MLP about 3x wider (an MoE block: its k experts together), as real
    models are: the points schedule/work.py finds a block's peak at are those of such shapes
    (a tiny MLP narrower than the model peaks elsewhere, in attention's output projection)."""
    if not spec.is_moe:
        return replace(spec, hidden=128, ffn_hidden=352)
    width = 3 * 128 // spec.experts_per_token
    dense = 352 if spec.first_dense_layers else spec.ffn_hidden  # DeepSeek's dense first blocks' MLP: as wide too
    return replace(spec, hidden=128, expert_ffn_hidden=width,
                   ffn_hidden=width if spec.ffn_hidden == spec.expert_ffn_hidden else dense)


def _few_tokens_wide_queries(spec):
    """16 tokens through a block whose queries are twice as wide as the model (Qwen3-32B's and
    Gemma's heads are): the weight gradients outweigh the activations, so the backward peaks at
    its end, in the q/k norms' or the first projection's backward."""
    spec = _as_wide_as_real_models(spec)
    return _shaped(spec, head_dim=2 * spec.hidden // spec.n_heads, layer_windows=())


def _long_and_narrow(spec):
    """512 tokens through a 64-wide block: attention's own temporaries (a soft-capped
    attention's chunks of scores, an explicit mask) outgrow the MLP's."""
    return _shaped(spec, hidden=64, head_dim=32, n_heads=2, n_kv_heads=1, max_position=512,  # GPT-2's positions
                   **({} if spec.is_moe else dict(ffn_hidden=128)))


SHAPES = {"wide": (_as_wide_as_real_models, 64), "few-tokens": (_few_tokens_wide_queries, 8),
          "long": (_long_and_narrow, 512)}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", RUNNABLE)
def test_the_planned_temporaries_are_the_measured_ones(family, dtype, shape):
    """schedule/work.py's temporary peaks of a block's forward and backward against the
    executor's measured ones in a streamed step: equal for a dense block; an MoE block's
    depend on where the router sends rows, and the planner's bound them."""
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.policy import Policy
    reshape, T = SHAPES[shape]
    spec = reshape(tiny(family))
    kw = dict(compute_dtype="fp32", grad_dtype="fp32", working_copy=False) if dtype == "fp32" else {}
    pol = Policy(batch=B, seq=T, act_ckpt_every=2, loss_chunk_tokens=1024, **kw)
    a = 4 if dtype == "fp32" else 2
    with Trainer(spec, pol) as tr:
        tl = tr.step(torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))).timeline
    for kind in ("forward", "backward"):
        for i, bs in shapes(spec):  # block 0 (its window is the spec's window(0)), DeepSeek's first MoE block
            layer = tl[(tl.kind == kind) & (tl.unit == i)]
            want = work.block_temp_peak_bytes(bs, B, T, a, kind == "backward", _mask_elements(spec, T), spec.window(i))
            if spec.is_moe:
                assert set(layer.temp_peak_bytes) and max(layer.temp_peak_bytes) <= want, (kind, i)
            else:
                assert set(layer.temp_peak_bytes) == {want}, kind
    head = set(tl[tl.kind == "head"].temp_peak_bytes)
    assert head == {work.head_temp_peak_bytes(spec, B * T, 1024, a)}


@pytest.mark.parametrize("family", [f for f in RUNNABLE if not FAMILIES[f].is_moe])
def test_the_planned_elementwise_bytes_are_a_kernel_by_kernel_count(family):
    """work.block_elementwise_bytes of a forward and a backward against what the executor's
    non-GEMM kernels read plus write, counted aten call by aten call (bf16), to within the row
    statistics the formula rounds. (An MoE block's routing kernels are estimates,
    schedule/kernel_bytes.py.)"""
    from horizon_exec.measure.calibrate import KernelTimer, block_pass
    m = replace(_as_wide_as_real_models(tiny(family)), hidden=256, ffn_hidden=688, n_layers=1, layer_windows=())
    fn = block_pass(m, B, 128, torch.bfloat16, "cpu")
    fn()  # the first call also lays out weights for the GEMM library
    timer = KernelTimer()
    with timer:
        fn()
    want = work.block_elementwise_bytes(m, B * 128, 128, 2, False) + work.block_elementwise_bytes(m, B * 128, 128, 2, True)
    assert want == pytest.approx(timer.bytes, rel=2e-3)


@pytest.mark.parametrize("family", [f for f in RUNNABLE if tiny(f).rope_table_count > 1])
def test_document_masks_gather_every_rope_table(family):
    """A family with a RoPE base per layer type (Gemma 3) under document masks: with each
    sequence one document, the positions gathered from each table give the step and the logits
    of the run without masks; with two documents per row, the second restarts its positions."""
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.policy import Policy
    spec = tiny(family)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(5))
    out = {}
    for masks in (False, True):
        with Trainer(spec, Policy(batch=B, seq=T, doc_masks=masks, compute_dtype="fp32", grad_dtype="fp32",
                                  working_copy=False)) as tr:
            docs = torch.zeros(B, T, dtype=torch.int64) if masks else None
            out[masks] = (tr.logits(tokens, docs), tr.step(tokens, docs=docs).loss)
            if masks:
                split = torch.zeros(B, T, dtype=torch.int64)
                split[:, T // 2:] = 1
                second = tr.logits(tokens, split)[:, T // 2:]
                alone = tr.logits(tokens[:, T // 2:].repeat(1, 2))[:, :T // 2]
    assert torch.allclose(out[True][0], out[False][0], atol=1e-5) and out[True][1] == pytest.approx(out[False][1])
    assert torch.allclose(second, alone, atol=1e-5)  # the second document sees positions 0.. and itself only
