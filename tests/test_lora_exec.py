"""Issue 42, LoRA on a streamed frozen base, executed: in fp32 the executor's logits, loss and
every adapter gradient equal peft's LoRA on transformers (within 1e-5) for each target set, on
a dense family and an MoE family; the adapters' update is torch's AdamW on those gradients; the
base never changes; kept activations and the layer order give the same gradients."""
import copy

import pytest
import torch

from horizon_exec.checkpoints.peft_adapter import peft_stems, to_peft
from horizon_exec.runtime.config import TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import OpKind
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import rel_err
from tests.test_families import T, V, _random_hf, tiny

B = 2
TARGETS = ("all-linear", "q_proj,v_proj", "o_proj,down_proj,up_proj",
           "q_proj,1.self_attn.v_proj,model.layers.0.mlp.down_proj")  # (one layer's: peft's full-path names)


def _peft(ref, targets: str, rank: int, alpha: float):
    """peft's LoRA on a copy of ref: Linear targets as target_modules, expert stacks as target_parameters."""
    from peft import LoraConfig, get_peft_model
    names = targets.split(",")
    linear, stacks = [n for n in names if "experts." not in n], [n for n in names if "experts." in n]
    tm = "all-linear" if "all-linear" in linear else (linear or None)
    return get_peft_model(copy.deepcopy(ref), LoraConfig(r=rank, lora_alpha=alpha, target_modules=tm,
                                                         target_parameters=stacks or None, lora_dropout=0.0))


def _trainer(tmp_path, family, targets, rank=4, alpha=8.0, grad_clip=0.0, spec=None, **policy):
    from horizon_exec.checkpoints.hf_checkpoint import load_hf, spec_from_hf_dir
    ref = _random_hf(spec or tiny(family))
    ref.save_pretrained(tmp_path / "hf")
    spec = spec_from_hf_dir(tmp_path / "hf")
    pol = exact_policy(**{"batch": B, "seq": T, **policy}, optimizer="after", grad_clip=grad_clip, loss_chunk_tokens=24,
                       lora_rank=rank, lora_alpha=alpha, lora_targets=targets)
    tr = Trainer(spec, pol, TrainerConfig(random_init=False))
    load_hf(tr, tmp_path / "hf")
    tr.adapters.init(7)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():  # B random too (peft starts it at 0: A's gradient would be 0)
        for u in tr.adapters.blocks:
            for _, b in tr.adapters.weights(u).values():
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    return tr, ref


def _peft_named(tr, pairs_of):
    """{peft's parameter name: tensor in peft's layout} of every adapter pair pairs_of(u) gives."""
    out = {}
    for u in tr.adapters.blocks:
        stems = peft_stems(tr, u)
        for module, pair in pairs_of(u).items():
            a, b = to_peft(*pair)
            out[f"{stems[module]}.lora_A.default.weight"], out[f"{stems[module]}.lora_B.default.weight"] = a, b
    return out


def _copy_adapters_into(tr, model) -> None:
    """peft's lora_A / lora_B of every adapted module <- the trainer's."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in _peft_named(tr, tr.adapters.weights).items():
            params[name].copy_(t)


def _step_grads(tr, tokens, labels=None):
    """One step's loss and the adapters' gradients just before their update (peft's names and layout)."""
    grads = {}

    def snapshot(op):
        if op.kind in (OpKind.ADAPTER_UPDATE, OpKind.ADAPTER_HOST_UPDATE):
            grads.update({n: g.clone() for n, g in _peft_named(tr, tr.adapters.grad_pairs).items()})

    tr.engine.hook = snapshot
    res = tr.step(tokens, labels)
    tr.engine.hook = None
    return res, grads


def assert_pefts_step(res, grads, model, tokens, trained=None) -> None:
    """The executor's step (its loss and the adapters' gradients, _step_grads) equals peft's model's
    on the same tokens: the same adapted parameters (`trained` too, when given), the loss and every
    gradient within 1e-5."""
    out = model(input_ids=tokens, labels=tokens)
    out.loss.backward()
    want = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert set(grads) == set(want) and (trained is None or trained == set(want))
    assert res.loss == pytest.approx(out.loss.item(), rel=1e-5)
    errs = {n: rel_err(g, want[n]) for n, g in grads.items()}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= 1e-5, f"{worst}: {errs[worst]:.2e}"


def _tokens():
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))


def check_against_peft(tmp_path, family, targets, **policy):
    tr, ref = _trainer(tmp_path, family, targets, **policy)
    model = _peft(ref, targets, 4, 8.0)
    _copy_adapters_into(tr, model)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    tokens = _tokens()
    with tr:
        with torch.no_grad():
            assert rel_err(tr.logits(tokens), model(input_ids=tokens).logits) <= 1e-5
        base = {k: v.clone() for k, v in tr.state_dict().items()}
        res, grads = _step_grads(tr, tokens)
        assert_pefts_step(res, grads, model, tokens, trained)  # (the same modules adapted as peft adapts)
        assert all(torch.equal(v, tr.state_dict()[k]) for k, v in base.items())  # the base is frozen
    return tr, grads, model


@pytest.mark.parametrize("targets", TARGETS)
def test_llama_adapters_equal_peft(tmp_path, targets):
    check_against_peft(tmp_path, "llama", targets)


def test_an_moe_family_adapts_what_peft_adapts(tmp_path):
    """Qwen2-MoE: attention, the shared expert and its gate are Linear modules peft adapts; the
    routed experts (stacked parameters) and the router (a TopKRouter module) are not."""
    check_against_peft(tmp_path, "qwen2_moe", "all-linear")


def test_the_update_is_torchs_adamw_on_those_gradients(tmp_path):
    """After the step the adapters are what torch.optim.AdamW makes of the gradients peft
    computed, clipped by their global norm (0.05, below it)."""
    tr, ref = _trainer(tmp_path, "llama", "q_proj,v_proj", grad_clip=0.05)
    model = _peft(ref, "q_proj,v_proj", 4, 8.0)
    _copy_adapters_into(tr, model)
    tokens = _tokens()
    c = tr.config.optimizer
    model(input_ids=tokens, labels=tokens).loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, 0.05)
    assert norm > 0.05
    torch.optim.AdamW(params, lr=c.lr, betas=c.betas, eps=c.eps, weight_decay=c.weight_decay).step()
    with tr:
        res = tr.step(tokens)
        assert res.grad_norm == pytest.approx(float(norm), rel=1e-5)
        got = _peft_named(tr, tr.adapters.weights)
        for n, p in model.named_parameters():
            if p.requires_grad:
                assert rel_err(got[n], p.detach()) <= 1e-6, n


@pytest.mark.parametrize("family,targets", [("llama", "all-linear"), ("mixtral", "q_proj,experts.down_proj")])
@pytest.mark.parametrize("policy", [dict(keep_last=1), dict(batch=4, micro_batches=2, mb_order="layer"),
                                    dict(batch=4, micro_batches=2), dict(act_ckpt_every=2, act_ckpt_on="device")])
def test_the_step_options_give_the_same_adapter_gradients(tmp_path, policy, family, targets):
    """Kept activations, either micro-batch order and K-blocks: the same loss and adapter
    gradients as the plain step (peft's, checked above), with an expert stack's adapters too."""
    tokens = torch.cat([_tokens(), _tokens()]) if policy.get("batch") == 4 else _tokens()
    plain, _ = _trainer(tmp_path / "plain", family, targets, batch=tokens.shape[0])
    other, _ = _trainer(tmp_path / "other", family, targets, **{**policy, "batch": tokens.shape[0]})
    with plain, other:
        r1, g1 = _step_grads(plain, tokens)
        r2, g2 = _step_grads(other, tokens)
    assert r2.loss == pytest.approx(r1.loss, rel=1e-6)
    assert max(rel_err(g2[n], g) for n, g in g1.items()) <= 1e-5


@pytest.mark.parametrize("family,targets,policy", [("llama", "all-linear", dict(batch=4, micro_batches=2)),
                                                   ("mixtral", "q_proj,experts.down_proj", dict(keep_last=1)),
                                                   ("llama", "q_proj,v_proj", dict(base_quant="nf4", mb_order="layer",
                                                                                    batch=4, micro_batches=2))])
def test_adapters_on_the_host_train_what_the_device_ones_do(tmp_path, family, targets, policy):
    """adapters_on='host': each block's adapters cross with its weights, each backward's gradient
    crosses back and is summed on the host, and the update runs there; on the CPU backend the
    same kernels in the same order, so two steps give the device run's losses, gradients and
    adapters and moments bit for bit."""
    tokens = torch.cat([_tokens(), _tokens()]) if policy.get("batch") == 4 else _tokens()
    on_device, _ = _trainer(tmp_path / "device", family, targets, **policy)
    on_host, _ = _trainer(tmp_path / "host", family, targets, **policy, adapters_on="host")
    assert all(on_host.buffers.declared[f"lora.{u}"].space.value == "host" for u in on_host.adapters.blocks)
    with on_device, on_host:
        for _ in range(2):
            (r1, g1), (r2, g2) = _step_grads(on_device, tokens), _step_grads(on_host, tokens)
            assert r2.loss == r1.loss and set(g1) == set(g2) and all(torch.equal(g2[n], g) for n, g in g1.items())
        for u in on_device.adapters.blocks:
            assert torch.equal(on_host.adapters.state[u], on_device.adapters.state[u])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_save_hf_writes_the_merged_model_and_the_peft_adapter(tmp_path, family):
    """After a step, --save-hf's folder is the base with the adapters merged (transformers loads
    it and gives the trainer's logits) and its adapter/ subfolder is peft's: PeftModel loads it
    on the original base with the same logits, and its merge_and_unload gives the saved weights."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from horizon_exec.checkpoints.hf_checkpoint import save_hf
    tr, ref = _trainer(tmp_path, family, "all-linear")
    tokens = _tokens()
    with tr:
        tr.step(tokens)
        want = tr.logits(tokens)
        save_hf(tr, tmp_path / "out")
        save_hf(tr, tmp_path / "out")  # a folder a save wrote, its adapter/ included, is replaced as a whole
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, tmp_path / "out" / "adapter").eval()
    with torch.no_grad():
        assert rel_err(merged(input_ids=tokens).logits, want) <= 1e-5
        assert rel_err(peft_model(input_ids=tokens).logits, want) <= 1e-5
        unloaded = peft_model.merge_and_unload().state_dict()
    for n, t in merged.state_dict().items():
        assert rel_err(t, unloaded[n]) <= 1e-6, n


def _stepped_and_saved(tmp_path, family, targets):
    """(trainer, transformers reference, tokens, the trainer's logits) after one step, with
    --save-hf's folder written to tmp_path/out."""
    from horizon_exec.checkpoints.hf_checkpoint import save_hf
    tr, ref = _trainer(tmp_path, family, targets)
    tokens = _tokens()
    with tr:
        tr.step(tokens)
        want = tr.logits(tokens)
        save_hf(tr, tmp_path / "out")
    return tr, ref, tokens, want


def test_a_run_starts_from_a_saved_adapter(tmp_path):
    """--init-adapter: a new run on the same base, started from the adapter --save-hf wrote, has
    the trained run's logits (its moments and step at zero); an adapter of another rank, alpha or
    target set is refused in one line naming the flag."""
    from horizon_exec.checkpoints.hf_checkpoint import load_hf
    from horizon_exec.checkpoints.peft_adapter import load_adapter
    from horizon_sim.errors import HorizonError
    tr, _, tokens, want = _stepped_and_saved(tmp_path, "llama", "q_proj,v_proj")
    fresh, _ = _trainer(tmp_path / "fresh", "llama", "q_proj,v_proj")
    with fresh:
        load_hf(fresh, tmp_path / "hf")  # the same base
        load_adapter(fresh, tmp_path / "out" / "adapter")
        assert rel_err(fresh.logits(tokens), want) <= 1e-6
        assert float(fresh.adapters.step) == 0 and all(not s[1:].any() for s in fresh.adapters.state.values())
    for kw, says in ((dict(rank=8), "its r is 4, the run's 8; give --lora-rank 4"),
                     (dict(alpha=16.0), "its lora_alpha is 8.0, the run's 16.0; give --lora-alpha 8.0"),
                     (dict(targets="all-linear"), "give --lora-targets q_proj,v_proj")):
        other, _ = _trainer(tmp_path / str(len(says)), "llama", kw.pop("targets", "q_proj,v_proj"), **kw)
        with other, pytest.raises(HorizonError, match=says.replace("(", r"\(")):
            load_adapter(other, tmp_path / "out" / "adapter")


@pytest.mark.parametrize("args,says", [
    (["--init-adapter", "."], "--init-adapter . is not a peft LoRA adapter folder"),
    (["--lora-rank", "4", "--init-adapter", "nowhere"], "--init-adapter nowhere is not a peft LoRA adapter folder"),
])
def test_init_adapter_errors_are_one_line(tmp_path, args, says):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "horizon_exec.cli.train_cmd", "--model", "tiny", "--steps", "1", *args],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_adapters_start_as_pefts_when_the_base_is_loaded():
    """A trainer whose base comes from a checkpoint (random_init=False, as --init-from makes it)
    starts its adapters as peft does: A finite and within +-1/sqrt(in), B, moments, gradients and
    step zero (the device buffers are not left as allocated)."""
    from tests.test_families import tiny
    p = exact_policy(batch=B, seq=T, optimizer="after", lora_rank=4)
    with Trainer(tiny("llama"), p, TrainerConfig(random_init=False)) as tr:
        ad = tr.adapters
        for u in ad.blocks:
            assert not ad.state[u][1:].any() and not ad.grads[u].any()
            for a, b in ad.weights(u).values():
                assert not b.any() and a.abs().max() <= a.shape[1] ** -0.5 and a.abs().max() > 0
        assert float(ad.step) == 0


def test_a_non_finite_step_leaves_the_adapters_as_they_were(tmp_path):
    """A NaN in the step's gradients (here from an adapter, the loss turns NaN) is found by the
    update op: the step is skipped (on_nonfinite 'skip', the default here), the adapters, their
    moments and step stay as they were, and the gradient sums start again from zero."""
    tr, _ = _trainer(tmp_path, "llama", "q_proj,v_proj")
    tokens = _tokens()
    with tr:
        tr.step(tokens)
        ad = tr.adapters
        before = {u: t.clone() for u, t in ad.state.items()}
        step0 = float(ad.step)
        _, b = next(iter(ad.weights(1).values()))
        saved = b[0, 0].item()
        with torch.no_grad():
            b[0, 0] = float("nan")
        res = tr.step(tokens)
        assert res.skipped and "loss" in res.nonfinite
        with torch.no_grad():
            b[0, 0] = saved
        assert all(torch.equal(ad.state[u], before[u]) for u in ad.blocks)
        assert float(ad.step) == step0 and not any(g.any() for g in ad.grads.values())
        assert not tr.step(tokens).skipped  # and the next step trains


def test_save_adapter_writes_the_adapters_alone(tmp_path):
    """horizon train --lora-rank R --save-adapter DIR: DIR holds the adapters in peft's format (a
    run started from it has the saved adapters); saving again replaces it; a folder holding other
    files, or a run without adapters, is refused in one line before anything is trained."""
    import subprocess
    import sys

    from horizon_exec.checkpoints.peft_adapter import load_adapter
    from horizon_sim.specs.model_presets import model_preset
    from horizon_sim.specs.policy import Policy

    def train(*args):
        return subprocess.run([sys.executable, "-m", "horizon_exec.cli.train_cmd", "--model", "tiny", "--steps", "2",
                               "--batch", "2", "--seq", "32", "--eval-batches", "0", "--no-search",
                               "--compute-threads", "1", *args], capture_output=True, text=True, cwd=tmp_path)
    for _ in range(2):  # the second save replaces the first
        r = train("--lora-rank", "4", "--save-adapter", "ad")
        assert r.returncode == 0, r.stderr[-2000:]
        assert "saved the adapters (peft's format) to ad" in r.stdout
    assert sorted(p.name for p in (tmp_path / "ad").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    pol = Policy.from_choices(batch=2, seq=32, lora_rank=4, optimizer=None)
    with Trainer(model_preset("tiny"), pol) as tr:
        load_adapter(tr, tmp_path / "ad")
        assert any(b.abs().max() > 0 for u in tr.adapters.blocks for _, b in tr.adapters.weights(u).values())
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    for args, says in ((["--lora-rank", "4", "--save-adapter", "other"], "holds files that are not part of a peft adapter"),
                       (["--save-adapter", "ad2"], "--save-adapter ad2 writes a LoRA run's adapters")):
        r = train(*args)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "other" / "notes.txt").read_text() == "keep me" and not (tmp_path / "ad2").exists()


def test_gpt_oss_adapts_what_peft_adapts(tmp_path):
    """gpt-oss: its biased q/k/v/o; the routed experts and the router are not Linear modules."""
    check_against_peft(tmp_path, "gpt_oss", "all-linear")


EXPERTS = "experts.gate_up_proj,mlp.experts.down_proj"


ONE_LAYER = "all-linear,1.mlp.experts.gate_up_proj,model.layers.1.mlp.experts.down_proj"


@pytest.mark.parametrize("family,targets,per_layer", [
    ("mixtral", f"q_proj,{EXPERTS}", [2, 2]), ("gpt_oss", f"all-linear,{EXPERTS}", [2, 2]),
    ("qwen3_moe", "experts.down_proj", [1, 1]),
    ("gpt_oss", ONE_LAYER, [0, 2]),                       # the gpt-oss recipes' layer-qualified names
    ("mixtral", "0.mlp.experts.down_proj", [1, 0])])      # block 1 without an adapter of its own
def test_routed_experts_adapt_as_peft_target_parameters(tmp_path, family, targets, per_layer):
    """Expert stacks named as peft's target_parameters (with a layer index: that layer's alone):
    an adapter per expert, the same parameters as peft's ParamWrapper (one (E r, in) A and
    (out, r E) B per stack, nested wrappers' names), and the loss and every gradient equal to
    peft's, whose experts fold W_e + s B_e A_e into the product; gpt-oss's stacks are stored
    (E, in, out)."""
    tr, _, model = check_against_peft(tmp_path, family, targets)
    stacks = {u: [p for p in tr.adapters.modules_of[u] if p.experts] for u in tr.adapters.blocks}
    assert [len(stacks[u]) for u in tr.adapters.blocks] == per_layer
    E, r = tr.model.n_experts, tr.adapters.rank
    assert all(tr.adapters.weights(u)[p.module][0].shape == (E, r, p.in_features) for u in stacks for p in stacks[u])


@pytest.mark.parametrize("targets,params", [
    (f"q_proj,{EXPERTS}", ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]),
    ("q_proj,1.mlp.experts.gate_up_proj,layers.1.mlp.experts.down_proj",
     ["1.mlp.experts.down_proj", "1.mlp.experts.gate_up_proj"])])
def test_routed_expert_adapters_save_and_load_as_pefts(tmp_path, targets, params):
    """gpt-oss with adapters on both expert stacks (of every layer, or of layer 1): after a step,
    --save-hf's adapter/ loads in peft on the base (its config naming the stacks as
    target_parameters) with the trainer's logits, the merged folder loads in transformers with
    them too, and --init-adapter reads the folder back to the same adapters."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from horizon_exec.checkpoints.hf_checkpoint import save_hf
    from horizon_exec.checkpoints.peft_adapter import load_adapter
    from horizon_sim.safe_read import read_json
    tr, _ = _trainer(tmp_path, "gpt_oss", targets)
    tokens = _tokens()
    with tr:
        tr.step(tokens)
        want = tr.logits(tokens)
        save_hf(tr, tmp_path / "out")
        before = {k: v.clone() for k, v in _peft_named(tr, tr.adapters.weights).items()}
        tr.adapters.init(1)
        load_adapter(tr, tmp_path / "out" / "adapter")
        after = _peft_named(tr, tr.adapters.weights)
    assert all(torch.equal(before[k], after[k]) for k in before)
    cfg = read_json(tmp_path / "out" / "adapter" / "adapter_config.json")
    assert cfg["target_modules"] == ["q_proj"] and cfg["target_parameters"] == params
    assert cfg["fan_in_fan_out"] is False  # (peft refuses it on expert stacks; gpt-oss's are (E, in, out))
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32, experts_implementation="eager")
    peft_model = PeftModel.from_pretrained(base, tmp_path / "out" / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32,
                                                  experts_implementation="eager").eval()
    with torch.no_grad():
        assert rel_err(peft_model(input_ids=tokens).logits, want) <= 1e-5
        assert rel_err(merged(input_ids=tokens).logits, want) <= 1e-5


def test_one_layers_adapters_save_and_load_as_pefts(tmp_path):
    """Linear modules of one layer: --save-hf's adapter/ names them as peft does
    ('1.self_attn.v_proj') and loads in peft with the trainer's logits; an adapter peft made
    with layers_to_transform loads into the run whose names pick the same layer's; into a run
    adapting every layer's, it is refused in one line that gives the targets."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from horizon_exec.checkpoints.peft_adapter import load_adapter
    from horizon_sim.errors import HorizonError
    from horizon_sim.safe_read import read_json
    tr, ref, tokens, want = _stepped_and_saved(tmp_path, "llama", "q_proj,1.self_attn.v_proj")
    assert read_json(tmp_path / "out" / "adapter" / "adapter_config.json")["target_modules"] == \
        ["1.self_attn.v_proj", "q_proj"]
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    with torch.no_grad():
        assert rel_err(PeftModel.from_pretrained(base, tmp_path / "out" / "adapter").eval()(input_ids=tokens).logits,
                       want) <= 1e-5
    made = get_peft_model(copy.deepcopy(ref), LoraConfig(r=4, lora_alpha=8.0, target_modules=["q_proj", "v_proj"],
                                                         layers_to_transform=[1], init_lora_weights=False))
    made.save_pretrained(tmp_path / "made")
    one, _ = _trainer(tmp_path / "one", "llama", "1.self_attn.q_proj,model.layers.1.self_attn.v_proj")
    with one:
        load_adapter(one, tmp_path / "made")
        with torch.no_grad():
            assert rel_err(one.logits(tokens), made(input_ids=tokens).logits) <= 1e-5
    every, _ = _trainer(tmp_path / "every", "llama", "q_proj,v_proj")
    with every, pytest.raises(HorizonError, match=r"it adapts 2 projections, the run 4 \(layer 0's self_attn.q_proj in "
                                                  r"the run alone\); give --lora-targets 1.self_attn.q_proj,1.self_attn.v_proj$"):
        load_adapter(every, tmp_path / "made")


@pytest.mark.parametrize("targets,per_layer,policy", [(f"q_a_proj,{EXPERTS}", [1, 3], {}),
                                                      ("experts.down_proj", [0, 1], {}),
                                                      ("experts.down_proj", [0, 1], dict(keep_last=-1))])
def test_deepseek_expert_adapters_are_the_merged_models_gradients(tmp_path, targets, per_layer, policy):
    """DeepSeek-V3's routed experts adapted (its dense first block has none, its MoE block the
    stacks named), beside MLA's projections or alone (block 0 then has nothing to compute in its
    backward), recomputed or kept: the merged model's gradients."""
    tr, ref = _trainer(tmp_path, "deepseek_v3", targets, **policy)
    assert [len(tr.adapters.modules_of[u]) for u in tr.adapters.blocks] == per_layer
    check_merged_gradients(tr, ref)


def test_deepseek_adapters_are_the_merged_models_gradients(tmp_path):
    """DeepSeek-V3, two block shapes: MLA's five projections in both, the dense block's MLP and the
    MoE block's shared experts. peft 0.21 adapts none of those MLPs on this model (it takes the
    routed experts' parameters for gate/up/down_proj), so the reference is transformers' own
    autograd: on the model with each adapter merged (W + s B A), an adapted weight's gradient G
    gives the adapters' as dA = s B^T G and dB = s G A^T."""
    tr, ref = _trainer(tmp_path, "deepseek_v3", "all-linear")
    assert [len(tr.adapters.modules_of[u]) for u in tr.adapters.blocks] == [8, 8]
    assert "mlp.gate_proj" in tr.adapters.weights(0) and "mlp.shared_experts.gate_proj" in tr.adapters.weights(1)
    check_merged_gradients(tr, ref)


def test_deepseek_on_a_4bit_base_trains_on_its_dequantized_weights(tmp_path):
    """An nf4 base on a model with two block shapes (a packing per shape): the step equals
    transformers' on the base dequantized from the blocks' packed bytes, adapters merged."""
    from horizon_exec.model.layout import block_layout
    from horizon_sim.schedule.op import Holds
    tr, ref = _trainer(tmp_path, "deepseek_v3", "all-linear", base_quant="nf4")
    params = dict(ref.named_parameters())
    with torch.no_grad():
        for u in tr.adapters.blocks:
            unit = tr.runner.quant.of(u)
            flat = torch.empty(sum(t.numel for t in unit.layout))
            unit.unpack_(flat, tr.store.of(Holds.QUANT_BASE, u))
            for name, v in block_layout(tr.model.block_spec(u)).views(flat).items():
                params[f"model.layers.{u}.{name}"].copy_(v)
    check_merged_gradients(tr, ref)


def check_merged_gradients(tr, ref) -> None:
    """tr's step (its loss, every adapter's gradient) equals transformers' autograd on ref with
    each adapter merged (W + s B A, per expert of a stack): an adapted weight's gradient G gives
    dA = s B^T G, dB = s G A^T (G^T for a weight stored (in, out))."""
    merged, s = copy.deepcopy(ref), tr.adapters.scale
    params = dict(merged.named_parameters())
    lora = {(u, p): tuple(t.clone() for t in tr.adapters.weights(u)[p.module])
            for u in tr.adapters.blocks for p in tr.adapters.modules_of[u]}
    with torch.no_grad():
        for (u, p), (a, b) in lora.items():
            delta = s * b @ a                                                 # (out, in), per expert (E, out, in)
            params[f"model.layers.{u}.{p.tensor}"] += delta.transpose(-1, -2) if p.transposed else delta
    tokens = _tokens()
    with tr:
        res, grads = _step_grads(tr, tokens)
    out = merged(input_ids=tokens, labels=tokens)
    out.loss.backward()
    assert res.loss == pytest.approx(out.loss.item(), rel=1e-5)
    for (u, p), (a, b) in lora.items():  # (the step updated the adapters: their values before it)
        g = params[f"model.layers.{u}.{p.tensor}"].grad
        g = g.transpose(-1, -2) if p.transposed else g
        want = to_peft(s * b.transpose(-1, -2) @ g, s * g @ a.transpose(-1, -2))
        stem = peft_stems(tr, u)[p.module]
        assert rel_err(grads[f"{stem}.lora_A.default.weight"], want[0]) <= 1e-5, (u, p.module)
        assert rel_err(grads[f"{stem}.lora_B.default.weight"], want[1]) <= 1e-5, (u, p.module)
