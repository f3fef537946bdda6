"""Issue 42, item 4: DPO on adapters (Policy.objective 'dpo'), against TRL's DPOTrainer on peft's
LoRA. On TRL's own batch (its tokenized pairs, padded as its collator pads them), in fp32, the
executor's loss and every adapter gradient equal what TRL's compute_loss gives and backpropagates,
within 1e-5, for the sigmoid, IPO and robust (label-smoothed) losses; the reference is the base
without the adapters (TRL's, for a peft model), computed by the step's own reference pass. The
reference pass runs before the step's forward from the same input in either micro-batch order,
and the step's options give the same gradients."""
import math
from dataclasses import replace

import pytest
import torch

from horizon_sim.schedule import OpKind, build_schedule
from horizon_sim.specs.policy import Policy
from tests.hf_tiny import rel_err
from tests.test_families import tiny
from tests.test_lora_exec import _copy_adapters_into, _peft, _step_grads, _trainer

trl = pytest.importorskip("trl")
SPEC = replace(tiny("llama"), vocab=320)  # the test tokenizer's vocabulary (tests/hf_tokenizers.py)
PAIRS = {"prompt": ["The cat", "Once upon"], "chosen": [" sat on the mat", " a time there was"],
         "rejected": [" ran", " nothing at all, not a thing"]}


def _trl_batch(tmp_path, model, **dpo):
    """TRL's DPOTrainer on `model` (peft) and its first batch: rows [chosen..., rejected...]."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from tests.hf_tokenizers import tokenizer_folder
    tokenizer_folder(tmp_path / "tok")
    cfg = DPOConfig(output_dir=str(tmp_path / "trl"), report_to=[], per_device_train_batch_size=2, use_cpu=True,
                    bf16=False, max_length=32, **dpo)
    tr = DPOTrainer(model=model, args=cfg, train_dataset=Dataset.from_dict(PAIRS),
                    processing_class=AutoTokenizer.from_pretrained(tmp_path / "tok"))
    return tr, next(iter(tr.get_train_dataloader()))


def _ours(batch):
    """TRL's batch as the executor takes it: pairs interleaved [c0, r0, c1, r1], labels[t] the
    next token where it is a completion token (TRL's completion_mask, shifted), else -100."""
    ids, cm = batch["input_ids"], batch["completion_mask"]
    n = ids.shape[0] // 2
    order = [i for p in range(n) for i in (p, n + p)]
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = torch.where(cm[:, 1:].bool(), ids[:, 1:], -100)
    return ids[order], labels[order]


@pytest.mark.parametrize("loss, smoothing", [("sigmoid", 0.0), ("ipo", 0.0), ("robust", 0.1)])
def test_the_loss_and_adapter_gradients_are_trls(tmp_path, loss, smoothing):
    from tests.test_families import _random_hf
    # TRL's batch from a stand-in model (its shape sets the executor's step), then the executor's
    # trainer (its adapters, B random), then TRL's trainer again on a peft model of the same base
    # holding those adapters: the same batch
    kw = dict(beta=0.1, loss_type=[loss], label_smoothing=smoothing)
    _, batch = _trl_batch(tmp_path / "probe", _peft(_random_hf(SPEC), "all-linear", 4, 8.0), **kw)
    tokens, labels = _ours(batch)
    tr, ref_model = _trainer(tmp_path, "llama", "all-linear", spec=SPEC, batch=tokens.shape[0],
                             seq=tokens.shape[1], objective="dpo", dpo_loss=loss, dpo_label_smoothing=smoothing)
    model = _peft(ref_model, "all-linear", 4, 8.0)
    _copy_adapters_into(tr, model)
    trl_tr, again = _trl_batch(tmp_path / "trl", model, **kw)
    assert all(torch.equal(again[k], batch[k]) for k in batch)
    # TRL keeps a trained adapter's starting copy as 'ref' and uses it as the reference; dropped,
    # its reference is the base with the adapters off (a fresh adapter's start, B = 0), the executor's
    if "ref" in model.peft_config:
        model.delete_adapter("ref")
    model.train()
    with tr:
        res, grads = _step_grads(tr, tokens, labels)
    want_loss = trl_tr.compute_loss(model, batch)
    want_loss.backward()
    want = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert set(grads) == set(want)
    assert abs(res.loss - (math.log(2) if loss != "ipo" else 25.0)) > 1e-3  # the policy is not the reference
    logged = {k: v[-1] for k, v in trl_tr._metrics["train"].items()}  # TRL's reward metrics of that batch
    for ours, theirs in (("rewards_chosen", "rewards/chosen"), ("rewards_rejected", "rewards/rejected"),
                         ("reward_margin", "rewards/margins"), ("reward_accuracy", "rewards/accuracies")):
        assert res.dpo[ours] == pytest.approx(logged[theirs], rel=1e-4, abs=1e-7), ours
    assert res.loss == pytest.approx(want_loss.item(), rel=1e-5)
    errs = {n: rel_err(g, want[n]) for n, g in grads.items()}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= 1e-5, f"{worst}: {errs[worst]:.2e}"


@pytest.mark.parametrize("order", ["micro", "layer"])
def test_the_reference_pass_runs_first_from_the_steps_own_input(order):
    p = Policy.from_choices(batch=4, seq=64, micro_batches=2, mb_order=order, lora_rank=4, objective="dpo",
                            optimizer=None)
    sched = build_schedule(replace(tiny("llama"), n_layers=3), p)
    kinds = [o.kind for o in sched.ops if o.lane.value == "compute"]
    first_train = kinds.index(OpKind.FORWARD)
    assert set(kinds[:first_train]) == {OpKind.REF_FORWARD, OpKind.HEAD_LOSS}
    assert OpKind.REF_FORWARD not in kinds[first_train:]
    assert sum(o.kind == OpKind.EMBED_FWD for o in sched.ops) == 2  # once per micro-batch, shared by both passes
    ref = [o for o in sched.ops if o.kind == OpKind.REF_FORWARD]
    assert all("lora" not in " ".join(o.reads) for o in ref)  # the base alone
    heads = [o for o in sched.ops if o.kind == OpKind.HEAD]
    assert all("ref_logps" in o.reads for o in heads)


def test_full_fine_tuning_dpo_over_nodes_keeps_a_whole_reference_per_node():
    """2 nodes: the master and moments are sharded over the nodes, the reference (the compute
    dtype) is whole on each, as the working copy is; its reference pass loads from it."""
    from horizon_sim.schedule.op import Layout
    m = replace(tiny("llama"), n_layers=3)
    p = Policy.from_choices(batch=2, seq=64, objective="dpo")
    one, two = build_schedule(m, p), build_schedule(m, p, Layout(1, 2))
    role = lambda s, r: sum(b.bytes for b in s.buffers.values() if b.role == r)  # noqa: E731
    assert role(two, "reference") == role(two, "working_copy") == role(one, "reference") > 0
    assert role(two, "master") < role(one, "master")
    loads = [o for o in two.ops if o.kind == OpKind.LOAD_WEIGHTS and any(r.startswith("ref.") for r in o.reads)]
    assert len(loads) == m.n_layers + 1  # every block's and the head's reference weights


@pytest.mark.parametrize("other", [dict(keep_last=-1), dict(mb_order="layer"), dict(act_ckpt_every=2,
                                                                                  act_ckpt_on="device")])
def test_the_step_options_give_the_same_dpo_gradients(tmp_path, other):
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, SPEC.vocab, (4, 16), generator=g)
    labels = torch.full_like(tokens, -100)
    labels[:, 6:-1] = tokens[:, 7:]
    base = dict(spec=SPEC, batch=4, seq=16, micro_batches=2, objective="dpo")
    a, _ = _trainer(tmp_path / "a", "llama", "all-linear", **base)
    b, _ = _trainer(tmp_path / "b", "llama", "all-linear", **{**base, **other})
    with a, b:
        r1, g1 = _step_grads(a, tokens, labels)
        r2, g2 = _step_grads(b, tokens, labels)
    assert r2.loss == pytest.approx(r1.loss, rel=1e-6)
    assert max(rel_err(g2[n], v) for n, v in g1.items()) <= 1e-5


def _full_grads(tr, tokens, labels):
    """One full fine-tuning step's loss and every parameter's gradient (by transformers name), as
    the host holds them when the global norm is taken (optimizer 'after', fp32)."""
    from horizon_exec.model.layout import host_layout
    from horizon_sim.schedule import Holds
    grads = {}

    def snapshot(op):
        if op.kind == OpKind.GRAD_NORM:
            for u in tr.units:
                g = tr.runner.buf.get(tr.sched.find(Holds.HOST_GRAD, u).name)  # (pooled: live until the update)
                grads.update({k: v.clone() for k, v in host_layout(tr.model, u).views(g).items()})

    tr.engine.hook = snapshot
    res = tr.step(tokens, labels)
    tr.engine.hook = None
    return res, grads


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_full_fine_tuning_dpo_is_trls(tmp_path, loss):
    """Full fine-tuning: the reference is a copy of the weights the run started from (REF_WEIGHTS,
    in host RAM; TRL's is a copy of the model), and the loss and every parameter's gradient equal
    TRL's within 1e-5."""
    from transformers import AutoModelForCausalLM

    from horizon_exec.checkpoints.hf_checkpoint import load_hf, spec_from_hf_dir
    from horizon_exec.runtime.config import TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.policy import exact_policy
    from tests.test_families import _random_hf
    kw = dict(beta=0.1, loss_type=[loss])
    _random_hf(SPEC).save_pretrained(tmp_path / "hf")  # (TRL loads its reference copy from the model's folder)
    load = lambda: AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)  # noqa: E731
    _, batch = _trl_batch(tmp_path / "probe", load(), **kw)
    tokens, labels = _ours(batch)
    pol = exact_policy(batch=tokens.shape[0], seq=tokens.shape[1], optimizer="after", grad_clip=0.0,
                       objective="dpo", dpo_loss=loss, loss_chunk_tokens=24)
    tr = Trainer(spec_from_hf_dir(tmp_path / "hf"), pol, TrainerConfig(random_init=False))
    load_hf(tr, tmp_path / "hf")
    model = load()
    trl_tr, again = _trl_batch(tmp_path / "trl", model, **kw)
    assert all(torch.equal(again[k], batch[k]) for k in batch)
    model.train()
    with tr:
        with torch.no_grad():  # move the policy off the reference (TRL's reference stays the copy it made)
            for name, t in tr.state_dict().items():
                t.add_(0.01 * torch.randn(t.shape, generator=torch.Generator().manual_seed(len(name))))
            tr.refresh_working_copy()
            model.load_state_dict({**model.state_dict(), **{k: v.clone() for k, v in tr.state_dict().items()}})
        res, grads = _full_grads(tr, tokens, labels)
    want_loss = trl_tr.compute_loss(model, batch)
    want_loss.backward()
    want = {n: p.grad for n, p in model.named_parameters()}
    assert set(grads) == set(want)
    assert abs(res.loss - (math.log(2) if loss == "sigmoid" else 25.0)) > 1e-3
    assert res.loss == pytest.approx(want_loss.item(), rel=1e-5)
    errs = {n: rel_err(g, want[n]) for n, g in grads.items()}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= 1e-5, f"{worst}: {errs[worst]:.2e}"


def test_full_fine_tuning_dpo_resumes_bit_for_bit(tmp_path):
    """The reference copy is in the checkpoint: a resumed run (another init seed) computes the
    uninterrupted run's losses."""
    from horizon_exec.data.data import load_dataset
    from horizon_exec.data.tokenize import ByteTokenizer
    from tests.test_lora_resume import SPEC as RSPEC
    from tests.test_moe_resume import K, STEPS
    from tests.test_moe_resume import _loop
    ds = load_dataset(None, ByteTokenizer(), seq=32, eval_fraction=0.01)
    pol = Policy(batch=2, seq=32, objective="dpo", optimizer="pipelined", grad_clip=1.0)
    tr_u, straight = _loop(ds, pol, None, 0, spec=RSPEC)
    with tr_u:
        straight.run()
    tr_i, interrupted = _loop(ds, pol, tmp_path, 0, spec=RSPEC)
    with tr_i:
        interrupted.run(until=K)
    tr_r, resumed = _loop(ds, pol, tmp_path, 123, spec=RSPEC)
    with tr_r:
        resumed.resume(tmp_path)
        resumed.run()
    assert [resumed.losses[s] for s in range(K, STEPS)] == [straight.losses[s] for s in range(K, STEPS)]
