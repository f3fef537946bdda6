"""One rank of a data-parallel test run (tests/test_dist_exec.py starts it through
torch.distributed.run, or directly with the env:// variables set).

    python tests/dist_worker.py OUT MODE [key=value ...]

MODE parity: 3 steps of a tiny model (moe=1: a Qwen3-MoE one; moe=aux: the same trained with the
  router load-balancing loss; moe=deepseek: a DeepSeek-V3 one, dense block first; moe=gpt2: a GPT-2 one, learned positions beside its tied embedding) on this rank's share of fixed global batches (micro=N micro-batches
  in order=micro|layer; lora=R: LoRA adapters of rank R on the frozen base (quant=nf4|int8: stored so; objective=dpo: DPO on row pairs), and OUT/master.pt holds
  the adapters); rank 0 writes OUT/master.pt (every unit's whole master, gathered),
  OUT/losses.json and (moe=aux) OUT/aux.json, the steps' aux losses.
MODE store: one step; each rank writes OUT/store-RANK.json: the Rss and Pss of its mapping of
  the node's shared store (/proc/self/smaps) and the store's declared bytes.
MODE fault: steps until `kill_rank` reaches op `kill_op` of step 2, where it dies (os._exit)
  or stalls (stall=1); the survivors' errors go to stderr.
"""
import json
import os
import sys
import time
from pathlib import Path

import torch

from horizon_exec.dist.context import from_env
from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

GLOBAL_BATCH = 4


def spec(tied: bool, moe: bool | str = False) -> ModelSpec:
    """The dense model, or (moe) a qwen3_moe one of the same size: 8 experts, top-2; moe='aux':
    trained with the router load-balancing loss (coefficient 0.5, large enough to move weights);
    moe='gpt2': a GPT-2 one (its 16 learned positions in the embedding unit, after the tied rows)."""
    if moe == "gpt2":
        return ModelSpec(family="gpt2", n_layers=3, hidden=64, n_heads=2, n_kv_heads=2, ffn_hidden=176, vocab=250,
                         tied_embeddings=tied, max_position=16)
    if moe == "deepseek":  # DeepSeek-V3: MLA, a dense first block, then grouped sigmoid routing with shared experts
        return ModelSpec(family="deepseek_v3", n_layers=3, hidden=64, n_heads=2, n_kv_heads=2, head_dim=24,
                         ffn_hidden=176, vocab=250, tied_embeddings=tied, kv_lora_rank=16, q_lora_rank=24,
                         qk_rope_head_dim=8, v_head_dim=12, first_dense_layers=1, n_experts=8, experts_per_token=2,
                         expert_ffn_hidden=48, shared_expert_ffn_hidden=48, norm_topk_prob=True, expert_groups=4,
                         topk_groups=2, routed_scaling=2.5)
    kw = dict(family="qwen3_moe", n_experts=8, experts_per_token=2, expert_ffn_hidden=48,
              norm_topk_prob=True, router_aux_loss_coef=0.5 if moe == "aux" else 0.0) if moe else {}
    return ModelSpec(n_layers=3, hidden=64, n_heads=2, n_kv_heads=1, ffn_hidden=176, vocab=250, tied_embeddings=tied,
                     **kw)


def batches(n: int = 3, seq: int = 16, vocab: int = 250):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (GLOBAL_BATCH, seq), generator=g) for _ in range(n)]


def adapters(tr) -> list:
    """A LoRA run's adapters (each block's A and B, then AdamW's m and v), on the host."""
    return [t.reshape(-1).cpu() for t in tr.adapters.state.values()]


def policy(world: int, opt: str, micro_batches: int = 1, bf16: str = "", mb_order: str = "micro",
           lora: int = 0, quant: str = "none", objective: str = "sft", adapters_on: str = "device") -> Policy:
    """fp32 compute (parity); bf16 = 'copy' or 'split': bf16 compute with the working copy, the
    master whole or split; lora: adapters of that rank on the frozen base (fp32, clipping at 0.5)."""
    if lora:
        return Policy(batch=GLOBAL_BATCH // world, micro_batches=micro_batches, seq=16, compute_dtype="fp32",
                      grad_dtype="fp32", working_copy=False, optimizer="after", grad_clip=0.5, mb_order=mb_order,
                      lora_rank=lora, lora_alpha=2.0 * lora, base_quant=quant, objective=objective,
                      adapters_on=adapters_on)
    if bf16:
        return Policy(batch=GLOBAL_BATCH // world, micro_batches=micro_batches, seq=16, optimizer=opt,
                      grad_clip=0.0 if opt == "backward" else 0.5, split_master=bf16 == "split", mb_order=mb_order)
    return Policy(batch=GLOBAL_BATCH // world, micro_batches=micro_batches, seq=16, compute_dtype="fp32",
                  grad_dtype="fp32", working_copy=False, optimizer=opt, grad_clip=0.0 if opt == "backward" else 0.5,
                  mb_order=mb_order, objective=objective)


def shared_mapping() -> dict:
    """Rss and Pss (bytes) of this process's mapping of the node's shared store, and its inode."""
    out, cur = {"rss": 0, "pss": 0, "inodes": []}, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            cur = "/dev/shm/horizon-" in line
            if cur:
                out["inodes"].append(int(line.split()[4]))
        elif cur and line.startswith(("Rss:", "Pss:")):
            out[line.split(":")[0].lower()] += int(line.split()[1]) * 1024
    return out


def main(out: Path, mode: str, kw: dict) -> None:
    ctx = from_env(timeout_s=float(kw.get("timeout", 60)))
    opt = kw.get("opt", "pipelined")
    pol = policy(ctx.world, opt, int(kw.get("micro", 1)), bf16=kw.get("bf16", ""), mb_order=kw.get("order", "micro"),
                 lora=int(kw.get("lora", 0)), quant=kw.get("quant", "none"), objective=kw.get("objective", "sft"),
                 adapters_on=kw.get("adapters_on", "device"))
    b = pol.batch
    cfg = TrainerConfig(optimizer=OptimizerConfig(lr=float(kw.get("lr", 1e-3))), admission=AdmissionConfig(enabled=False),
                        runtime=RuntimeConfig(timeout_s=float(kw.get("op_timeout", 60))))
    moe = {"1": True, "aux": "aux", "gpt2": "gpt2", "deepseek": "deepseek"}.get(kw.get("moe", ""), False)
    tr = Trainer(spec(kw.get("tied") == "1", moe), pol, cfg, dist=ctx)
    mine = [t[ctx.rank * b:(ctx.rank + 1) * b] for t in batches()]
    if mode == "parity":
        results = [tr.step(t) for t in mine]
        losses = [r.loss for r in results]
        tr.flush()
        wholes = [tr.gather_master(u) for u in tr.units] if tr.adapters is None else adapters(tr)
        full = torch.cat(wholes)
        if pol.split_master:  # every node's whole working copy is the gathered master's high half
            from horizon_exec.optim.split import split_
            from horizon_sim.schedule import Holds
            ok = True
            for u, w in zip(tr.units, wholes):
                hi, lo = torch.empty(w.numel(), dtype=torch.bfloat16), torch.empty(w.numel(), dtype=torch.int16)
                split_(w, hi, lo)
                ok &= torch.equal(tr.store.of(Holds.WORKING_COPY, u)[:w.numel()], hi)
            (out / f"wc-{ctx.rank}.json").write_text(json.dumps(bool(ok)))
        if ctx.rank == 0:
            torch.save(full, out / "master.pt")
            (out / "losses.json").write_text(json.dumps(losses))
            if moe == "aux":
                (out / "aux.json").write_text(json.dumps([r.aux_loss for r in results]))
    elif mode == "store":
        tr.step(mine[0])
        tr.step(mine[1])
        ctx.barrier()  # every rank has touched the store before any measures
        shared = sum(bb.bytes for bb in tr.sched.buffers.values() if bb.node_shared)
        (out / f"store-{ctx.rank}.json").write_text(json.dumps({**shared_mapping(), "declared": shared,
                                                                "mapped": tr.store.shared_raw.numel()}))
        ctx.barrier()
    elif mode == "fault":
        kill_rank, kill_op = int(kw["kill_rank"]), int(kw["kill_op"])
        tr.step(mine[0])
        if ctx.rank == kill_rank:
            def hook(op):
                if op.id == kill_op:
                    if kw.get("stall") == "1":
                        time.sleep(3600)
                    os._exit(9)
            tr.engine.hook = hook
        try:
            tr.step(mine[1])
        except Exception as e:  # noqa: BLE001 - what the survivor says is what the test reads
            print(f"rank {ctx.rank} error: {e}", file=sys.stderr, flush=True)
            os._exit(1)
    tr.close()
    ctx.close()


if __name__ == "__main__":
    from horizon_exec.dist.context import exit_rank
    main(Path(sys.argv[1]), sys.argv[2], dict(a.split("=", 1) for a in sys.argv[3:]))
    exit_rank(0)
