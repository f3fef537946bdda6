"""The two loss kernels of the LM head (Policy.loss_kernel, horizon_exec/model/xent.py): 'fused'
(native/xent.c, one pass per row, written over the logits) gives torch's loss and gradient
(the pipeline head.py ran before it, kept as the 'torch' kernel), within fp32 ulps, for bf16
and fp32 logits, a vocabulary with a vector tail, ignored labels, NaN rows and bad labels;
trained end to end it matches transformers' autograd (test_exec_parity's check); and a policy
that names it where it cannot run is refused before anything runs."""
import math

import pytest
import torch

from horizon_exec.model.xent import check_loss_kernel, default_loss_kernel, loss_and_grad_, loss_sum
from horizon_exec.optim import native
from horizon_sim.errors import HorizonError
from horizon_sim.specs.policy import exact_policy
from tests.test_exec_parity import SEQ, check_matches_autograd, parity_spec

pytestmark = pytest.mark.skipif(native.xent() is None, reason="no C compiler: the fused kernel cannot be built")


def _chunk(dtype, rows=37, vocab=1003, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype)
    labels = torch.randint(0, vocab, (rows,), generator=g)
    labels[[3, rows - 1]] = -100
    return logits, labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_gives_torchs_loss_and_gradient(dtype):
    logits, labels = _chunk(dtype)
    g_ref, loss_ref = loss_and_grad_(logits.clone(), labels, 1 / 70, "torch")
    fused_in = logits.clone()
    g, loss = loss_and_grad_(fused_in, labels, 1 / 70, "fused")
    assert g.data_ptr() == fused_in.data_ptr() and g.dtype == dtype  # in place, in the logits' dtype
    assert loss.item() == pytest.approx(loss_ref.item(), rel=1e-6)
    before = logits.clone()
    assert loss_sum(logits, labels, "fused").item() == pytest.approx(loss_ref.item(), rel=1e-6)
    assert torch.equal(logits, before)  # the forward-only sum leaves its input alone
    diff = (g.float() - g_ref.float()).abs()
    if dtype == torch.float32:
        assert diff.max().item() <= 1e-6 * g_ref.abs().max().item()
    else:  # the same bf16 rounding but at the rare values where fp32 ulps cross a tie
        ulp = g_ref.float().abs().clamp_min(1e-30) * 2.0 ** -7
        assert bool((diff <= ulp).all())
        assert (g != g_ref).float().mean().item() < 1e-3
    assert torch.equal(g[[3, 36]].float(), torch.zeros(2, logits.shape[1]))  # ignored rows: no gradient
    # each labelled row's gradient sums to 0 (softmax minus one-hot), to the dtype's rounding
    tol = (1e-5 if dtype == torch.float32 else 2.0 ** -7) / 70
    assert g.float().sum(1).abs().max().item() < tol


def test_a_nan_in_a_row_makes_the_loss_nan_not_a_number():
    logits, labels = _chunk(torch.float32, rows=4)
    logits[2, 17] = math.nan
    _, loss = loss_and_grad_(logits.clone(), labels, 1.0, "fused")
    assert math.isnan(loss.item())


def test_a_label_outside_the_vocabulary_is_refused_and_nothing_written():
    logits, labels = _chunk(torch.bfloat16, rows=4, vocab=50)
    labels[1] = 50
    before = logits.clone()
    with pytest.raises(HorizonError, match=r"label 50 is outside the vocabulary \[0, 50\)"):
        loss_and_grad_(logits, labels, 1.0, "fused")
    assert torch.equal(logits, before)


@pytest.mark.parametrize("case", [dict(L=4, K=2, micro=2, tied=True, bias=True, opt="pipelined"),
                                  dict(L=5, K=3, micro=1, tied=False, bias=False, opt="after")])
def test_fused_trains_like_transformers_autograd(case, one_intraop_thread):
    pol = exact_policy(batch=2 * case["micro"], seq=SEQ, micro_batches=case["micro"], act_ckpt_every=case["K"],
                       optimizer=case["opt"], grad_clip=1.0, loss_chunk_tokens=12, loss_kernel="fused")
    check_matches_autograd(parity_spec(case["L"], case["tied"], case["bias"]), pol)


def test_train_resolves_the_loss_kernel_for_its_device():
    """No flag: this machine's default. A job's fused where it cannot run (planned on a CPU
    file, trained on a GPU box): this machine's default, not a refusal. --loss-kernel given:
    kept, and a fused one that cannot run is refused by the trainer (below)."""
    from horizon_exec.model.xent import resolve_loss_kernel
    assert resolve_loss_kernel(None, "cpu", False) == "fused" and resolve_loss_kernel(None, "cuda", False) == "torch"
    assert resolve_loss_kernel("fused", "cuda:0", False) == "torch"  # the job's, on a GPU
    assert resolve_loss_kernel("fused", "cuda:0", True) == "fused"   # asked for: check_loss_kernel refuses it
    assert resolve_loss_kernel("torch", "cpu", False) == "torch"     # the job's torch runs anywhere


def test_fused_is_refused_where_it_cannot_run():
    with pytest.raises(HorizonError, match=r"loss_kernel='fused'.*CPU backend only.*--loss-kernel torch"):
        check_loss_kernel("fused", "cuda:0")
    check_loss_kernel("torch", "cuda:0")
    assert default_loss_kernel("cuda:0") == "torch" and default_loss_kernel("cpu") == "fused"
    with native.use(None, "unavailable: building adamw.c with 'cc' failed: no cc"):
        assert default_loss_kernel("cpu") == "torch"  # train's default falls back
        with pytest.raises(HorizonError, match="native kernels cannot be used here.*no cc"):
            check_loss_kernel("fused", "cpu")


def test_each_loss_kernel_is_priced_at_its_own_measured_rate():
    """The head's loss time is tokens x vocab x the policy's kernel's figure (loss_ns_per_logit
    for torch, fused_loss_ns_per_logit for fused), the rest of its elementwise work the same."""
    from dataclasses import replace

    from horizon_sim.schedule import OpKind, build_schedule
    from horizon_sim.sim.costs import CostModel
    from horizon_sim.specs.model import ModelSpec
    from horizon_sim.specs.policy import Policy
    from tests.cpu_machine import CPU_HW
    hw = replace(CPU_HW, device=replace(CPU_HW.device, loss_ns_per_logit=3.0, fused_loss_ns_per_logit=1.0))
    spec = ModelSpec(n_layers=2, hidden=64, n_heads=2, n_kv_heads=1, ffn_hidden=128, vocab=4096)
    elem = {}
    for kernel in ("torch", "fused"):
        sched = build_schedule(spec, Policy(batch=2, seq=64, loss_kernel=kernel))
        head = next(o for o in sched.ops if o.kind == OpKind.HEAD)
        elem[kernel] = CostModel(hw, "bf16", sched.meta).compute_terms(head)["elementwise"]
    assert elem["torch"] - elem["fused"] == pytest.approx(2 * 64 * 4096 * (3.0 - 1.0) * 1e-9)
