"""Issue 42: a LoRA run resumes bit for bit, as the full fine-tuning runs do (test_loop_resume.py):
trained K steps with checkpoints (the frozen base, the device adapters, their AdamW moments and
step), then resumed in a fresh trainer of another init seed, it computes the uninterrupted run's
losses, eval losses, adapters and moments exactly; the base never changes."""
import pytest
import torch

from horizon_exec.data.data import load_dataset
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.test_moe_resume import K, STEPS
from tests.test_moe_resume import _loop as _moe_loop

pytestmark = pytest.mark.usefixtures("one_intraop_thread")

SPEC = ModelSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=256)


def _loop(ds, pol, ckpt_dir=None, seed=0):
    return _moe_loop(ds, pol, ckpt_dir, seed, spec=SPEC)


def _state(tr):
    return ({f"adapters.{u}": t.clone() for u, t in tr.adapters.state.items()} | {"step": tr.adapters.step.clone()}
            | {n: t.clone() for n, t in tr.store.t.items() if n.startswith(("base.", "qbase."))})


@pytest.mark.parametrize("micro, quant, dropout, objective, place", [
    (1, "none", 0.0, "sft", "device"), (2, "none", 0.1, "sft", "device"), (1, "nf4", 0.0, "sft", "device"),
    (1, "none", 0.0, "dpo", "device"), (2, "none", 0.0, "sft", "host")])
def test_a_lora_run_resumes_bit_for_bit(tmp_path, micro, quant, dropout, objective, place):
    """(nf4: the quantized base's packed bytes are what the checkpoint holds, never re-quantized;
    dropout: the resumed steps draw the masks the uninterrupted run drew; dpo: its rows as pairs;
    host: the adapters and their state in host RAM.)"""
    ds = load_dataset(None, ByteTokenizer(), seq=32, eval_fraction=0.01)
    pol = Policy(batch=2, seq=32, micro_batches=micro, lora_rank=4, lora_alpha=16.0, optimizer="after", grad_clip=1.0,
                 base_quant=quant, lora_dropout=dropout, objective=objective, adapters_on=place)
    tr_u, straight = _loop(ds, pol)
    with tr_u:
        base0 = {n: t.clone() for n, t in tr_u.store.t.items() if n.startswith(("base.", "qbase."))}
        straight.run()
        want = _state(tr_u)
    assert all(torch.equal(want[n], t) for n, t in base0.items())  # the base is frozen
    assert float(want["step"]) == STEPS
    tr_i, interrupted = _loop(ds, pol, ckpt_dir=tmp_path)
    with tr_i:
        interrupted.run(until=K)
    # base and adapters must come from the checkpoint (another init seed); with dropout the run's seed
    # keys the masks, as it keys stochastic rounding: a resume keeps the run's own
    tr_r, resumed = _loop(ds, pol, ckpt_dir=tmp_path, seed=0 if dropout else 123)
    with tr_r:
        assert resumed.resume(tmp_path).name == "step-00000004" and resumed.step == K
        resumed.run()
        got = _state(tr_r)
    assert [resumed.losses[s] for s in range(K, STEPS)] == [straight.losses[s] for s in range(K, STEPS)]
    assert resumed.evals == {6: straight.evals[6]}
    assert set(got) == set(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
