"""Loss and every gradient of the executor equal transformers' own autograd on the same
weights and batch (fp32, <= 1e-5 norm-relative per tensor), with the weights coming in
through an HF checkpoint folder (save_pretrained -> load_hf): Llama untied and tied, Qwen2
(q/k/v biases). Also with targets masked (-100) on a prompt, in one batch and with gradient
accumulation (2 micro-batches): the executor's loss is the token mean over the whole step,
which is what transformers computes for the unsplit batch.
"""
import pytest
import torch

from horizon_exec.checkpoints.hf_checkpoint import load_hf, spec_from_hf_dir
from horizon_exec.runtime.config import TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.policy import exact_policy
from tests.hf_tiny import T, V, executor_grads, hf_grads, rel_err as _rel, tiny_hf as _hf

B = 4


pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _check(loss, grads, ref_loss, ref_grads):
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert set(grads) == set(ref_grads)
    errs = {n: _rel(g, ref_grads[n]) for n, g in grads.items()}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= 1e-5, f"{worst}: {errs[worst]:.2e}"


def _trainer(tmp_path, kind, micro=1, K=2):
    ref = _hf(kind, seed=4)
    ref.save_pretrained(tmp_path / "hf", max_shard_size="60KB")
    pol = exact_policy(batch=B, seq=T, micro_batches=micro, act_ckpt_every=K, optimizer="after",
                       grad_clip=0.0, loss_chunk_tokens=24)  # several loss chunks, the last ragged
    tr = Trainer(spec_from_hf_dir(tmp_path / "hf"), pol, TrainerConfig(random_init=False))
    load_hf(tr, tmp_path / "hf")
    return tr, ref


@pytest.mark.parametrize("kind", ["llama", "llama-tied", "qwen2", "qwen3"])
def test_loss_and_every_gradient_match_transformers(tmp_path, kind):
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(5))
    tr, ref = _trainer(tmp_path, kind)
    with tr:
        loss, grads = executor_grads(tr, tokens)
    _check(loss, grads, *hf_grads(ref, tokens))
    assert len(grads) == len(tr.state_dict())


@pytest.mark.parametrize("kind,micro", [("llama", 1), ("qwen2", 2), ("llama-tied", 2)])
def test_masked_prompt_matches_transformers(tmp_path, kind, micro):
    """Targets -100 on each sequence's prompt (a different length per sequence, so the
    micro-batches hold different numbers of labelled tokens)."""
    g = torch.Generator().manual_seed(6)
    tokens = torch.randint(0, V, (B, T), generator=g)
    labels = torch.full((B, T), -100)
    labels[:, :-1] = tokens[:, 1:]
    for b, n_prompt in enumerate((3, 9, 1, 12)):
        labels[b, :n_prompt] = -100          # targets that are prompt tokens
    labels[2, -1] = 7                         # a target at the last position (packed data has them)
    tr, ref = _trainer(tmp_path, kind, micro=micro)
    with tr:
        loss, grads = executor_grads(tr, tokens, labels)
    _check(loss, grads, *hf_grads(ref, tokens, labels))


def test_eval_loss_matches_transformers_and_changes_nothing(tmp_path):
    g = torch.Generator().manual_seed(8)
    tokens = torch.randint(0, V, (6, T), generator=g)  # not a multiple of the batch: chunks of 2
    labels = torch.randint(0, V, (6, T), generator=g)
    labels[:, :5] = -100
    tr, ref = _trainer(tmp_path, "llama-tied", micro=2)
    with tr:
        before = {n: t.clone() for n, t in tr.state_dict().items()}
        total, n = tr.eval_loss(tokens, labels)
        assert n == 6 * (T - 5)
        assert all(torch.equal(t, before[k]) for k, t in tr.state_dict().items())
    with torch.no_grad():
        want = ref(input_ids=tokens, labels=labels, shift_labels=labels).loss.item()
    assert total / n == pytest.approx(want, rel=1e-5)
