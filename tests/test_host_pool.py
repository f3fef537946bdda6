"""HostPool: both backends' dynamic host buffers, at exact sizes and reused (host_pool.py).
Run here on plain host memory, with fences standing in for CUDA events."""
import threading

import pytest
import torch

from horizon_exec.errors import ExecError
from horizon_exec.device.host_pool import HostPool


class Fence:
    def __init__(self):
        self.passed = False

    def query(self):
        return self.passed


def _pool(fences=None):
    made = []

    def new_block(n):
        made.append(n)
        return torch.empty(n, dtype=torch.uint8)
    fence = (lambda: fences.pop(0)) if fences is not None else (lambda: None)
    return HostPool(new_block, fence), made


def test_exact_sizes_and_reuse_for_the_same_size():
    pool, made = _pool()
    a = pool.take((3, 1000), torch.bfloat16)   # 6,000 bytes: torch's pinned allocator would hold 8 KiB
    assert a.shape == (3, 1000) and a.dtype == torch.bfloat16
    b = pool.take((1500,), torch.float32)      # the same 6,000 bytes, another shape and dtype
    assert made == [6000, 6000] and pool.held_bytes == 12000
    ptr = a.data_ptr()
    pool.give(a)
    c = pool.take((750,), torch.float64)       # same size: the freed block again, nothing new
    assert c.data_ptr() == ptr and made == [6000, 6000]
    d = pool.take((7,), torch.float32)         # another size: a new block of exactly 28 bytes
    assert made == [6000, 6000, 28] and pool.held_bytes == 12028
    for t in (b, c, d):
        pool.give(t)
    assert pool.take((6000,), torch.uint8).data_ptr() in {b.data_ptr(), ptr}


def test_a_block_is_reused_only_after_its_fence_passed():
    """A buffer freed while copies queued before its free may still use it (CUDA) waits for
    the fence recorded at the free; meanwhile the same size gets a new block."""
    f = Fence()
    pool, made = _pool([f])
    a = pool.take((256,), torch.float32)
    ptr = a.data_ptr()
    pool.give(a)
    b = pool.take((256,), torch.float32)
    assert b.data_ptr() != ptr and len(made) == 2  # fence not passed: not reused
    f.passed = True
    c = pool.take((256,), torch.float32)
    assert c.data_ptr() == ptr and len(made) == 2


def test_giving_back_a_stranger_or_twice_is_an_error():
    pool, _ = _pool()
    with pytest.raises(ExecError, match="not taken from it"):
        pool.give(torch.empty(4))
    t = pool.take((4,), torch.float32)
    pool.give(t)
    with pytest.raises(ExecError, match="given back twice"):
        pool.give(t)


def test_threads_never_share_a_block():
    pool, _ = _pool()
    seen, bad = [], []

    def work(k):
        for i in range(200):
            t = pool.take((64,), torch.float32)
            t.fill_(k)
            if not bool((t == k).all()):
                bad.append(k)
            seen.append(t.data_ptr())
            pool.give(t)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not bad and len(pool.blocks) <= 4  # at most one block per concurrent holder


@pytest.mark.usefixtures("one_intraop_thread")
def test_training_through_the_pool_equals_training_without(monkeypatch):
    """The CPU backend takes its dynamic host buffers from a HostPool (as the CUDA backend):
    BufferTable gives every buffer back exactly once, a reused block never holds live data
    (the losses and weights equal a run on plain allocations, bit for bit), and the pool stops
    growing after the first step."""
    import horizon_exec.runtime.assemble as assemble_mod
    from horizon_exec.device.cpu import CpuBackend
    from horizon_exec.runtime.config import TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.model import ModelSpec
    from horizon_sim.specs.policy import exact_policy

    class PlainCpu(CpuBackend):
        """Fresh memory for every dynamic host buffer, never reused."""
        def host_empty(self, shape, dtype):
            return torch.empty(shape, dtype=dtype)

        def host_free(self, t):
            pass

    spec = ModelSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=128)
    pol = exact_policy(batch=4, seq=16, micro_batches=2, act_ckpt_every=1, slots=2, act_ckpt_on="host",
                       optimizer="after", grad_clip=1.0)
    batches = [torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def train(pooled):
        with monkeypatch.context() as mp:
            if not pooled:
                mp.setattr(assemble_mod, "make_backend", lambda device, timeout_s, **kw: PlainCpu(**kw))
            with Trainer(spec, pol, TrainerConfig(seed=0)) as tr:
                assert isinstance(tr.backend, PlainCpu) != pooled
                losses, held = [], []
                for b in batches:
                    losses.append(tr.step(b).loss)
                    held.append(tr.backend.pool.held_bytes)
                return losses, tr.state_dict(), held

    plain_losses, plain_w, plain_held = train(False)
    losses, w, held = train(True)
    assert plain_held == [0, 0, 0]  # the plain run really took nothing from the pool
    assert losses == plain_losses
    assert all(torch.equal(w[k], plain_w[k]) for k in w)
    assert held[0] > 0 and held[0] == held[1] == held[2], held


def test_a_failed_step_gives_its_host_buffers_back():
    """An op that raises mid-step: the step's host checkpoints and gradients go back to the
    pool (the trainer is unusable after it, but its memory is not lost to the pool)."""
    from horizon_exec.errors import ExecError
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.schedule import OpKind
    from horizon_sim.specs.model import ModelSpec
    from horizon_sim.specs.policy import Policy

    spec = ModelSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=128)
    pol = Policy(batch=2, seq=16, optimizer="after", act_ckpt_on="host")

    def hook(op):
        if op.kind == OpKind.OPTIMIZER:  # every checkpoint and gradient was made by now
            raise RuntimeError("injected fault")

    with Trainer(spec, pol) as tr:
        tr.engine.hook = hook
        with pytest.raises(ExecError, match="injected fault"):
            tr.step(torch.randint(0, 128, (2, 16)))
        assert tr.backend.pool.held_bytes > 0 and tr.backend.pool.handed_out == 0
