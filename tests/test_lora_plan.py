"""Issue 42, adapters planned: the Schedule of a LoRA step on a frozen base (no gradient offload,
no host optimizer, one device update), its host bytes (the base in the compute dtype), the
adapters' parameter count against peft's, the work the planner prices for the adapters' kernels
against a kernel-by-kernel count of the executor's block, and the flags' errors."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import OpKind, build_schedule, work
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import Policy
from tests.hf_tiny import saved_bytes
from tests.test_families import tiny

LORA = Policy(batch=2, seq=256, lora_rank=8, optimizer="after")


def test_the_adapter_step_has_no_host_update():
    m = model_preset("tiny")
    s = build_schedule(m, LORA)
    kinds = {op.kind for op in s.ops}
    assert not kinds & {OpKind.OFFLOAD_GRADS, OpKind.OPTIMIZER, OpKind.EMBED_BWD, OpKind.OFFLOAD_INPUT_GRAD,
                        OpKind.GRAD_NORM}
    update = [op for op in s.ops if op.kind == OpKind.ADAPTER_UPDATE]
    assert len(update) == 1 and update[0].params == work.adapter_params(m, LORA) * m.n_layers
    last_backward = max(op.id for op in s.ops if op.kind == OpKind.BACKWARD)
    assert update[0].lane == s.ops[last_backward].lane and update[0].id > last_backward  # after it, in lane order
    host = sum(b.bytes for b in s.buffers.values() if b.space.value == "host" and b.static)
    assert host == pytest.approx(2 * m.total_params, rel=1e-3)  # the base in bf16, nothing else static


def test_host_ram_falls_to_about_two_bytes_a_parameter():
    m, hw = model_preset("llama-3.1-8b"), make_hardware("h100-sxm", "256GB")
    full = simulate(build_schedule(m, Policy()), hw)
    lora = simulate(build_schedule(m, replace(LORA, batch=4, seq=2048)), hw)
    store = lambda r: sum(v for k, v in r.host.by_role.items() if k not in ("runtime", "act_checkpoints", "staging"))  # noqa: E731
    assert store(lora) / m.total_params == pytest.approx(2.0, rel=1e-3)
    assert store(full) / m.total_params > 11


@pytest.mark.parametrize("targets,names", [
    ("all-linear", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    ("q_proj,v_proj", ["q_proj", "v_proj"])])
def test_the_adapter_count_is_pefts(targets, names):
    """Against peft on transformers' meta-device Llama-3.1-8B: 41,943,040 at rank 16 on
    all-linear (the figure peft prints for that model)."""
    from accelerate import init_empty_weights
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from horizon_sim.specs.hf_export import to_hf_config_dict
    m = model_preset("llama-3.1-8b")
    d = to_hf_config_dict(m)
    with init_empty_weights():
        ref = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d))
    tm = "all-linear" if targets == "all-linear" else names
    peft_model = get_peft_model(ref, LoraConfig(r=16, target_modules=tm))
    want = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    p = Policy(lora_rank=16, lora_targets=targets, optimizer="after")
    assert work.adapter_params(m, p) * m.n_layers == want
    assert {q.module.rsplit(".", 1)[-1] for q in work.adapted(m, p)} == set(names)
    if targets == "all-linear":
        assert want == 41_943_040


def test_one_layers_linear_targets_count_as_pefts_layers_to_transform():
    """Linear modules of some layers ('3.self_attn.q_proj', peft's way of naming one layer's):
    the planner's count over the layers equals peft's on Llama-3.1-8B with target_modules
    q_proj, v_proj and layers_to_transform [3, 30]; the other layers have none."""
    from accelerate import init_empty_weights
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from horizon_sim.specs.hf_export import to_hf_config_dict
    m = model_preset("llama-3.1-8b")
    d = to_hf_config_dict(m)
    with init_empty_weights():
        ref = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d))
    peft_model = get_peft_model(ref, LoraConfig(r=16, target_modules=["q_proj", "v_proj"], layers_to_transform=[3, 30]))
    want = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    p = Policy(lora_rank=16, optimizer="after",
               lora_targets="3.self_attn.q_proj,3.self_attn.v_proj,model.layers.30.self_attn.q_proj,30.self_attn.v_proj")
    per = [work.adapter_params(m, work.layer_policy(m, p, u)) for u in range(m.n_layers)]
    assert sum(per) == want and [u for u in range(m.n_layers) if per[u]] == [3, 30]


def test_a_shared_expert_is_a_linear_target():
    """'mlp.shared_experts.gate_proj' names DeepSeek's shared expert, a Linear module (of one
    layer with its index), not a routed-expert stack; 'experts.down_proj' the routed stack."""
    p = Policy(lora_rank=4, optimizer="after", lora_targets="1.mlp.shared_experts.gate_proj,experts.down_proj")
    assert p.target_names() == (("1.mlp.shared_experts.gate_proj",), ("experts.down_proj",))
    m = model_preset("deepseek-v2-lite")
    work.check_adapter_targets(m, p)
    assert {q.module for q in work.adapted(m.block_spec(1), work.layer_policy(m, p, 1))} == \
        {"mlp.shared_experts.gate_proj", "mlp.experts.down_proj"}
    assert [q.module for q in work.adapted(m.block_spec(2), work.layer_policy(m, p, 2))] == ["mlp.experts.down_proj"]


COOKBOOK = [f"{u}.mlp.experts.{n}" for u in (7, 15, 23) for n in ("gate_up_proj", "down_proj")]
"""The expert stacks gpt-oss fine-tuning recipes adapt (peft target_parameters of three layers)."""


@pytest.mark.parametrize("name,stacks", [("gpt-oss-120b", COOKBOOK),
                                         ("gpt-oss-20b", ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])])
def test_the_expert_adapter_count_is_pefts(name, stacks):
    """gpt-oss at rank 16 with peft's all-linear and expert stacks as target_parameters (an
    adapter per expert, E r (in + out) a stack; of three layers, or of every one: 20b, where
    peft wraps them 7x faster than on 120b): the planner's count equals peft's on transformers'
    meta-device model, and the plan prices each stack's adapters per expert, over its routed
    rows, in the layers that have them."""
    from accelerate import init_empty_weights
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from horizon_sim.specs.hf_export import to_hf_config_dict
    m = model_preset(name)
    d = to_hf_config_dict(m)
    with init_empty_weights():
        ref = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d))
    peft_model = get_peft_model(ref, LoraConfig(r=16, target_modules="all-linear", target_parameters=stacks))
    want = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    p = Policy(lora_rank=16, lora_targets=",".join(["all-linear", *stacks]), optimizer="after")
    per = [work.layer_policy(m, p, u) for u in range(m.n_layers)]
    assert sum(work.adapter_params(m, q) for q in per) == want
    tokens, k, E = 4096, m.experts_per_token, m.n_experts
    plain = replace(p, lora_targets="all-linear")
    flops = lambda q: work.gemm_flops(work.adapter_gemms(m, q, tokens, False))  # noqa: E731
    runs = lambda q: sum(g.count for g in work.adapter_gemms(m, q, tokens, False))  # noqa: E731
    layers = [u for u in range(m.n_layers) if per[u] != per[0] or len(stacks) == 2]  # those whose stacks adapt
    assert len(layers) == (3 if len(stacks) == 6 else m.n_layers)
    for u in range(m.n_layers):
        extra = flops(per[u]) - flops(plain)
        on = u in layers
        assert extra == pytest.approx(on * 2 * tokens * k * 16 * ((m.hidden + 2 * m.expert_ffn_hidden) +
                                                                  (m.expert_ffn_hidden + m.hidden)))
        assert runs(per[u]) - runs(plain) == on * 2 * 2 * E  # two GEMMs per expert of each stack, over its own rows


def test_adapters_over_nodes_sum_their_gradients_over_the_nodes_and_keep_the_base_whole():
    """2 nodes of 2 devices: the node's devices' sums (fabric), then the nodes' (net: a ring over
    2 nodes sends 2 (M - 1) / M of the adapters' fp32 bytes), before the one update; each node
    holds the frozen base whole, as one node does."""
    from horizon_sim.schedule.op import Layout
    m = model_preset("tiny")
    p = Policy.from_choices(batch=2, seq=64, lora_rank=4)
    one, two = build_schedule(m, p), build_schedule(m, p, Layout(2, 2))
    n = sum(work.adapter_params(m, p) for _ in range(m.n_layers))
    kinds = [o.kind for o in two.ops]
    fabric, net = (next(o for o in two.ops if o.kind == k) for k in (OpKind.ADAPTER_ALL_REDUCE,
                                                                     OpKind.ADAPTER_NET_ALL_REDUCE))
    assert kinds.index(OpKind.ADAPTER_ALL_REDUCE) < kinds.index(OpKind.ADAPTER_NET_ALL_REDUCE) < kinds.index(
        OpKind.ADAPTER_UPDATE)
    assert fabric.peers == 2 and net.peers == 2 and net.net_bytes == 2 * 4 * n * 1 // 2
    base = lambda s: sum(b.bytes for b in s.buffers.values() if b.role == "base")  # noqa: E731
    assert base(two) == base(one) == 2 * m.total_params  # every parameter, bf16, whole on each node
    r = _horizon("plan", "--model", "tiny", "--lora-rank", "4", "--gpus", "2", "--nodes", "2", "--json")
    assert r.returncode == 0, r.stderr


def test_adapters_on_the_host_leave_the_device_the_slots_and_cross_the_link():
    """adapters_on='host': the device holds a slot's worth of adapters per weight slot (and one
    backward's gradient) instead of every block's adapters, moments and sums (16 bytes an adapter
    parameter), which the host holds instead; each load carries its block's adapters (4 bytes an
    adapter parameter) and each backward's gradient comes back; the update runs on the host.
    The search chooses it where the device cannot hold them (8B at rank 512 on an RTX 4090: 15
    GiB of adapter state)."""
    m = model_preset("llama-3.1-8b")
    hw = make_hardware("rtx-4090", "64GB")
    dev = Policy.from_choices(batch=4, seq=2048, lora_rank=512)
    host = replace(dev, adapters_on="host")
    sd, sh = build_schedule(m, dev), build_schedule(m, host)
    n = sum(work.adapter_params(m.block_spec(u), dev) for u in range(m.n_layers))
    on = lambda s, space: sum(b.bytes for b in s.buffers.values() if b.role == "adapters" and b.space.value == space)  # noqa: E731
    assert on(sd, "device") == 16 * n and on(sd, "host") == 0
    assert on(sh, "host") == 16 * n and on(sh, "device") == 2 * host.slots * 4 * (n // m.n_layers)
    link = lambda s, k: sum(o.link_bytes for o in s.ops if o.kind == k)  # noqa: E731
    loads = sum(1 for o in sh.ops if o.kind == OpKind.LOAD_WEIGHTS and o.unit < m.n_layers)
    assert link(sh, OpKind.LOAD_WEIGHTS) - link(sd, OpKind.LOAD_WEIGHTS) == loads * 4 * (n // m.n_layers)
    assert link(sh, OpKind.OFFLOAD_ADAPTER_GRADS) == 4 * n  # one micro-batch: each block's gradient once
    assert [o.kind for o in sh.ops][-1] == OpKind.ADAPTER_HOST_UPDATE
    rd, rh = simulate(sd, hw).summary, simulate(sh, hw).summary
    assert not rd.fits and rh.fits and rh.device_peak_bytes < rd.device_peak_bytes - 12 * n
    r = _horizon("tune", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--ram", "64GB", "--lora-rank", "512",
                 "--batch", "4", "--seq", "2048", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "--adapters-on host" in next(line for line in r.stdout.splitlines() if line.startswith("train it:"))


def test_the_backward_of_a_frozen_base_skips_its_weight_gradients():
    """The adapters' backward: the base's input gradients only (its weight-gradient GEMMs are not
    run) plus the adapters'; the step is faster than full fine-tuning where compute limits it."""
    m = model_preset("llama-3.1-8b")
    tok = 4096
    full = work.gemm_flops(work.block_gemms(m, tok, True))
    frozen = work.gemm_flops(work.block_gemms(m, tok, True, LORA))
    base_fwd = work.gemm_flops(work.block_gemms(m, tok, False))
    lora_fwd = work.gemm_flops(work.adapter_gemms(m, LORA, tok, False))
    assert full == pytest.approx(3 * base_fwd)
    assert frozen == pytest.approx(2 * base_fwd + 3 * lora_fwd)


def _block_pass_bytes(m, a, lora: bool, dropout: float = 0.0):
    """Bytes the executor's non-GEMM kernels move in one forward, one forward with grad and its
    backward of block 0 on a frozen base (the BACKWARD's work plus a FORWARD's), counted aten
    call by aten call, with or without the adapters."""
    from horizon_exec.measure.calibrate import KernelTimer
    from horizon_exec.model.adapters import AdaptedWeights, AdapterDropout
    from horizon_exec.model.block import DecoderBlock
    from horizon_exec.model.layout import block_layout
    from horizon_exec.model.rope import rope_tables
    dt = {2: torch.bfloat16, 4: torch.float32}[a]
    gen = torch.Generator().manual_seed(0)
    lay = block_layout(m)
    w = lay.views((torch.randn(lay.numel, generator=gen) * 0.02).to(dt))
    cos, sin = rope_tables(m, 128, dt, "cpu")
    x = torch.randn(2, 128, m.hidden, generator=gen).to(dt)
    blk = DecoderBlock(m)
    pairs = {p.module: (0.1 * torch.randn(LORA.lora_rank, p.in_features, generator=gen),
                        0.1 * torch.randn(p.out_features, LORA.lora_rank, generator=gen)) for p in work.adapted(m, LORA)}

    drop = AdapterDropout(dropout, (0, 0, 0, 0, 0)) if dropout else None

    def run():
        with torch.no_grad():
            blk(AdaptedWeights(w, pairs, 2.0, drop) if lora else w, x, cos, sin)
        with torch.enable_grad():
            xg = x.detach().requires_grad_()
            leaves = {k: (p.detach().requires_grad_(), q.detach().requires_grad_()) for k, (p, q) in pairs.items()}
            y = blk(AdaptedWeights(w, leaves, 2.0, drop) if lora else w, xg, cos, sin)
            torch.autograd.grad(y, [xg] + ([t for pr in leaves.values() for t in pr] if lora else []), x)

    run()
    timer = KernelTimer()
    with timer:
        run()
    return timer.bytes


@pytest.mark.parametrize("a", [2, 4])
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3", "phi3"])
def test_the_planned_adapter_bytes_are_a_kernel_by_kernel_count(family, a):
    """What the planner adds for the adapters (and takes off for the frozen base's weight
    gradients) against the executor's aten calls: a forward, and a backward with its forward."""
    m = replace(tiny(family), hidden=256, ffn_hidden=688, n_layers=1, layer_windows=(), mlp_bias=False)
    tok = 2 * 128
    frozen = _block_pass_bytes(m, a, lora=False)
    full_plan = work.block_elementwise_bytes(m, tok, 128, a, False) + work.block_elementwise_bytes(m, tok, 128, a, True)
    # (the full step's own figure is within 2e-3 of its count: phi3's fp32 one 2.4e-3 off, which this inherits)
    assert full_plan - work.frozen_backward_bytes(m, tok, a) == pytest.approx(frozen, rel=3e-3)
    adapters = _block_pass_bytes(m, a, lora=True) - frozen
    want = 2 * work.adapter_elementwise_bytes(m, LORA, tok, a, False) + work.adapter_elementwise_bytes(m, LORA, tok, a, True)
    assert want == pytest.approx(adapters, rel=2e-3)


@pytest.mark.parametrize("a", [2, 4])
def test_the_planned_dropout_bytes_are_a_kernel_by_kernel_count(a):
    """The adapters' dropout (lora_dropout): what it adds over the adapters without it, planned
    against the executor's aten calls."""
    m = replace(tiny("llama"), hidden=256, ffn_hidden=688, n_layers=1, layer_windows=(), mlp_bias=False)
    tok, drop = 2 * 128, replace(LORA, lora_dropout=0.1)
    got = _block_pass_bytes(m, a, lora=True, dropout=0.1) - _block_pass_bytes(m, a, lora=True)
    plan = lambda p: 2 * work.adapter_elementwise_bytes(m, p, tok, a, False) + work.adapter_elementwise_bytes(  # noqa: E731
        m, p, tok, a, True)
    assert plan(drop) - plan(LORA) == pytest.approx(got, rel=2e-3)


def _saved_bytes(spec, dtype, mode: str) -> int:
    """Bytes a block's graph keeps (saved-tensor hooks; the weights, the adapters, the input and
    the RoPE tables are buffers of their own), its weights trained ('full'), frozen ('frozen'),
    or frozen with adapters ('lora'; with their dropout: 'dropout')."""
    from horizon_exec.model.adapters import AdaptedWeights, AdapterDropout
    from horizon_exec.model.block import DecoderBlock
    from horizon_exec.model.layout import block_layout
    from horizon_exec.model.rope import rope_tables
    from tests.test_families import B, T
    lay = block_layout(spec)
    gen = torch.Generator().manual_seed(1)
    flat = (torch.randn(lay.numel, generator=gen) * 0.2).to(dtype)
    x = torch.randn(B, T, spec.hidden, generator=gen).to(dtype)
    cos, sin = rope_tables(spec, T, dtype, "cpu")
    leaves = {p.module: (0.1 * torch.randn(4, p.in_features, generator=gen).requires_grad_(),
                         0.1 * torch.randn(p.out_features, 4, generator=gen).requires_grad_())
              for p in work.adapted(spec, replace(LORA, lora_rank=4))}
    w = {k: v.requires_grad_(mode == "full") for k, v in lay.views(flat.detach()).items()}
    drop = AdapterDropout(0.1, (0, 0, 0, 0, 0)) if mode == "dropout" else None
    weights = AdaptedWeights(w, leaves, 2.0, drop) if mode in ("lora", "dropout") else w
    return saved_bytes(lambda: DecoderBlock(spec)(weights, x.requires_grad_(), cos, sin, spec.window(0)),
                       (flat, x, cos, sin, *(t for pr in leaves.values() for t in pr)))[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family", [f for f in ("llama", "qwen2", "mistral", "qwen3", "phi3", "gpt2", "gpt_neox",
                                                "gemma2", "gemma3_text", "olmo2", "qwen3_moe", "qwen2_moe")])
def test_what_a_frozen_graph_and_its_adapters_keep_is_what_the_planner_counts(family, dtype):
    """A kept layer's graph on a frozen base keeps work.frozen_saved_bytes less than the full
    one (every dense family but OLMo-2, whose fp32-weight norms and the MoE families' routed rows
    are estimates, low), and its adapters add work.adapter_saved_bytes (every family but OLMo-2
    in fp32)."""
    from tests.test_families import B, T
    spec = tiny(family)
    a = torch.empty((), dtype=dtype).element_size()
    full, frozen, lora = (_saved_bytes(spec, dtype, mode) for mode in ("full", "frozen", "lora"))
    plan_frozen = work.frozen_saved_bytes(spec, B * T, a)
    if family == "olmo2" or spec.is_moe:
        assert 0 < plan_frozen < full - frozen
    else:
        assert plan_frozen == full - frozen
    plan_adapters = work.adapter_saved_bytes(spec, replace(LORA, lora_rank=4), B * T, a)
    if family == "olmo2" and a == 4:
        assert lora - frozen <= plan_adapters
    else:
        assert plan_adapters == lora - frozen


def _horizon(*args):
    return subprocess.run([sys.executable, "-m", "horizon_sim.cli.main", *args], capture_output=True, text=True)


@pytest.mark.parametrize("args,says", [
    (["--lora-rank", "-1"], "lora_rank=-1 must be an integer"),
    (["--lora-rank", "4", "--lora-targets", "q_proj,nope"], "'nope', which this model's blocks do not have; allowed:"),
    (["--lora-targets", "q_proj"], "give lora_rank too"),
    (["--lora-rank", "4", "--master-dtype", "bf16"], "--master-dtype does not apply with --lora-rank 4"),
    (["--lora-rank", "4", "--optimizer", "pipelined"], "--optimizer pipelined does not apply with --lora-rank 4"),
    (["--lora-rank", "4", "--lora-alpha", "0"], "lora_alpha=0.0 must be a positive number"),
    (["--lora-rank", "4", "--lora-targets", "experts.down_proj"], "'experts.down_proj', which this model's blocks do not"),
    (["--lora-rank", "4", "--model", "gpt-oss-20b", "--lora-targets", "q_proj,24.mlp.experts.down_proj"],
     "'24.mlp.experts.down_proj', which this model's blocks do not have"),
    (["--lora-rank", "4", "--lora-targets", "1.q_proj"], "'1.q_proj', which this model's blocks do not have"),  # (peft:
    (["--lora-rank", "4", "--lora-targets", "9.self_attn.q_proj"], "'9.self_attn.q_proj', which"),  # the whole path)
    (["--lora-rank", "4", "--model", "deepseek-v2-lite", "--lora-targets", "0.mlp.experts.down_proj"],
     "'0.self_attn.q_proj' or '1.mlp.experts.gate_up_proj'"),  # layer 0 is dense: the hint names a layer with stacks
    (["--lora-rank", "4", "--compare", "zero3-offload"], "there is no peer step to compare with"),
])
def test_bad_adapter_flags_are_one_line_errors(args, says):
    r = _horizon("plan", "--model", "tiny", *args)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_plan_json_and_the_policy_line_say_what_is_trained():
    r = _horizon("plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--ram", "256GB", "--lora-rank", "16",
                 "--no-advice")
    assert r.returncode == 0, r.stderr
    assert "LoRA rank 16 on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj: 41,943,040 adapter parameters" \
        in r.stdout
    r = _horizon("plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--ram", "256GB", "--lora-rank", "16",
                 "--json", "--no-advice")
    d = json.loads(r.stdout)
    assert d["policy"]["lora_rank"] == 16 and d["policy"]["optimizer"] == "after"


def test_tune_and_max_model_search_only_what_applies():
    """tune with adapters ranks policies that differ in what a frozen base has (micro-batches,
    checkpoints, kept layers, slots), and its train line carries no host-update flag."""
    r = _horizon("tune", "--model", "tiny", "--gpu", "rtx-4090", "--ram", "64GB", "--lora-rank", "8", "--batch", "4",
                 "--seq", "256", "--workers", "1")
    assert r.returncode == 0, r.stderr
    train = next(line for line in r.stdout.splitlines() if line.startswith("train it:"))
    assert "--lora-rank 8" in train and "--master-dtype" not in train and "--optimizer" not in train
    with pytest.raises(HorizonError, match="does not apply with adapters"):
        Policy(lora_rank=8)  # the default optimizer mode is the host's


@pytest.mark.parametrize("dtype, dropout", [("fp32", 0.0), ("bf16", 0.0), ("bf16", 0.1)])
def test_the_planned_adapter_temporaries_bound_the_measured_ones(dtype, dropout):
    """A block op's planned temporaries with adapters (the base's, work.adapter_workspace_bytes
    added; with dropout, its masks too) against the executor's measured peak in a streamed step:
    at least it, and within 1.3x (the bound keeps the frozen base's weight gradients a full
    backward holds)."""
    from horizon_exec.runtime.trainer import Trainer
    m = replace(model_preset("tiny"), n_layers=3)
    kw = dict(compute_dtype="fp32", grad_dtype="fp32", working_copy=False) if dtype == "fp32" else {}
    p = Policy.from_choices(batch=2, seq=128, act_ckpt_every=2, lora_rank=8, optimizer=None, lora_dropout=dropout, **kw)
    with Trainer(m, p) as tr:
        tl = tr.step(torch.randint(0, m.vocab, (2, 128), generator=torch.Generator().manual_seed(0))).timeline
        ops = {(o.kind.value, o.unit): o for o in tr.sched.ops}
    out = 2 * 128 * m.hidden * (4 if dtype == "fp32" else 2)  # the op's output (y, or dx): measured, not workspace
    for kind, unit in (("forward", 1), ("recompute", 0), ("backward", 1)):  # (block 0's backward makes no dx)
        measured = max(tl[(tl.kind == kind) & (tl.unit == unit)].temp_peak_bytes)
        planned = ops[(kind, unit)].workspace_bytes + out
        assert measured <= planned <= 1.3 * measured, (kind, measured, planned)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gpt2"])
def test_what_dropout_keeps_is_what_the_planner_counts(family, dtype):
    """With dropout each adapter's graph keeps its mask and its masked input, not the cast:
    work.adapter_saved_bytes against saved-tensor hooks."""
    from tests.test_families import B, T
    spec = tiny(family)
    a = torch.empty((), dtype=dtype).element_size()
    got = _saved_bytes(spec, dtype, "dropout") - _saved_bytes(spec, dtype, "frozen")
    assert work.adapter_saved_bytes(spec, replace(LORA, lora_rank=4, lora_dropout=0.1), B * T, a) == got


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_expert_adapter_temporaries_are_bounded_by_the_plan(family):
    """bf16, both expert stacks adapted beside all-linear: each block op's planned temporaries
    are at least the measured peak, and within 1.6x (an MoE block's are a bound: the most
    loaded expert, its padding, the frozen base's weight gradients a full backward holds)."""
    from horizon_exec.runtime.trainer import Trainer
    from tests.test_families import tiny
    m = tiny(family)
    p = Policy.from_choices(batch=2, seq=128, lora_rank=8, optimizer=None,
                            lora_targets="all-linear,experts.gate_up_proj,experts.down_proj")
    with Trainer(m, p) as tr:
        tl = tr.step(torch.randint(0, m.vocab, (2, 128), generator=torch.Generator().manual_seed(0))).timeline
        ops = {(o.kind.value, o.unit): o for o in tr.sched.ops}
    out = 2 * 128 * m.hidden * 2  # the op's output (y, or dx): measured, not workspace
    last = m.n_layers - 1
    for kind in ("forward", "backward"):
        measured = max(tl[(tl.kind == kind) & (tl.unit == last)].temp_peak_bytes)
        planned = ops[(kind, last)].workspace_bytes + out
        assert measured <= planned <= 1.6 * measured, (kind, measured, planned)
