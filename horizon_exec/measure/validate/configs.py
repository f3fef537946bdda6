"""The configurations `horizon validate` runs: Config (a named model and policy with a one-line
label for the reports), the fourteen small CONFIGS that vary depth, width, batch, K, slots,
checkpoint placement, optimizer overlap, vocabulary, micro-batches and their order, the working
copy, the split master, the disk tier, kept activations, attention under explicit masks, a
mixture-of-experts model and two data-parallel ones (2 ranks),
and the three tiny
QUICK_CONFIGS of `--quick` (one of them on 2 ranks).
"""
from dataclasses import dataclass, replace

from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


def llama(name, L, H, heads, kv, F, V=256):
    """A Llama-shaped ModelSpec: L layers of width H, heads/kv attention heads, FFN width F, vocabulary V."""
    return ModelSpec(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=kv, ffn_hidden=F,
                     vocab=V, norm_eps=1e-5, rope_theta=1e4)


def qwen3_moe(name, L, H, heads, kv, E, k, I, V=256):
    """A Qwen3-MoE-shaped ModelSpec: every block's MLP E experts of width I, each token routed to k
    (renormalised top-k), per-head q/k norms."""
    return ModelSpec(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=kv, ffn_hidden=2 * I, vocab=V,
                     norm_eps=1e-6, rope_theta=1e4, family="qwen3_moe", n_experts=E, experts_per_token=k,
                     expert_ffn_hidden=I, norm_topk_prob=True)


@dataclass(frozen=True)
class Config:
    name: str
    model: ModelSpec
    policy: Policy
    what: str = ""
    ranks: int = 1
    """Data-parallel ranks on this machine (one node, its store shared): each trains
    `policy.batch` sequences per step, so the step's global batch is ranks x batch."""

    @property
    def label(self) -> str:
        m, p = self.model, self.policy
        return (f"L{m.n_layers} H{m.hidden} V{m.vocab}"
                + (f", {m.n_experts} experts top-{m.experts_per_token} I{m.expert_ffn_hidden}" if m.n_experts else "")
                + f", batch {p.batch}x{p.seq}, K={p.act_ckpt_every}, "
                + f"{p.slots} slots, ckpt {p.act_ckpt_on}, opt {p.optimizer}"
                + ("" if p.working_copy else ", no wc") + (", split master" if p.split_master else "")
                + (f", {p.disk_tier} on disk" if p.disk_tier != "none" else "")
                + (f", grads<={p.max_host_grads}" if p.max_host_grads else "")
                + (f", {p.micro_batches} micro" if p.micro_batches > 1 else "")
                + (", layer order" if p.mb_order == "layer" and p.micro_batches > 1 else "")
                + (", windows" if m.layer_windows else "") + (", doc masks" if p.doc_masks else "")
                + (f", {self.ranks} ranks" if self.ranks > 1 else ""))


CONFIGS = (
    Config("base", llama("v-base", 6, 256, 4, 2, 688),
           Policy(batch=2, seq=256), "the default policy at width 256"),
    Config("deep_k2", llama("v-deep", 12, 256, 4, 2, 688),
           Policy(batch=2, seq=128, act_ckpt_every=2, slots=3, act_ckpt_on="device", optimizer="backward",
                  grad_clip=0.0), "depth 12, K=2, 3 slots, checkpoints on the device, optimizer in backward"),
    Config("wide_after", llama("v-wide", 4, 512, 8, 4, 1376),
           Policy(batch=2, seq=256, optimizer="after", master_dtype="fp32"),
           "width 512, optimizer after backward, the whole fp32 master (the one configuration with it beside "
           "the working copy: the default splits it)"),
    Config("batch4_k3", llama("v-b4", 6, 384, 6, 2, 1024),
           Policy(batch=4, seq=128, act_ckpt_every=3), "batch 4, K=3 with checkpoints on the host"),
    Config("vocab8k", llama("v-vocab", 4, 384, 6, 2, 1024, V=8192),
           Policy(batch=2, seq=256, act_ckpt_every=2, slots=4, act_ckpt_on="device", loss_chunk_tokens=256),
           "8k vocabulary (a real LM head, 2 loss chunks), 4 slots, K=2 on the device"),
    Config("nowc_micro", llama("v-micro", 8, 256, 4, 2, 688),
           Policy(batch=4, seq=128, micro_batches=2, working_copy=False, optimizer="after"),
           "2 micro-batches, no working copy (fp32 loads cast on the device), optimizer after"),
    Config("masked", replace(llama("v-masked", 6, 256, 4, 2, 688), layer_windows=(0, 64) * 3),
           Policy(batch=2, seq=512, doc_masks=True),
           "a 64-token window on every other layer and document masks: attention under explicit masks"),
    Config("ranks2", llama("v-ranks", 6, 256, 4, 2, 688), Policy(batch=2, seq=256),
           "base on 2 data-parallel ranks: reduce-scatter per unit, each rank's AdamW on its half of "
           "one shared store", ranks=2),
    Config("ranks2_after", llama("v-ranks-after", 4, 384, 6, 2, 1024),
           Policy(batch=2, seq=128, optimizer="after", act_ckpt_every=2, act_ckpt_on="device"),
           "2 ranks, optimizer after backward, K=2 on the device", ranks=2),
    Config("split_lean", llama("v-split", 6, 384, 6, 2, 1024),
           Policy(batch=2, seq=128, split_master=True, optimizer="backward", grad_clip=0.0, max_host_grads=2),
           "split master (the bf16 copy + a low half), optimizer in backward, host grads bounded to 2: "
           "the exact-fp32 policy that fits dense-120b in 1.5 TB"),
    Config("disk_tier", llama("v-disk", 6, 256, 4, 2, 688), Policy(batch=2, seq=256, split_master=True,
                                                                   disk_tier="moments+low"),
           "base with the split master, its low halves and the Adam moments on disk (O_DIRECT, read a unit "
           "ahead into two RAM stages, written back after the update)"),
    Config("kept", llama("v-kept", 6, 256, 4, 2, 688), Policy(batch=4, seq=128, micro_batches=2, keep_last=3),
           "the last 3 layers keep their activations (backward from the saved graph, no recompute), "
           "2 micro-batches"),
    Config("layer", llama("v-layer", 6, 256, 4, 2, 688),
           Policy(batch=6, seq=128, micro_batches=3, mb_order="layer"),
           "3 micro-batches in layer order: every micro-batch passes a unit while its weights are resident, "
           "so they cross the link twice a step whatever the micro-batches, and its gradients are summed "
           "on the device (fp32) and offloaded once; every micro-batch's boundaries live at once"),
    Config("moe", qwen3_moe("v-moe", 6, 256, 4, 2, 8, 2, 128), Policy(batch=2, seq=256),
           "a Qwen3-MoE-like model (8 experts, top-2, width 128): the router, one gate_up and one down GEMM "
           "per expert over the rows routed to it, all 8 experts' weights streamed"),
)
"""Fourteen small configurations that vary depth, width, batch, K, slots, checkpoint placement,
optimizer overlap, vocabulary, micro-batches and their order, the working copy, the split
master, the disk tier, kept activations, masked attention, mixture of experts and data
parallelism (two of them run 2 ranks sharing the machine's cores); a few minutes in all on a
2-core CPU."""

QUICK_CONFIGS = (
    Config("tiny_a", llama("v-tiny-a", 3, 128, 2, 1, 352), Policy(batch=1, seq=64), "tiny, default"),
    Config("tiny_b", llama("v-tiny-b", 4, 128, 2, 1, 352, V=512),
           Policy(batch=2, seq=64, act_ckpt_every=2, slots=3, act_ckpt_on="device", optimizer="after"),
           "tiny, K=2, optimizer after"),
    Config("tiny_r2", llama("v-tiny-r2", 3, 128, 2, 1, 352), Policy(batch=1, seq=64), "tiny on 2 ranks", ranks=2),
)

