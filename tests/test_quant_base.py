"""Issue 42, item 2: a frozen base stored quantized (Policy.base_quant nf4 / int8). The codes are
bitsandbytes' (the 4-bit codes bit for bit; double quantization's absmax codes too, but where
its CPU kernel's search stops off the nearest: a few in a thousand, ours the nearer); a run on bitsandbytes' own quantized state
equals peft's QLoRA on transformers (logits, loss, every adapter gradient within 1e-5), and on
its own quantization stays well inside the library's own quantization error; the planner's
host bytes are the executor's store to the byte, and bitsandbytes' bytes scaled to 70B within
3%; chunked dequantization equals whole, and its temporaries stay under the planner's bound."""
import math
from dataclasses import replace

import pytest
import torch

from horizon_exec.model import quant as Q
from horizon_exec.runtime.config import TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import Holds, OpKind, build_schedule
from horizon_sim.schedule.op import Space
from horizon_sim.specs import quant as S
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import Policy, exact_policy
from tests.hf_tiny import rel_err
from tests.test_families import T, tiny
from tests.test_lora_exec import B, _copy_adapters_into, _step_grads, _tokens, _trainer, assert_pefts_step

bnbf = pytest.importorskip("bitsandbytes.functional")

SHAPES = [(64, 128), (33, 77), (688, 256), (3, 5), (6144, 64)]
"""2-D, as bitsandbytes quantizes them; an even row length a multiple of 64 (its CPU kernel
dequantizes row by row, which differs from its reference and CUDA ones otherwise; odd lengths
fall back to the reference)."""


def _nearer(x: float, code: torch.Tensor, got: int, want: int) -> bool:
    """Our code is at least as near to x as bitsandbytes' (its CPU kernel's search can stop a code
    or two off the nearest; its reference implementation rounds to the nearest, as we do)."""
    return abs(x - float(code[got])) <= abs(x - float(code[want]))


@pytest.mark.parametrize("shape", SHAPES)
def test_nf4_codes_are_bitsandbytes(shape):
    torch.manual_seed(sum(shape))
    w = torch.randn(shape) * 0.02
    q, st = bnbf.quantize_4bit(w, blocksize=S.NF4_BLOCK, compress_statistics=True, quant_type="nf4")
    mine = Q.nf4_quantize(w)
    assert torch.equal(mine["codes"], q.view(-1))                   # the 4-bit codes, bit for bit
    assert torch.equal(mine["offset"].view(()), st.offset.view(()))
    absmax = w.reshape(-1).float()
    absmax = torch.cat([absmax, absmax.new_zeros(-absmax.numel() % S.NF4_BLOCK)]).view(-1, S.NF4_BLOCK).abs().amax(1)
    dyn = Q.dynamic_map()
    if absmax.numel() > 1:  # (one block: absmax less its mean is 0, which bitsandbytes' kernel codes otherwise)
        assert torch.equal(mine["absmax2"], st.state2.absmax)
        scaled = (absmax - st.offset) / st.state2.absmax.repeat_interleave(S.NF4_STATS_BLOCK)[:absmax.numel()]
        odd = (mine["absmax"] != st.absmax).nonzero().view(-1).tolist()
        assert len(odd) <= 0.005 * absmax.numel(), len(odd)
        for i in odd:
            assert _nearer(float(scaled[i]), dyn, int(mine["absmax"][i]), int(st.absmax[i])), i


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_dequantizing_bitsandbytes_state_gives_its_weights(shape, dtype):
    """Our dequantization of bitsandbytes' own quantized state equals its dequantize_4bit, to the bit."""
    torch.manual_seed(1)
    w = torch.randn(shape)
    q, st = bnbf.quantize_4bit(w, blocksize=S.NF4_BLOCK, compress_statistics=True, quant_type="nf4")
    st.dtype = dtype
    out = torch.empty(w.numel(), dtype=dtype)
    Q.nf4_dequantize_(out, {"codes": q.view(-1), "absmax": st.absmax, "absmax2": st.state2.absmax,
                            "offset": st.offset.view(1)})
    assert torch.equal(out.view(shape), bnbf.dequantize_4bit(q, st))


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_codes_are_bitsandbytes(shape):
    torch.manual_seed(2)
    w = torch.randn(shape)
    cb, scb, _ = bnbf.int8_vectorwise_quant(w.clone())
    mine = Q.int8_quantize(w)
    assert torch.equal(mine["codes"], cb.view(-1)) and torch.equal(mine["scales"], scb)
    out = torch.empty(w.numel())
    Q.int8_dequantize_(out, mine, shape[-1])
    want = bnbf.int8_vectorwise_dequant(cb, scb).view(-1)
    assert (out - want).abs().max() <= 1e-6 * want.abs().max()      # its scale 1/127 rounded otherwise


@pytest.mark.parametrize("fmt", ["nf4", "int8"])
def test_chunks_dequantize_as_a_whole_and_stay_under_the_bound(monkeypatch, fmt):
    """A matrix over several chunks (the chunk shrunk to 16,384 elements) dequantizes to the same
    values as in one chunk; the temporaries measured (memtrack) stay within the planner's
    bound (specs/quant.DEQUANT_TEMP_BYTES a chunk's element)."""
    from horizon_exec.device.memtrack import TransientTracker

    class _Arena:  # what TransientTracker charges
        temp = peak = 0
        ptrs: set = set()

        def transient(self, delta, what=""):
            self.temp += delta
            self.peak = max(self.peak, self.temp)

    torch.manual_seed(3)
    w = torch.randn(1000, 384)  # 384,000 elements: 23 chunks of 16,384, the last one short
    r = (Q.nf4_quantize if fmt == "nf4" else Q.int8_quantize)(w)
    run = (lambda o: Q.nf4_dequantize_(o, r)) if fmt == "nf4" else (lambda o: Q.int8_dequantize_(o, r, 384))
    whole = torch.empty(w.numel(), dtype=torch.bfloat16)
    run(whole)
    chunk = 1 << 14
    monkeypatch.setattr(Q, "DEQUANT_CHUNK_CPU", chunk)
    out, arena = torch.empty_like(whole), _Arena()
    with TransientTracker(arena):
        run(out)
    assert torch.equal(out, whole)
    assert 0 < arena.peak <= chunk * S.DEQUANT_TEMP_BYTES[fmt], arena.peak


# ---- QLoRA parity -------------------------------------------------------------------------------
def _qlora(tmp_path):
    """peft's LoRA on transformers' bitsandbytes 4-bit model (nf4, double quantization, fp32 compute)
    of the checkpoint _trainer wrote, in training mode (no CPU repacking), and its quantized states."""
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.float32)
    q = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", quantization_config=cfg, device_map="cpu",
                                             dtype=torch.float32)
    states = {name: (mod.weight.data.clone(), mod.weight.quant_state) for name, mod in q.named_modules()
              if isinstance(mod, bnb.nn.Linear4bit)}
    model = get_peft_model(q, LoraConfig(r=4, lora_alpha=8.0, target_modules="all-linear", lora_dropout=0.0))
    model.train()
    return model, states


def _load_states(tr, states) -> None:
    """The trainer's quantized blocks <- bitsandbytes' codes, absmax codes and scales."""
    unit = Q.QuantUnit(tr.model, "nf4", tr.policy.compute_dtype)
    for u in range(tr.model.n_layers):
        buf = tr.store.of(Holds.QUANT_BASE, u)
        for t in unit.layout:
            if t.fmt != "nf4":
                continue
            data, st = states[f"model.layers.{u}.{t.name.removesuffix('.weight')}"]
            r = unit.regions(buf, t)
            for role, v in (("codes", data), ("absmax", st.absmax), ("absmax2", st.state2.absmax), ("offset", st.offset)):
                r[role].copy_(v.reshape(-1))


def test_a_4bit_base_trains_as_pefts_qlora(tmp_path):
    """fp32, tiny Llama, all-linear: on bitsandbytes' quantized state the logits, the loss and every
    adapter gradient equal QLoRA's within 1e-5; on the executor's own quantization the logits stay
    within a small part of the library's own quantization error (QLoRA's logits against the
    unquantized model's)."""
    # (an MLP width a multiple of 64: bitsandbytes' CPU kernel is its reference only there)
    tr, ref = _trainer(tmp_path, "llama", "all-linear", base_quant="nf4", spec=replace(tiny("llama"), ffn_hidden=128))
    model, states = _qlora(tmp_path)
    _copy_adapters_into(tr, model)
    tokens = _tokens()
    with tr:
        with torch.no_grad():
            own = tr.logits(tokens)
            qlora = model(input_ids=tokens).logits
            with model.disable_adapter():
                base_q = model(input_ids=tokens).logits
            library = rel_err(base_q, ref(input_ids=tokens).logits)   # the quantization's own error
        _load_states(tr, states)
        with torch.no_grad():
            assert rel_err(tr.logits(tokens), qlora) <= 1e-5
        assert 1e-3 < library and rel_err(own, qlora) <= 0.05 * library, (rel_err(own, qlora), library)
        res, grads = _step_grads(tr, tokens)
    assert_pefts_step(res, grads, model, tokens)


@pytest.mark.parametrize("fmt", ["nf4", "int8"])
def test_the_base_is_frozen_and_saves_as_its_dequantized_weights(tmp_path, fmt):
    """A trained run's quantized blocks are the bytes it started with; --save-hf writes the base
    dequantized with the adapters merged, which transformers loads with the trainer's logits,
    and the adapter folder, which peft loads on that folder's base less the merge."""
    from transformers import AutoModelForCausalLM

    from horizon_exec.checkpoints.hf_checkpoint import save_hf
    tr, _ = _trainer(tmp_path, "llama", "all-linear", base_quant=fmt)
    tokens = _tokens()
    with tr:
        before = {n: t.clone() for n, t in tr.store.t.items() if n.startswith("qbase.")}
        tr.step(tokens)
        assert before and all(torch.equal(tr.store.t[n], t) for n, t in before.items())
        with torch.no_grad():
            want = tr.logits(tokens)
        save_hf(tr, tmp_path / "out")
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    with torch.no_grad():
        assert rel_err(got(input_ids=tokens).logits, want) <= 1e-5
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()


# ---- the planner's bytes --------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["nf4", "int8"])
def test_the_store_holds_the_planners_bytes(fmt):
    """The executor's host store for a tiny quantized model allocates each block's buffer at the
    Schedule's size, and each quantized tensor's regions hold exactly what bitsandbytes makes of it."""
    spec = tiny("llama")
    pol = exact_policy(batch=B, seq=T, optimizer="after", lora_rank=4, base_quant=fmt)
    tr = Trainer(spec, pol, TrainerConfig())
    with tr:
        sched = tr.sched
        for u in range(spec.n_layers):
            b = sched.find(Holds.QUANT_BASE, u)
            assert tr.store.of(Holds.QUANT_BASE, u).numel() == b.bytes == S.unit_bytes(spec, fmt, "fp32")
    unit = Q.QuantUnit(spec, fmt, "fp32")
    for t in unit.layout:
        if t.fmt == "raw":
            assert t.regions["raw"].nbytes == 4 * t.numel
            continue
        w = torch.randn(t.shape)
        if fmt == "nf4":
            q, st = bnbf.quantize_4bit(w, blocksize=S.NF4_BLOCK, compress_statistics=True, quant_type="nf4")
            made = {"codes": q, "absmax": st.absmax, "absmax2": st.state2.absmax, "offset": st.offset.view(1)}
        else:
            cb, scb, _ = bnbf.int8_vectorwise_quant(w.clone())
            made = {"codes": cb, "scales": scb}
        assert {k: r.nbytes for k, r in t.regions.items()} == {k: v.numel() * v.element_size() for k, v in made.items()}


def test_a_4bit_70b_is_planned_at_the_stores_and_bitsandbytes_bytes():
    """Llama-3.1-70B LoRA on an nf4 base: the Schedule's host base (blocks packed, embedding and head
    in bf16) within 3% of two measurements scaled to the model's quantized elements, plus 2 bytes
    for every other parameter: the bytes a quantized element takes in the executor's store for a
    tiny bf16 model (its block buffer, less its bf16 tensors), and in bitsandbytes' output for a
    4096 x 4096 weight."""
    tiny_m = tiny("llama")
    pol_tiny = Policy(batch=B, seq=T, optimizer="after", lora_rank=4, base_quant="nf4")  # bf16
    with Trainer(tiny_m, pol_tiny, TrainerConfig()) as tr:
        raw = sum(math.prod(s) for n, s in S.block.parameters(tiny_m) if not S.quantized(tiny_m, n))
        store = (tr.store.of(Holds.QUANT_BASE, 0).numel() - 2 * raw) / S.quantized_params(tiny_m)
    w = torch.randn(4096, 4096)
    q, st = bnbf.quantize_4bit(w, blocksize=S.NF4_BLOCK, compress_statistics=True, quant_type="nf4")
    library = sum(t.numel() * t.element_size() for t in (q, st.absmax, st.state2.absmax, st.offset.view(1))) / w.numel()
    m = model_preset("llama-3.1-70b")
    sched = build_schedule(m, Policy(batch=1, seq=512, lora_rank=16, optimizer="after", base_quant="nf4"))
    planned = sum(b.bytes for b in sched.buffers.values()
                  if b.holds in (Holds.QUANT_BASE, Holds.BASE_WEIGHTS) and b.space == Space.HOST)
    quantized = S.quantized_params(m) * m.n_layers
    for per in (store, library):
        want = per * quantized + 2 * (m.total_params - quantized)
        assert abs(planned / want - 1) <= 0.03, (per, planned, want)
    assert planned / m.total_params < 0.6  # ~0.55 bytes a parameter (issue 42's figure)


def test_the_load_carries_the_packed_bytes_and_prices_the_dequantization():
    from horizon_sim.sim.costs import CostModel
    from horizon_sim.specs.hardware_presets import make_hardware
    m = model_preset("llama-3.1-8b")
    full = build_schedule(m, Policy(batch=1, seq=512, lora_rank=16, optimizer="after"))
    q = build_schedule(m, Policy(batch=1, seq=512, lora_rank=16, optimizer="after", base_quant="nf4"))
    load = lambda s: next(o for o in s.ops if o.kind == OpKind.LOAD_WEIGHTS and o.unit == 3)  # noqa: E731
    lf, lq = load(full), load(q)
    assert lq.link_bytes == S.unit_bytes(m, "nf4", "bf16") < 0.27 * lf.link_bytes
    assert lq.hbm_bytes > 0 and lq.workspace_bytes >= lq.link_bytes
    cost = CostModel(make_hardware("h100-sxm", "256GB"))
    assert cost.alone_s(lq) > cost.alone_s(lq.__class__(**{**_fields(lq), "hbm_bytes": 0}))
    assert q.static_bytes(Space.HOST) < 0.4 * full.static_bytes(Space.HOST)  # (the embedding and head stay bf16)


def _fields(op) -> dict:
    import dataclasses
    return {f.name: getattr(op, f.name) for f in dataclasses.fields(op)}


@pytest.mark.parametrize("args, says", [
    (["--base-quant", "nf4"], "policy base_quant='nf4' quantizes a frozen base; give lora_rank too"),
    (["--lora-rank", "4", "--base-quant", "nf3"], "invalid choice: 'nf3'"),
])
def test_base_quant_errors_are_one_line(capsys, args, says):
    from horizon_sim.cli.main import main
    try:
        rc = main(["plan", "--model", "tiny", "--gpu", "h100-sxm", "--ram", "64GB", "--no-advice", *args])
    except SystemExit as e:  # argparse's own refusals
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and "Traceback" not in "".join(err)


def test_tune_saves_a_quantized_job_that_train_runs(tmp_path):
    """tune --lora-rank 8 --base-quant nf4 --save-job: the job holds base_quant, its train line
    carries the flag, and `train --job` runs that Schedule (its digest as planned) on packed blocks."""
    from horizon_sim.job.toml import read_job
    from horizon_sim.specs.hardware_io import save_hardware
    from tests.test_job_train import HERE, RUN, horizon
    save_hardware(HERE, tmp_path / "machine.toml")
    out = horizon("tune", "--model", "tiny", "--hardware", tmp_path / "machine.toml", "--max-batch", "4", "--seq", "64",
                  "--workers", "1", "--quiet", "--lora-rank", "8", "--base-quant", "nf4", "--save-job", tmp_path / "j.toml")
    assert out.returncode == 0, out.stderr
    assert read_job(tmp_path / "j.toml").policy.base_quant == "nf4"
    run = horizon("train", "--job", tmp_path / "j.toml", "--steps", "2", *RUN)
    assert run.returncode == 0, run.stderr
    assert "as planned" in run.stdout and "the base frozen in nf4 blocks" in run.stdout


def test_an_moe_base_packs_its_experts_and_keeps_its_router(tmp_path):
    """Qwen2-MoE on an nf4 base: the routed experts' stacks are packed (each within NF4's error of
    its weights), the router stays exact, and a step trains the adapters with a finite loss."""
    tr, ref = _trainer(tmp_path, "qwen2_moe", "all-linear", base_quant="nf4")
    want = dict(ref.named_parameters())
    with tr:
        got = tr.state_dict()
        routers = [n for n in got if n.endswith(".mlp.gate.weight")]
        experts = [n for n in got if ".mlp.experts." in n]
        assert len(routers) == len(experts) / 2 == tr.model.n_layers
        for name in routers:  # in the compute dtype, as loaded
            assert torch.equal(got[name], want[name].detach())
        for name in experts:
            assert 0 < rel_err(got[name], want[name].detach()) < 0.15, name
        assert math.isfinite(tr.step(_tokens()).loss)
    packed = {t.name for t in Q.QuantUnit(tr.model, "nf4", "fp32").layout if t.fmt == "nf4"}
    assert {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"} <= packed and "mlp.gate.weight" not in packed
